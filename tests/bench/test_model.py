"""The embedded model's report: its jobs are valid requests, its scorer passes perfect outputs
and fails wrong ones, and one real job per mode runs through the engine's executor."""

import dataclasses
import json
import re

import numpy as np
import pytest

from bench import model as report
from studio.engine.models.registry import ModelRegistry
from studio.tiny import world


@pytest.fixture(scope="module")
def caps():
    return ModelRegistry(include_hf_cache=False).resolve("embedded").capabilities


def oracle(sample, caps):
    """What a perfect model gives for a sample: the world's render of the scene, with the
    given first frame for image-to-video."""
    if sample.request.num_frames == 1:
        return world.render_image(sample.spec, caps.default_height, caps.default_width)[None]
    clip = world.render_clip(sample.spec, caps.default_frames, caps.default_height,
                             caps.default_width)
    if sample.request.mode == "i2v":
        clip[0] = sample.given
    return clip


@pytest.mark.parametrize("mode", report.MODES)
def test_every_sample_is_a_valid_request_with_its_inputs(mode, caps):
    samples = report.build_samples(mode, 5, caps)
    assert len(samples) == 5
    for s in samples:
        assert s.request.validate(caps) == []
        assert {ref.content_id for _, ref in s.request.media_refs()} == set(s.inputs)
    if mode == "r2v":
        for s in samples:
            words = set(s.request.prompt.replace(",", " ").split())
            assert not words & set(world.SHAPES), s.request.prompt
            assert "object" in words  # its colour only in the background's name, if at all
            assert not re.search(rf"\b({'|'.join(world.COLOURS)})\s+(\w+\s+)?object\b",
                                 s.request.prompt), s.request.prompt
            assert s.reference_object == (s.spec.objects[0].colour, s.spec.objects[0].shape)
    if mode == "i2i":  # the init image shows another colour than the prompt asks for
        assert all(s.request.strength == report.I2I_STRENGTH for s in samples)


@pytest.mark.parametrize("mode", report.MODES)
def test_the_scorer_passes_perfect_outputs_and_fails_shuffled_ones(mode, caps):
    samples = report.build_samples(mode, 24, caps)
    perfect = report.score(mode, samples, [oracle(s, caps) for s in samples])
    assert min(perfect["accuracy"].values()) >= 0.95, perfect
    shuffled_outputs = [oracle(s, caps) for s in samples[1:] + samples[:1]]
    shuffled = report.score(mode, samples, shuffled_outputs)
    if mode == "r2v":
        assert perfect["reference_match"] >= 0.95
        assert shuffled["reference_match"] < 0.5
        assert perfect["reference_colour_match"] >= 0.95
        assert perfect["reference_shape_match"] >= 0.95
        assert shuffled["reference_shape_match"] < 0.6
        assert shuffled["reference_match"] <= min(shuffled["reference_colour_match"],
                                                  shuffled["reference_shape_match"])
    else:
        assert shuffled["accuracy"]["colour"] < 0.5
        # the wrong readings are counted by kind: none on perfect outputs, many when shuffled
        assert sum(perfect["errors"]["colour"].values()) <= 0.05 * 24
        wrong = shuffled["errors"]["colour"]
        n_wrong = round((1 - shuffled["accuracy"]["colour"]) * shuffled["counts"]["colour"])
        assert all("->" in k for k in wrong) and len(wrong) <= 8 and n_wrong >= 12
        assert sum(wrong.values()) <= n_wrong  # the eight most frequent kinds ...
        if len(wrong) < 8:  # ... which are all of them here
            assert sum(wrong.values()) == n_wrong
        assert list(wrong.values()) == sorted(wrong.values(), reverse=True)
    if mode in ("t2v", "i2v"):
        assert sum(shuffled["errors"]["motion"].values()) >= 6
    if mode == "r2v":  # colour and shape are the reference's, scored as the match above
        assert "colour" not in perfect["errors"] and "motion" in perfect["errors"]
    if mode == "i2v":
        assert perfect["first_frame_psnr_db"]["mean"] > 60
        assert shuffled["first_frame_psnr_db"]["mean"] < 30
    rows = report.bars({mode: perfect}, None)
    assert rows and all(r["holds"] and r["issue_3"] for r in rows)
    assert not all(r["holds"] for r in report.bars({mode: shuffled}, None))


def test_one_job_per_mode_through_the_executor(tmp_path):
    out = tmp_path / "model.json"
    assert report.main(["--prompts", "1", "--free", "1", "--runs", "0",
                        "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["modes"]) == set(report.MODES) | {f"{m} free" for m in report.MODES}
    assert result["modes"]["t2v free"]["unnamed"] == {"position": 1}
    assert result["speed_s"] is None
    assert 0 < result["modes"]["i2v"]["first_frame_psnr_db"]["mean"]
    assert "reference_match" in result["modes"]["r2v"]
    assert result["command"].startswith("python -m bench model --prompts 1")
    assert all(np.isfinite(v) for m in result["modes"].values() for v in m["accuracy"].values())
    ceiling = result["vae_ceiling"]
    assert set(ceiling) == {"t2i", "t2v"} and "motion" in ceiling["t2v"]["accuracy"]
    assert len(ceiling["t2v"]["psnr_db_per_frame"]) == 9


def test_vae_ceiling_is_high_for_the_shipped_vae_and_low_for_a_blind_one(tmp_path):
    """The ceiling must be able to fail: a VAE whose decoder ignores its latents (zeroed
    weights) reads as no object at all."""
    from diffusers import AutoencoderKLWan

    from studio.engine.models.registry import DEFAULT_EMBEDDED, EMBEDDED_DIR

    good = report.vae_ceiling(EMBEDDED_DIR / DEFAULT_EMBEDDED / "vae", 8, 9, 64)
    assert good["t2i"]["accuracy"]["background"] >= 0.75
    assert good["t2i"]["psnr_db_per_frame"][0] > 20
    vae = AutoencoderKLWan.from_pretrained(str(EMBEDDED_DIR / DEFAULT_EMBEDDED / "vae"))
    for p in vae.decoder.conv_out.parameters():
        p.data.zero_()
    vae.save_pretrained(tmp_path / "vae")
    blind = report.vae_ceiling(tmp_path / "vae", 8, 9, 64)
    assert blind["t2i"]["accuracy"]["colour"] == 0 and blind["t2i"]["psnr_db_per_frame"][0] < 15


def test_bad_arguments_are_refused_with_the_flag(capsys):
    with pytest.raises(SystemExit):
        report.main(["--modes", "t2i,x2y"])
    assert "--modes" in capsys.readouterr().err


def test_vae_run_measures_a_training_runs_vae(tmp_path, capsys):
    """``--vae-run`` reads a training run's checkpoint (here: the shipped VAE's weights laid out
    as a run) and gives the same ceiling as the shipped folder; a folder without a checkpoint
    is refused by name."""
    from diffusers import AutoencoderKLWan
    from safetensors.torch import save_model

    from studio.engine.models.registry import DEFAULT_EMBEDDED, EMBEDDED_DIR

    shipped = EMBEDDED_DIR / DEFAULT_EMBEDDED / "vae"
    vae = AutoencoderKLWan.from_pretrained(str(shipped)).float()
    run = tmp_path / "run"
    for stage in ("vae", "decoder"):  # the decoder stage's checkpoint wins when present
        (run / stage / "checkpoint").mkdir(parents=True)
        save_model(vae, str(run / stage / "checkpoint" / "vae.safetensors"))
    (run / "vae" / "checkpoint" / "state.json").write_text('{"step": 7}')
    (run / "decoder" / "checkpoint" / "state.json").write_text('{"step": 3}')
    from studio.tiny.autoencoder import spatial_compression_of, temporal_compression_of

    (run / "vae" / "architecture.json").write_text(json.dumps({
        "temporal_compression": temporal_compression_of(vae),
        "spatial_compression": spatial_compression_of(vae),
        "latent_channels": vae.config.z_dim}))
    out = tmp_path / "ceiling.json"
    assert report.main(["--vae-run", str(run), "--prompts", "4", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["vae_training_step"] == 7 and result["vae_decoder_step"] == 3
    expected = report.vae_ceiling(shipped, 4, 9, 64)
    for mode in ("t2i", "t2v"):
        assert result["vae_ceiling"][mode]["accuracy"] == expected[mode]["accuracy"]
        assert np.allclose(result["vae_ceiling"][mode]["psnr_db_per_frame"],
                           expected[mode]["psnr_db_per_frame"], atol=0.05)
    assert "clip round trip (4 prompts)" in capsys.readouterr().out
    assert report.main(["--vae-run", str(tmp_path / "nothing")]) == 2
    assert "--vae-run" in capsys.readouterr().err


@pytest.mark.parametrize("mode", report.MODES)
def test_free_caption_jobs_score_only_what_the_caption_names(mode, caps):
    """``--free``: the jobs' prompts leave size and/or position out (r2v's also colour and
    shape, as its named prompts), a perfect output with the object drawn elsewhere passes,
    an output with no object fails colour (r2v: the reference match) whatever is unnamed,
    and the report counts what the captions left out."""
    samples = report.build_samples(mode, 12, caps, free=True)
    assert [s.unscored for s in samples] == [world.FREE_EVAL_UNNAMED[i % 3] for i in range(12)]
    for s in samples:
        assert s.request.validate(caps) == []
        if mode != "r2v":
            assert world.unnamed_attributes(s.request.prompt) == s.unscored, s.request.prompt
    assert [s.request.prompt for s in report.build_samples(mode, 4, caps)] == \
        [s.request.prompt for s in report.build_samples(mode, 4, caps, free=False)]
    anywhere = []
    for s in samples:  # the perfect output, with the unnamed position and size moved
        if mode == "i2v":  # ... save where the given first frame sets them
            anywhere.append(oracle(s, caps))
            continue
        obj = s.spec.objects[0]
        if "position" in s.unscored:
            obj = dataclasses.replace(obj, position="bottom left" if obj.position != "bottom left"
                                      else "top right")
        if "size" in s.unscored:
            obj = dataclasses.replace(obj, size="small" if obj.size == "large" else "large")
        moved = dataclasses.replace(s, spec=dataclasses.replace(s.spec, objects=(obj,)))
        anywhere.append(oracle(moved, caps))
    passed = report.score(mode, samples, anywhere)
    assert min(passed["accuracy"].values()) >= 0.9, passed
    assert passed["unnamed"] == {"position": 8, "size": 8}
    empty = [np.stack([np.full_like(o[0], 128)] * len(o)) for o in anywhere]
    failed = report.score(mode, samples, empty)
    if mode == "r2v":
        assert passed["reference_match"] >= 0.9 and failed["reference_match"] == 0
    else:
        assert failed["accuracy"]["colour"] == 0 and failed["accuracy"]["shape"] == 0
    rows = report.bars({f"{mode} free": failed}, None)
    assert not all(r["holds"] for r in rows) and not any(r["issue_3"] for r in rows)
