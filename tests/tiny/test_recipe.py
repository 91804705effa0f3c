"""The one-command training recipe (``python -m studio.tiny.train recipe``): its phases run in
order on the real stages, a stopped sitting resumes where its checkpoints are, the export
carries the reference word map, and a snapshot carries the whole run (VAE included) into a
fresh folder without any other lineage's weights."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from studio.tiny import reference_words
from studio.tiny import train as tiny_train
from studio.tiny.autoencoder import VaeTask
from studio.tiny.denoiser import DenoiserTask
from studio.tiny.train import RECIPE, RecipePhase, main, run_recipe, snapshot_run

# the recipe's shape on a few steps: the VAE, then two denoiser phases of one schedule
TINY = (RecipePhase("vae", 2, ("--total-steps", "50")),
        RecipePhase("dit", 2, ("--total-steps", "6", "--reference-share", "0.3",
                               "--reference-alignment", "0.5")),
        RecipePhase("dit", 4, ("--total-steps", "6", "--reference-share", "0.3",
                               "--image-share", "0.1", "--reference-alignment", "0.5")))


@pytest.fixture
def quick(monkeypatch):
    """No eval sampling at the denoiser's checkpoints, and a word map fitted on few images
    (both are tested on their own); counts the stages the recipe starts."""
    monkeypatch.setattr(DenoiserTask, "on_checkpoint", lambda self, out_dir, step: None)
    monkeypatch.setattr(reference_words, "fit_word_map",
                        functools.partial(reference_words.fit_word_map, images=64,
                                          held_out=16))
    started: list[str] = []
    real_main = tiny_train.main

    def counting_main(argv=None, stop=None):
        started.append(argv[0])
        return real_main(argv, stop=stop)

    monkeypatch.setattr(tiny_train, "main", counting_main)
    return started


def _step(run: Path) -> int:
    return json.loads((run / "checkpoint" / "state.json").read_text())["step"]


def test_recipe_resumes_a_stopped_sitting_exports_once_and_travels_by_snapshot(tmp_path,
                                                                                 quick):
    out, dest = tmp_path / "run", tmp_path / "model"
    # a sitting cut short: SIGTERM's flag rises during the VAE's first step
    stop = {"asked": False}
    real_loss = VaeTask.loss

    def loss_then_stop(self, *args):
        stop["asked"] = True
        return real_loss(self, *args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(VaeTask, "loss", loss_then_stop)
        first = run_recipe(out, dest, threads=1, stop=stop, recipe=TINY)
    assert first["done"] is False and first["dest"] is None
    assert first["phases"] == [{"stage": "vae", "until": 2, "step": 1}]
    assert not (out / "dit").exists() and not dest.exists()
    # the same command again: goes on from the VAE's checkpoint through both denoiser phases
    second = run_recipe(out, dest, threads=1, recipe=TINY)
    assert second["done"] is True
    assert [p["step"] for p in second["phases"]] == [2, 2, 4]
    assert _step(out / "vae") == 2 and _step(out / "dit") == 4
    assert quick == ["vae", "vae", "dit", "dit", "export"]
    meta = json.loads((dest / "studio.json").read_text())
    assert meta["training_step"] == 4 and "step 4 of 6" in meta["description"]
    assert (dest / "reference_encoder" / "word_map.safetensors").exists()
    assert meta["reference_words"]["placeholder"] == "object"
    assert second["hours"]["total"] == pytest.approx(
        second["hours"]["vae"] + second["hours"]["dit"])
    sittings = [json.loads(line) for line in (out / "recipe_log.jsonl").read_text().splitlines()]
    assert [s["done"] for s in sittings] == [False, True]
    assert all(s["wall_s"] > 0 for s in sittings)
    assert second["hours"]["sittings"] == pytest.approx(
        sum(s["wall_s"] for s in sittings) / 3600, abs=0.01)
    # done and exported: a third run trains and exports nothing
    quick.clear()
    assert run_recipe(out, dest, threads=1, recipe=TINY)["done"] is True
    assert quick == []
    # the snapshot carries the whole run, VAE included; a fresh folder resumes from it alone
    committed = tmp_path / "committed"
    snapshot_run(out, committed)
    assert (committed / "vae" / "checkpoint" / "vae.safetensors").read_bytes() == \
        (out / "vae" / "checkpoint" / "vae.safetensors").read_bytes()
    out2, dest2 = tmp_path / "run2", tmp_path / "model2"
    third = run_recipe(out2, dest2, committed=committed, threads=1, recipe=TINY)
    assert third["done"] is True and quick == ["export"]
    assert _step(out2 / "dit") == 4
    # the sittings travel with the snapshot: the new folder's log goes on from the old one's
    carried = (out2 / "recipe_log.jsonl").read_text().splitlines()
    assert len(carried) == 4 and carried[:3] == \
        (out / "recipe_log.jsonl").read_text().splitlines()
    restored = [json.loads(line) for line in
                (out2 / "dit" / "train_log.jsonl").read_text().splitlines()]
    assert restored[-1]["restored_from"] == str(committed / "dit" / "checkpoint")
    assert json.loads((dest2 / "studio.json").read_text())["training_step"] == 4


def test_recipe_refuses_bad_phases_and_its_own_flags(tmp_path, capsys):
    with pytest.raises(ValueError, match="increasing"):
        run_recipe(tmp_path, tmp_path / "m", recipe=(RecipePhase("dit", 4, ()),
                                                     RecipePhase("dit", 4, ())))
    with pytest.raises(ValueError, match="'decoder'"):
        run_recipe(tmp_path, tmp_path / "m", recipe=(RecipePhase("decoder", 4, ()),))
    for flags in (["--steps", "5"], ["--total-steps", "9"], ["--lr", "0.01", "--no-pool"]):
        with pytest.raises(SystemExit):
            main(["recipe", "--out", str(tmp_path), *flags])
        err = capsys.readouterr().err
        assert f"recipe: {flags[0]}" in err and "the recipe sets its stages' own flags" in err
    assert not any(tmp_path.iterdir())


def test_the_shipped_recipe_is_issue_3s_budget_on_one_schedule(capsys):
    """The phases parse as the trainer's own arguments, one cosine schedule spans the
    denoiser's phases (the last may stop before the schedule's end), every read-out runs
    from step 0, and the VAE is the one the shipped model's latents come from."""
    assert [p.stage for p in RECIPE] == ["vae", "dit", "dit", "dit", "dit"]
    dit = [p for p in RECIPE if p.stage == "dit"]
    # sessions 41-42: the last phases train on the world's free captions (no size / position)
    for phase in dit[-2:]:
        share = float(phase.flags[phase.flags.index("--free-caption-share") + 1])
        assert 0 < share <= 0.5, phase
    totals = {int(p.flags[p.flags.index("--total-steps") + 1]) for p in dit}
    assert len(totals) == 1 and totals.pop() >= dit[-1].until
    for phase in dit:  # session 39: the position, layout and shape read-outs from the start
        for flag in ("--position-awareness", "--layout-awareness", "--shape-awareness",
                     "--frame-awareness", "--motion-awareness"):
            assert float(phase.flags[phase.flags.index(flag) + 1]) > 0, (phase.until, flag)
    vae = RECIPE[0].flags
    shipped = json.loads(Path("training/tiny/v3/vae/architecture.json").read_text())
    assert vae[vae.index("--spatial-compression") + 1] == str(shipped["spatial_compression"])
    assert vae[vae.index("--temporal-compression") + 1] == str(shipped["temporal_compression"])
    # every phase's flags are the stage's own: the parser takes them all (a misspelt or
    # unknown flag would end it on "unrecognized arguments"), then refuses the bad --lr
    for phase in RECIPE:
        with pytest.raises(SystemExit):
            main([phase.stage, "--out", "/nonexistent/run", *phase.flags, "--lr", "2"])
        err = capsys.readouterr().err
        assert "--lr must be in (0, 0.1], got 2" in err and "unrecognized" not in err


def test_recipe_takes_a_committed_vae_and_refuses_one_of_another_shape(tmp_path, quick):
    """``vae_from``: a new denoiser recipe on a VAE trained before. The VAE phase is then
    done (no VAE stage starts), its files are the committed ones, and a VAE that is not the
    recipe's (another compression, or short of its steps) is refused before anything runs."""
    donor, dest = tmp_path / "donor", tmp_path / "model"
    assert run_recipe(donor, dest, threads=1, recipe=TINY[:1])["done"] is True
    committed = tmp_path / "committed"
    (committed / "vae").mkdir(parents=True)
    import shutil

    shutil.copytree(donor / "vae" / "checkpoint", committed / "vae" / "checkpoint")
    for name in ("eval_log.jsonl", "architecture.json"):
        shutil.copy(donor / "vae" / name, committed / "vae" / name)
    quick.clear()
    out = tmp_path / "run"
    (out / "vae").mkdir(parents=True)  # a VAE stage cut off before its first checkpoint
    (out / "vae" / "train_log.jsonl").write_text('{"step": 1}\n')
    report = run_recipe(out, dest, threads=1, recipe=TINY[:2], vae_from=committed)
    assert report["done"] is True and quick == ["dit", "export"]
    assert (out / "vae" / "checkpoint" / "vae.safetensors").read_bytes() == \
        (donor / "vae" / "checkpoint" / "vae.safetensors").read_bytes()
    assert (out / "vae" / "eval_log.jsonl").read_text() == \
        (committed / "vae" / "eval_log.jsonl").read_text()
    assert not (out / "vae" / "train_log.jsonl").exists()  # the leftover went with its folder
    assert not (out / ".vae.taking").exists()
    assert _step(out / "dit") == 2
    arch = json.loads((committed / "vae" / "architecture.json").read_text())
    other = "4" if arch["spatial_compression"] == 2 else "2"
    wrong = (RecipePhase("vae", 2, ("--spatial-compression", other)), *TINY[1:])
    with pytest.raises(ValueError, match="spatial_compression"):
        run_recipe(tmp_path / "run2", dest, recipe=wrong, vae_from=committed)
    longer = (RecipePhase("vae", 3, ()), *TINY[1:])
    with pytest.raises(ValueError, match="short of"):
        run_recipe(tmp_path / "run3", dest, recipe=longer, vae_from=committed)
    with pytest.raises(ValueError, match="no vae/checkpoint"):
        run_recipe(tmp_path / "run4", dest, recipe=TINY, vae_from=tmp_path / "nothing")
    assert not (tmp_path / "run2" / "vae" / "checkpoint" / "state.json").exists()
    assert not (tmp_path / "run3" / "dit").exists()
