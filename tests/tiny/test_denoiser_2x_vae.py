"""The denoiser on the third VAE's latents (2x spatial, 2x temporal: 32x32 latents, 9 frames
-> 5): patch (1, 4, 4) keeps 8 x 8 tokens a frame, the shipped denoiser's blocks carry over
(warm start), the export runs through the engine in every video mode, and a run of a new VAE
restores from its own snapshot."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from studio.tiny.autoencoder import build_vae
from studio.tiny.denoiser import (
    DenoiserTask,
    build_denoiser,
    build_reference_encoder,
    denoiser_patch,
    fit_latent_maps,
    warm_start,
)

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "assets" / "models" / "tiny-wan"
#: The shipped model's VAE compression (2 since session 29; 4 before).
SHIPPED_SPATIAL = json.loads((SHIPPED / "vae" / "config.json").read_text())["scale_factor_spatial"]


@pytest.fixture(scope="module")
def source_4x(tmp_path_factory):
    """A model folder on the 4x VAE (16x16 latents, patch 2), exported from a fresh task:
    the kind of model a 2x-VAE run warm-starts from (the shipped one before session 29)."""
    from studio.tiny.sampling import export_pipeline

    torch.manual_seed(1)
    old = DenoiserTask(torch.device("cpu"), build_vae(spatial_compression=4,
                                                      temporal_compression=4),
                       image_batch=4, clip_batch=1)
    return export_pipeline(old, tmp_path_factory.mktemp("source") / "tiny-wan-4x")


@pytest.fixture(scope="module")
def task():
    torch.manual_seed(0)
    vae = build_vae(spatial_compression=2, temporal_compression=2)
    return DenoiserTask(torch.device("cpu"), vae, image_batch=4, clip_batch=1)


def test_patch_follows_the_vae_so_a_frame_stays_8x8_tokens():
    assert denoiser_patch(4) == 2 and denoiser_patch(2) == 4
    with pytest.raises(ValueError, match="spatial_compression=3"):
        denoiser_patch(3)
    with pytest.raises(ValueError, match="spatial_compression=8"):
        build_reference_encoder(8)
    assert build_denoiser(2).config.patch_size == (1, 4, 4)
    enc = build_reference_encoder(2).config
    assert (enc.image_size, enc.patch_size, enc.num_channels) == (32, 8, 8)
    assert (enc.image_size // enc.patch_size) ** 2 + 1 == 17  # as many tokens as the 4x one's


def test_warm_start_takes_every_matching_tensor_and_leaves_the_rest_fresh(task, source_4x):
    fresh_embed = task.transformer.patch_embedding.weight.detach().clone()
    report = warm_start(task, source_4x)
    assert report["transformer"] == {"loaded": len(task.transformer.state_dict()) - 3,
                                     "fresh": 3}
    shipped = load_file(str(source_4x / "transformer" / "diffusion_pytorch_model.safetensors"))
    live, ema = task.transformer.state_dict(), task.ema_transformer.state_dict()
    for key in ("blocks.3.attn1.to_q.weight", "condition_embedder.time_embedder.linear_1.weight",
                "scale_shift_table"):
        assert live[key].dtype == torch.float32
        assert torch.equal(live[key], shipped[key].float()) and torch.equal(ema[key], live[key])
    # the input and output maps change shape with the patch: they stay as initialised
    assert torch.equal(task.transformer.patch_embedding.weight, fresh_embed)
    assert shipped["proj_out.weight"].shape[0] == 8 * 4 and live["proj_out.weight"].shape[0] == 8 * 16
    text = load_file(str(source_4x / "text_encoder" / "model.safetensors"))
    assert torch.equal(task.text_encoder.shared.weight, text["shared.weight"].float())
    assert task.text_encoder.encoder.embed_tokens.weight is task.text_encoder.shared.weight
    with pytest.raises(ValueError, match="no transformer/"):
        warm_start(task, source_4x / "vae")


def test_fitted_latent_maps_start_the_moved_denoiser_below_its_fresh_loss(task, source_4x):
    """After the warm start, least squares fits the patch embedding to the source model's
    tokens of the same images and proj_out to the flow-matching target: the loss on the
    fitting batch falls, and the live and EMA copies get the same maps."""
    warm_start(task, source_4x)
    before = task.transformer.proj_out.weight.detach().clone()
    fit = fit_latent_maps(task, source_4x, images=32)
    assert 0 < fit["embedding_r2"] <= 1 and 0 < fit["output_r2"] <= 1, fit
    assert 0 < fit["reference_r2"] <= 1, fit  # the reference encoder's patches changed too
    assert fit["loss_after"] < fit["loss_before"], fit
    assert not torch.equal(task.transformer.proj_out.weight, before)
    for name in ("patch_embedding.weight", "proj_out.weight", "proj_out.bias"):
        live = task.transformer.state_dict()[name]
        assert torch.equal(live, task.ema_transformer.state_dict()[name]) and torch.isfinite(live).all()
    ref = next(v for k, v in task.reference_encoder.state_dict().items()
               if k.endswith("embeddings.patch_embedding.weight"))
    ema_ref = next(v for k, v in task.ema_reference_encoder.state_dict().items()
                   if k.endswith("embeddings.patch_embedding.weight"))
    assert ref.shape == (64, 8, 8, 8) and torch.equal(ref, ema_ref)
    # the fitted proj_out holds on new images (another seed): below the fresh map's loss
    again = fit_latent_maps(task, source_4x, images=32, seed=1)
    assert again["loss_before"] < fit["loss_before"], (fit, again)
    with pytest.raises(ValueError, match="images=8"):
        fit_latent_maps(task, source_4x, images=8)
    with pytest.raises(ValueError, match="needs vae/"):
        fit_latent_maps(task, source_4x / "transformer")


def test_training_steps_reach_the_fresh_patch_embedding(task):
    rng, gen = np.random.default_rng(1), torch.Generator().manual_seed(1)
    seen = []
    hook = task.transformer.register_forward_pre_hook(
        lambda m, args, kwargs: seen.append(tuple(kwargs["hidden_states"].shape)),
        with_kwargs=True)
    kinds = set()
    for _ in range(12):
        batch = task.batch(rng)
        kinds.add("reference" if batch.refs is not None else
                  "clip" if batch.pixels.ndim == 5 else "image")
        task.transformer.zero_grad()
        loss, _ = task.loss(batch, gen)
        loss.backward()
        assert torch.isfinite(loss)
        assert task.transformer.patch_embedding.weight.grad.abs().sum() > 0
        if kinds == {"image", "clip", "reference"}:
            break
    hook.remove()
    assert kinds == {"image", "clip", "reference"}
    # images: 1 latent frame; clips: 9 frames -> 5; reference clips: 5 + the reference frame
    assert {s[2:] for s in seen} == {(1, 32, 32), (5, 32, 32), (6, 32, 32)}


def test_export_runs_every_video_mode_through_the_engine(task, tmp_path):
    from studio.core.media import pixels_content_id
    from studio.core.request import GenerationRequest, MediaRef
    from studio.engine.executor import runner_class
    from studio.engine.models.registry import ModelRegistry
    from studio.tiny.sampling import export_pipeline

    folder = export_pipeline(task, tmp_path / "tiny-wan-2x", step=0)
    entry = ModelRegistry([tmp_path], include_hf_cache=False).resolve(str(folder))
    assert entry.usable and {"t2i", "t2v", "i2v", "r2v", "i2i"} <= entry.capabilities.modes
    runner = runner_class(entry.family)(entry, torch.device("cpu"), torch.float32)
    transformer = runner.pipes["t2v"].transformer
    seen, timesteps = [], []
    # the denoiser's input as its patch embedding gets it (the reference frame appended) ...
    spies = [transformer.patch_embedding.register_forward_pre_hook(
        lambda m, args: seen.append(tuple(args[0].shape))),
        # ... and the per-token timesteps the pipeline hands it, fitted to patch (1, 4, 4)
        transformer.register_forward_pre_hook(
            lambda m, args, kwargs: timesteps.append(tuple(kwargs["timestep"].shape)),
            with_kwargs=True)]
    picture = (np.random.default_rng(0).random((64, 64, 3)) * 255).astype(np.uint8)
    media = MediaRef(pixels_content_id(picture))
    common = dict(model=str(folder), prompt="a small red star moves left on grass", seed=1,
                  steps=2, guidance_scale=4.0, width=64, height=64)
    for mode, extra, frames, latent_frames in (
            ("t2i", {}, 1, 1), ("t2v", {"num_frames": 9}, 9, 5),
            ("i2v", {"num_frames": 9, "first_frame": media}, 9, 5),
            ("r2v", {"num_frames": 9, "references": (media,)}, 9, 6)):
        req = GenerationRequest(mode=mode, **common, **extra)
        assert req.validate(entry.capabilities) == []
        seen.clear()
        timesteps.clear()
        out = runner.run(req, {media.content_id: picture}, lambda *a: None).frames
        assert out.shape == (frames, 64, 64, 3) and np.isfinite(out).all(), mode
        assert seen and all(s[1:] == (8, latent_frames, 32, 32) for s in seen), (mode, seen)
        video_frames = min(latent_frames, 5)  # the reference frame gets its own
        assert all(t[-1] == video_frames * 8 * 8 for t in timesteps), (mode, timesteps)
    for spy in spies:
        spy.remove()


def test_a_new_vae_run_restores_from_its_own_snapshot(tmp_path):
    from safetensors.torch import save_file

    from studio.tiny.train import restore_run

    # a new run on the VAE compression the shipped model does not have
    other = 4 if SHIPPED_SPATIAL == 2 else 2
    committed = tmp_path / "v3"
    (committed / "vae" / "checkpoint").mkdir(parents=True)
    vae = build_vae(spatial_compression=other, temporal_compression=other)
    save_file(vae.state_dict(), str(committed / "vae" / "checkpoint" / "vae.safetensors"))
    architecture = {"temporal_compression": other, "latent_channels": 8,
                    "spatial_compression": other}
    (committed / "vae" / "architecture.json").write_text(json.dumps(architecture))
    # the shipped model's denoiser belongs to the other VAE: no start without a snapshot
    with pytest.raises(ValueError, match="spatial compression differs"):
        restore_run(tmp_path / "run", SHIPPED, committed)
    assert not (tmp_path / "run").exists()
    snap = committed / "dit" / "checkpoint"
    snap.mkdir(parents=True)
    torch.manual_seed(0)
    weights = {k: v.half() for k, v in build_denoiser(other).state_dict().items()}
    save_file(weights, str(snap / "ema_transformer.safetensors"))
    shutil.copy(SHIPPED / "text_encoder" / "model.safetensors", snap / "ema_text_encoder.safetensors")
    (snap / "state.json").write_text(json.dumps({"step": 40, "elapsed_s": 9.0, "seed": 0}))
    done = restore_run(tmp_path / "run", SHIPPED, committed)
    assert done == {"vae": f"restored from {committed / 'vae'}",
                    "decoder": "none (the VAE's own decoder)",
                    "dit": f"restored from {snap} at step 40"}
    assert json.loads((tmp_path / "run" / "vae" / "architecture.json").read_text()) == \
        architecture
    got = load_file(str(tmp_path / "run" / "dit" / "checkpoint" / "transformer.safetensors"))
    assert all(torch.equal(got[k], v.float()) for k, v in weights.items())
    assert not (tmp_path / "run" / "decoder").exists()


def test_object_weight_marks_the_objects_on_the_latent_grid_and_fades_with_noise(task,
                                                                                monkeypatch):
    import studio.tiny.denoiser as denoiser_module
    from studio.tiny import world

    with pytest.raises(ValueError, match="object_weight="):
        DenoiserTask(torch.device("cpu"), None, object_weight=-1.0)
    assert task.latent_coverage([], video=False) is None  # off by default
    monkeypatch.setattr(task, "object_weight", 8.0)
    rng = np.random.default_rng(3)
    specs = [world.sample_scene(rng, video=False) for _ in range(3)]
    cover = task.latent_coverage(specs, video=False)
    assert cover.shape == (3, 1, 1, 32, 32) and cover.dtype == torch.float32
    for spec, c in zip(specs, cover[:, 0, 0], strict=True):
        pixels = torch.from_numpy(world.object_coverage(spec, None, 64, 64))
        # every latent pixel encoding object pixels is marked at least as much; far ones are 0
        assert (c >= torch.nn.functional.max_pool2d(pixels[None], 2)[0] - 1e-6).all()
        assert 0 < (c > 0).float().mean() < 0.5
    clips = [world.sample_scene(rng, video=True) for _ in range(2)]
    cover = task.latent_coverage(clips, video=True)
    assert cover.shape == (2, 1, 5, 32, 32)  # 9 frames -> 5 latent frames
    pixels = torch.from_numpy(world.object_coverage(clips[0], 9, 64, 64))
    for k, frames in enumerate(([0], [1, 2], [3, 4], [5, 6], [7, 8])):
        want = torch.nn.functional.max_pool2d(pixels[frames].amax(0)[None], 2)[0]
        assert (cover[0, 0, k] >= want - 1e-6).all()

    # the loss weights: 1 on the background, 1 + W c (1 - s) on the objects
    seen = {}

    def spy(*args, **kwargs):
        seen["s"], seen["weight"] = args[4], kwargs["latent_weight"]
        return torch.zeros(())

    monkeypatch.setattr(denoiser_module, "flow_matching_loss", spy)
    batch = task.batch(np.random.default_rng(0))
    assert batch.object_cover is not None and batch.object_cover.shape[-2:] == (32, 32)
    task.loss(batch, torch.Generator().manual_seed(0))
    s, c = seen["s"].view(-1, 1, 1, 1, 1), batch.object_cover
    torch.testing.assert_close(seen["weight"], 1 + 8.0 * c * (1 - s))
    assert (seen["weight"][c == 0] == 1).all()

    # motion weight: clips add M |c_k - c_0| (not faded), where the objects left or reached
    monkeypatch.setattr(task, "object_weight", 0.0)
    monkeypatch.setattr(task, "motion_weight", 5.0)
    moving = next(sp for sp in (world.sample_scene(rng, video=True) for _ in range(200))
                  if len(sp.objects) == 1 and sp.objects[0].motion in ("left", "right"))
    cover = task.latent_coverage([moving], video=True)
    moved = (cover - cover[:, :, :1]).abs()
    assert moved[:, :, 0].sum() == 0 and moved[:, :, -1].sum() > 0
    batch = denoiser_module.DenoiserBatch([""], torch.zeros(1, 8, 5, 32, 32), None,
                                          np.zeros(1, bool), None, cover)
    task.loss(batch, torch.Generator().manual_seed(0))
    torch.testing.assert_close(seen["weight"], 1 + 5.0 * moved)
    # anchored on the middle latent frame, the first frame (behind the motion) is weighed too
    with pytest.raises(ValueError, match="motion_anchor="):
        DenoiserTask(torch.device("cpu"), None, motion_anchor="last")
    monkeypatch.setattr(task, "motion_anchor", "middle")
    task.loss(batch, torch.Generator().manual_seed(0))
    centred = (cover - cover[:, :, 2:3]).abs()
    assert centred[:, :, 2].sum() == 0 and centred[:, :, 0].sum() > 0 and \
        centred[:, :, -1].sum() > 0
    torch.testing.assert_close(seen["weight"], 1 + 5.0 * centred)


def test_the_latent_weight_makes_the_loss_a_weighted_mean():
    from types import SimpleNamespace

    from studio.tiny.denoiser import flow_matching_loss

    class ZeroDenoiser(torch.nn.Module):  # predicts 0: the error is the target's square
        config = SimpleNamespace(patch_size=(1, 2, 2))

        def forward(self, hidden_states, timestep, encoder_hidden_states, return_dict):
            return (torch.zeros_like(hidden_states),)

    gen = torch.Generator().manual_seed(0)
    x0, noise = torch.randn(2, 4, 3, 6, 6, generator=gen), torch.randn(2, 4, 3, 6, 6, generator=gen)
    s, text = torch.tensor([0.3, 0.8]), torch.zeros(2, 5, 8)
    target_sq = (noise - x0).pow(2)
    plain = flow_matching_loss(ZeroDenoiser(), x0, text, noise, s)
    torch.testing.assert_close(plain, target_sq.mean())
    ones = flow_matching_loss(ZeroDenoiser(), x0, text, noise, s,
                              latent_weight=torch.ones(2, 1, 3, 6, 6))
    torch.testing.assert_close(ones, plain)
    region = torch.zeros(2, 1, 3, 6, 6)
    region[:, :, :, 1:3, 2:5] = 1
    heavy = flow_matching_loss(ZeroDenoiser(), x0, text, noise, s,
                               latent_weight=1e-9 + region)
    torch.testing.assert_close(heavy, target_sq[:, :, :, 1:3, 2:5].mean(), rtol=1e-5, atol=1e-6)


def _blocks_only_loss(transformer, x0, *args, **kwargs):
    """A flow-matching loss stand-in for one 5-frame clip of 32x32 latents: runs the blocks
    (so the read-out hooks see them) and adds 0, leaving the auxiliary terms alone."""
    return transformer(hidden_states=x0, timestep=torch.zeros(1, 5 * 64),
                       encoder_hidden_states=torch.zeros(1, 32, 64),
                       return_dict=False)[0].mean() * 0


def test_frame_awareness_loss_reads_each_tokens_frame_and_can_fail():
    from studio.tiny.denoiser import MAX_TOKEN_FRAMES, frame_awareness_loss

    frames, per_frame, dim = 5, 6, 32
    head = torch.nn.Linear(dim, MAX_TOKEN_FRAMES)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
        head.weight[:frames, :frames] = 20 * torch.eye(frames)
    # tokens that carry a one-hot code of their frame in their first channels (frame-major)
    hidden = torch.zeros(2, frames * per_frame, dim)
    for k in range(frames):
        hidden[:, k * per_frame:(k + 1) * per_frame, k] = 1.0
    loss, accuracy = frame_awareness_loss(head, hidden, frames)
    assert accuracy == 1.0 and float(loss) < 1e-3
    # the same code in the wrong order: every frame but the middle one is misread
    shuffled = hidden.flip(1)
    loss, accuracy = frame_awareness_loss(head, shuffled, frames)
    assert accuracy == pytest.approx(1 / frames) and float(loss) > 5
    # tokens that hold nothing: chance over the head's classes
    loss, _ = frame_awareness_loss(head, torch.zeros_like(hidden), frames)
    assert float(loss) == pytest.approx(np.log(MAX_TOKEN_FRAMES), rel=1e-5)
    with pytest.raises(ValueError, match="frames=4"):
        frame_awareness_loss(head, hidden, 4)


def test_frame_awareness_trains_a_head_on_clip_steps_only(monkeypatch):
    import studio.tiny.denoiser as denoiser_module

    torch.manual_seed(0)
    vae = build_vae(spatial_compression=2, temporal_compression=2)
    with pytest.raises(ValueError, match="frame_awareness="):
        DenoiserTask(torch.device("cpu"), vae, frame_awareness=-1.0)
    with pytest.raises(ValueError, match="frame_awareness_block="):
        DenoiserTask(torch.device("cpu"), vae, frame_awareness=1.0, frame_awareness_block=6)
    plain = DenoiserTask(torch.device("cpu"), vae, image_batch=2, clip_batch=1)
    assert "frame_head" not in plain.modules()
    task = DenoiserTask(torch.device("cpu"), vae, image_batch=2, clip_batch=1,
                        frame_awareness=0.5, frame_awareness_block=1)
    assert "frame_head" in task.modules() and "frame_head" in task.optional_modules
    block = task.transformer.blocks[1]
    gen = torch.Generator().manual_seed(0)
    clip = denoiser_module.DenoiserBatch(["a red circle moves left"], torch.randn(1, 8, 5, 32, 32),
                                         None, np.zeros(1, bool), None, None)
    loss, metrics = task.loss(clip, gen)
    assert not block._forward_hooks  # the read-out hook is gone after the step
    assert 0 <= metrics["frame_acc"] <= 1 and metrics["frame_ce"] > 0
    loss.backward()
    assert task.frame_head.weight.grad.abs().sum() > 0
    # the auxiliary term is the weighted cross-entropy on top of the flow-matching loss
    monkeypatch.setattr(denoiser_module, "flow_matching_loss", _blocks_only_loss)
    loss, metrics = task.loss(clip, gen)
    assert float(loss) == pytest.approx(0.5 * metrics["frame_ce"], rel=1e-5)
    # a reference clip has one more token frame (the appended reference); images have none
    ref = denoiser_module.DenoiserBatch(["a large object moves left"],
                                        torch.randn(1, 8, 5, 32, 32),
                                        torch.randn(1, 8, 1, 32, 32), np.zeros(1, bool),
                                        [("red", "circle")], None)
    seen = {}
    real = denoiser_module.frame_awareness_loss

    def spy(head, hidden, frames):
        seen["frames"] = frames
        return real(head, hidden, frames)

    monkeypatch.setattr(denoiser_module, "frame_awareness_loss", spy)
    monkeypatch.setattr(denoiser_module, "flow_matching_loss",
                        lambda transformer, x0, text, noise, s, **k: transformer(
                            hidden_states=x0 if k["reference"] is None
                            else torch.cat([x0, k["reference"]], 2),
                            timestep=torch.zeros(len(x0), 64 * (
                                x0.shape[2] + (k["reference"] is not None))),
                            encoder_hidden_states=text,
                            return_dict=False)[0].mean() * 0)
    task.loss(ref, gen)
    assert seen["frames"] == 6
    image = denoiser_module.DenoiserBatch(["a red circle"], torch.randn(2, 8, 1, 32, 32), None,
                                          np.zeros(2, bool), None, None)
    seen.clear()
    _, metrics = task.loss(image, gen)
    assert "frame_ce" not in metrics and not seen


@pytest.mark.parametrize("part, options", [("frame_head", {"frame_awareness": 0.5}),
                                           ("motion_head", {"motion_awareness": 2.0}),
                                           ("position_head", {"position_awareness": 0.3}),
                                           ("layout_head", {"layout_awareness": 1.0,
                                                            "object_weight": 10.0}),
                                           ("shape_head", {"shape_awareness": 1.0})])
def test_snapshot_and_restore_carry_the_training_only_heads(tmp_path, caplog, part, options):
    """A training-only head (the frame- and motion-awareness heads) has no EMA copy and no
    place in an export: the snapshot carries its live weights, so a restored run goes on
    with it instead of a fresh one."""
    from safetensors.torch import save_file, save_model

    from studio.tiny.train import restore_run, snapshot_run
    from studio.train.loop import load_checkpoint

    vae = build_vae(spatial_compression=SHIPPED_SPATIAL, temporal_compression=SHIPPED_SPATIAL)
    torch.manual_seed(0)
    task = DenoiserTask(torch.device("cpu"), vae, image_batch=2, clip_batch=1,
                        **options)
    with torch.no_grad():
        getattr(task, part).weight.normal_()  # trained weights: not what a fresh head starts at
    run = tmp_path / "run" / "dit" / "checkpoint"
    run.mkdir(parents=True)
    for name, module in task.modules().items():
        save_model(module, str(run / f"{name}.safetensors"))
    (run / "state.json").write_text(json.dumps({"step": 10 ** 6, "elapsed_s": 5.0, "seed": 0}))
    committed = tmp_path / "committed"
    shutil.copytree(REPO / "training" / "tiny" / "v3" / "vae", committed / "vae")
    assert snapshot_run(tmp_path / "run", committed)["step"] == 10 ** 6
    snap = committed / "dit" / "checkpoint"
    head = load_file(str(snap / f"{part}.safetensors"))
    assert set(head) == set(getattr(task, part).state_dict())
    assert all(v.dtype == torch.float16 for v in head.values())

    # the snapshot is newer than the export: the restored run holds its head, and loads it
    assert restore_run(tmp_path / "run2", SHIPPED, committed)["dit"] == (
        f"restored from {snap} at step {10 ** 6}")
    restored = load_file(str(tmp_path / "run2" / "dit" / "checkpoint" / f"{part}.safetensors"))
    assert all(torch.equal(restored[k], v.float()) for k, v in head.items())
    torch.manual_seed(1)
    again = DenoiserTask(torch.device("cpu"), vae, image_batch=2, clip_batch=1,
                         **options)
    with caplog.at_level("WARNING"):
        assert load_checkpoint(tmp_path / "run2" / "dit", again)["step"] == 10 ** 6
    assert "start fresh" not in caplog.text
    assert torch.equal(getattr(again, part).weight, head["weight"].float())

    # a run without the head leaves no stale head in the snapshot
    (run / f"{part}.safetensors").unlink()
    snapshot_run(tmp_path / "run", committed)
    assert not (snap / f"{part}.safetensors").exists()
    # and a restore from an export (older snapshot) starts the head fresh
    state = json.loads((snap / "state.json").read_text())
    (snap / "state.json").write_text(json.dumps(state | {"step": 1}))
    save_file({"weight": torch.ones(1)}, str(snap / f"{part}.safetensors"))
    restore_run(tmp_path / "run3", SHIPPED, committed)
    assert not (tmp_path / "run3" / "dit" / "checkpoint" / f"{part}.safetensors").exists()


def test_motion_targets_follow_the_world_and_the_vae_frame_groups():
    from studio.tiny import world
    from studio.tiny.denoiser import motion_targets

    def clip(*objects):
        return world.SceneSpec("grass", tuple(objects), video=True)

    right = world.ObjectSpec("red", "circle", "small", "center", "right")
    up = world.ObjectSpec("blue", "star", "large", "left", "up")
    grow = world.ObjectSpec("red", "square", "small", "center", "growing")
    still = world.ObjectSpec("red", "square", "small", "center", "still")
    target, known = motion_targets([clip(right), clip(up), clip(grow), clip(still),
                                    clip(right, still)], temporal=2)
    assert target.shape == (5, 5, 3) and target.dtype == torch.float32
    assert known.tolist() == [True, True, True, True, False]
    # 9 frames at times -0.5..0.5; latent frames: {0}, {1,2}, {3,4}, {5,6}, {7,8}
    times = torch.tensor([-0.5, -0.3125, -0.0625, 0.1875, 0.4375])
    torch.testing.assert_close(target[0, :, 0], times)  # moving right: +x, in the unit travel
    assert target[0, :, 1:].abs().max() == 0
    torch.testing.assert_close(target[1, :, 1], -times)  # moving up: -y
    torch.testing.assert_close(target[2, :, 2], times)  # growing: log extent in log(GROWTH)s
    assert target[3].abs().max() == 0 and target[4].abs().max() == 0
    assert motion_targets([clip(right)], temporal=4)[0].shape == (1, 3, 3)
    with world.motion_distance(0.0):  # a world without travel: no displacement, no error
        assert motion_targets([clip(right)], temporal=2)[0].abs().max() == 0
    with pytest.raises(ValueError, match="frames=8"):
        motion_targets([clip(right)], temporal=2, frames=8)


def test_motion_awareness_loss_reads_each_frames_displacement_and_can_fail():
    from studio.tiny.denoiser import motion_awareness_loss

    frames, per_frame, dim = 6, 4, 16  # 5 clip frames and an appended reference frame
    target = torch.linspace(-0.5, 0.5, 5).view(1, 5, 1).expand(2, 5, 3).clone()
    target[1] *= -1
    head = torch.nn.Linear(dim, 3)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
        head.weight[:, 0] = 1.0
    hidden = torch.zeros(2, frames * per_frame, dim)  # channel 0 holds the displacement
    for k in range(5):
        hidden[:, k * per_frame:(k + 1) * per_frame, 0] = target[:, k, :1]
    hidden[:, 5 * per_frame:, 0] = 99.0  # the reference frame is not read
    with torch.no_grad():  # the read-out sees the frames divided by their RMS
        head.weight[:, 0] = target[:, :, 0].pow(2).mean().sqrt() / dim ** 0.5
    known = torch.tensor([True, True])
    assert motion_awareness_loss(head, hidden, frames, target, known).item() < 1e-10
    flipped = torch.cat([hidden[:, :5 * per_frame].flip(1), hidden[:, 5 * per_frame:]], 1)
    assert motion_awareness_loss(head, flipped, frames, target, known).item() > 0.1
    # only known items count; none known: zero, still differentiable
    wrong = hidden.clone()
    wrong[1] = flipped[1]
    assert motion_awareness_loss(head, wrong, frames, target,
                                 torch.tensor([True, False])).item() < 1e-10
    none = motion_awareness_loss(head, wrong, frames, target, torch.tensor([False, False]))
    assert none.item() == 0 and none.requires_grad
    with pytest.raises(ValueError, match="frames=5"):
        motion_awareness_loss(head, hidden, 5, target, known)
    with pytest.raises(ValueError, match="7 frames, more than the 6"):
        motion_awareness_loss(head, hidden, frames, torch.zeros(2, 7, 3), known)


def test_motion_awareness_trains_a_head_on_known_clips(monkeypatch):
    import studio.tiny.denoiser as denoiser_module

    torch.manual_seed(0)
    vae = build_vae(spatial_compression=2, temporal_compression=2)
    with pytest.raises(ValueError, match="motion_awareness="):
        DenoiserTask(torch.device("cpu"), vae, motion_awareness=11.0)
    task = DenoiserTask(torch.device("cpu"), vae, image_batch=2, clip_batch=2,
                        motion_awareness=2.0)
    assert "motion_head" in task.modules() and "motion_head" in task.optional_modules
    assert task.frame_head is None
    plain = DenoiserTask(torch.device("cpu"), vae, image_batch=2, clip_batch=1)
    assert "motion_head" not in plain.modules()
    assert plain.batch_motion_targets([], True, np.zeros(0, bool)) is None
    # a dropped caption leaves its clip's target unknown; images have none
    world = denoiser_module.world
    one = world.SceneSpec("grass", (world.ObjectSpec("red", "circle", "small", "center",
                                                     "left"),), video=True)
    target, known = task.batch_motion_targets([one, one], True, np.array([True, False]))
    assert known.tolist() == [False, True]
    torch.testing.assert_close(target, denoiser_module.motion_targets([one, one], 2)[0])
    assert task.batch_motion_targets([one], False, np.zeros(1, bool)) is None
    # the pixel path hands clip batches their targets, dropped captions unknown
    rng = np.random.default_rng(0)
    task.step_kinds = {"clip": 1.0}
    batch = task.batch(rng)
    target, known = batch.motion_target
    assert target.shape == (2, 5, 3)
    one = [c != "" for c in batch.captions]
    assert known.tolist() == [k and o for k, o in zip(known.tolist(), one, strict=True)]
    task.step_kinds = {"image": 1.0}
    assert task.batch(rng).motion_target is None
    # the auxiliary term is the weighted squared error on top of the flow-matching loss
    right = denoiser_module.motion_targets([denoiser_module.world.SceneSpec(
        "grass", (denoiser_module.world.ObjectSpec("red", "circle", "small", "center",
                                                   "right"),), video=True)], 2)
    clip = denoiser_module.DenoiserBatch(["a red circle moves right"],
                                         torch.randn(1, 8, 5, 32, 32), None, np.zeros(1, bool),
                                         None, None, right)
    gen = torch.Generator().manual_seed(0)
    loss, metrics = task.loss(clip, gen)
    assert metrics["motion_mse"] > 0 and not task.transformer.blocks[1]._forward_hooks
    loss.backward()
    assert task.motion_head.weight.grad.abs().sum() > 0
    monkeypatch.setattr(denoiser_module, "flow_matching_loss", _blocks_only_loss)
    loss, metrics = task.loss(clip, gen)
    assert loss.item() == pytest.approx(2.0 * metrics["motion_mse"], rel=1e-5)
    # without targets (a batch built before the head existed) the term is skipped
    _, metrics = task.loss(clip._replace(motion_target=None), gen)
    assert "motion_mse" not in metrics
    # targets for another number of latent frames are refused, not misread
    with pytest.raises(ValueError, match="3 frames for a clip of 5"):
        task.loss(clip._replace(motion_target=(right[0][:, :3], right[1])), gen)
    # a reference clip has one more token frame (the appended reference), which is not read
    seen = {}
    real = denoiser_module.motion_awareness_loss

    def spy(head, hidden, frames, target, known):
        seen["frames"], seen["target_frames"] = frames, target.shape[1]
        return real(head, hidden, frames, target, known)

    monkeypatch.setattr(denoiser_module, "motion_awareness_loss", spy)
    monkeypatch.setattr(denoiser_module, "flow_matching_loss",
                        lambda transformer, x0, text, noise, s, **k: transformer(
                            hidden_states=torch.cat([x0, k["reference"]], 2),
                            timestep=torch.zeros(len(x0), 64 * 6),
                            encoder_hidden_states=text, return_dict=False)[0].mean() * 0)
    ref = clip._replace(captions=["a large object moves right"],
                        refs=torch.randn(1, 8, 1, 32, 32), ref_objects=[("red", "circle")])
    task.loss(ref, gen)
    assert seen == {"frames": 6, "target_frames": 5}


def test_position_awareness_loss_reads_each_tokens_row_and_column_and_can_fail():
    from studio.tiny.denoiser import MAX_TOKEN_SIDE, position_awareness_loss

    frames, rows, columns, dim = 2, 3, 5, 16  # odd sides, fewer rows than columns
    head = torch.nn.Linear(dim, 2 * MAX_TOKEN_SIDE)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
        head.weight[:rows, :rows] = 20 * torch.eye(rows)  # row logits read channels 0..2
        head.weight[MAX_TOKEN_SIDE:MAX_TOKEN_SIDE + columns, rows:rows + columns] = \
            20 * torch.eye(columns)  # column logits read channels 3..7
    # tokens in Wan's (frame, row, column) order carrying a one-hot code of their row and
    # column
    hidden = torch.zeros(2, frames * rows * columns, dim)
    n = 0
    for _ in range(frames):
        for r in range(rows):
            for c in range(columns):
                hidden[:, n, r] = 1.0
                hidden[:, n, rows + c] = 1.0
                n += 1
    loss, accuracy = position_awareness_loss(head, hidden, frames, rows, columns)
    assert accuracy == 1.0 and float(loss) < 1e-3
    # the same tokens mirrored left to right: rows still right, columns wrong but the middle
    mirrored = hidden.reshape(2, frames, rows, columns, dim).flip(3).reshape(hidden.shape)
    loss, accuracy = position_awareness_loss(head, mirrored, frames, rows, columns)
    assert accuracy == pytest.approx(1 / columns) and float(loss) > 5
    # tokens that hold nothing: chance over the head's classes
    loss, accuracy = position_awareness_loss(head, torch.zeros_like(hidden), frames, rows,
                                             columns)
    assert float(loss) == pytest.approx(np.log(MAX_TOKEN_SIDE), rel=1e-5)
    with pytest.raises(ValueError, match="frames=2, rows=5, columns=3"):
        position_awareness_loss(head, hidden[:, :-1], frames, 5, 3)
    with pytest.raises(ValueError, match=f"columns={MAX_TOKEN_SIDE + 1}"):
        position_awareness_loss(head, hidden, 1, 1, MAX_TOKEN_SIDE + 1)


def _any_blocks_loss(transformer, x0, text, noise, s, **kwargs):
    """A flow-matching loss stand-in for images or clips of 32x32 latents (64 tokens per
    frame), an appended reference included: runs the blocks and adds 0."""
    ref = kwargs.get("reference")
    x = x0 if ref is None else torch.cat([x0, ref], 2)
    return transformer(hidden_states=x, timestep=torch.zeros(len(x), 64 * x.shape[2]),
                       encoder_hidden_states=text, return_dict=False)[0].mean() * 0


def test_position_awareness_trains_a_head_on_image_and_clip_steps(monkeypatch):
    import studio.tiny.denoiser as denoiser_module

    torch.manual_seed(0)
    vae = build_vae(spatial_compression=2, temporal_compression=2)
    with pytest.raises(ValueError, match="position_awareness="):
        DenoiserTask(torch.device("cpu"), vae, position_awareness=11.0)
    plain = DenoiserTask(torch.device("cpu"), vae, image_batch=2, clip_batch=1)
    assert "position_head" not in plain.modules()
    task = DenoiserTask(torch.device("cpu"), vae, image_batch=2, clip_batch=1,
                        position_awareness=0.4, frame_awareness_block=2)
    assert "position_head" in task.modules() and "position_head" in task.optional_modules
    assert task.frame_head is None
    gen = torch.Generator().manual_seed(0)
    image = denoiser_module.DenoiserBatch(["a red circle"] * 2, torch.randn(2, 8, 1, 32, 32),
                                          None, np.zeros(2, bool), None, None)
    loss, metrics = task.loss(image, gen)
    assert not task.transformer.blocks[2]._forward_hooks  # the read-out hook is gone
    assert 0 <= metrics["position_acc"] <= 1 and metrics["position_ce"] > 0
    assert "frame_ce" not in metrics
    loss.backward()
    assert task.position_head.weight.grad.abs().sum() > 0
    # the auxiliary term is the weighted cross-entropy on top of the flow-matching loss, and
    # it reads the grid of the latents it is given (8 x 8 tokens of 32 x 32 latents)
    seen = {}
    real = denoiser_module.position_awareness_loss

    def spy(head, hidden, frames, rows, columns):
        seen.update(frames=frames, rows=rows, columns=columns)
        return real(head, hidden, frames, rows, columns)

    monkeypatch.setattr(denoiser_module, "position_awareness_loss", spy)
    monkeypatch.setattr(denoiser_module, "flow_matching_loss", _any_blocks_loss)
    loss, metrics = task.loss(image, gen)
    assert float(loss) == pytest.approx(0.4 * metrics["position_ce"], rel=1e-5)
    assert seen == {"frames": 1, "rows": 8, "columns": 8}
    ref = denoiser_module.DenoiserBatch(["a large object moves left"],
                                        torch.randn(1, 8, 5, 32, 32),
                                        torch.randn(1, 8, 1, 32, 32), np.zeros(1, bool),
                                        [("red", "circle")], None)
    task.loss(ref, gen)
    assert seen == {"frames": 6, "rows": 8, "columns": 8}


def test_layout_awareness_loss_reads_where_the_object_is_and_can_fail():
    from studio.tiny.denoiser import layout_awareness_loss

    torch.manual_seed(0)
    b, f, h, w, dim = 2, 2, 6, 10, 8  # 3 x 5 tokens of 2 x 2 patches per frame
    cover = torch.zeros(b, 1, f, h, w)
    cover[0, :, :, 0:2, 2:6] = 1.0  # item 0: tokens (0, 1) and (0, 2) of each frame
    cover[1, :, 1, 4:6, 8:10] = 1.0  # item 1: token (2, 4) of its second frame
    target = torch.nn.functional.avg_pool3d(cover, (1, 2, 2)).reshape(b, -1)
    head = torch.nn.Linear(dim, 1)
    with torch.no_grad():
        head.weight.zero_()
        head.weight[0, 0] = 40.0
        head.bias.fill_(-20.0)
    # tokens whose first channel says "object here", plus an appended reference frame
    hidden = torch.zeros(b, f * 15 + 15, dim)
    hidden[:, : f * 15, 0] = target
    known = torch.tensor([True, True])
    assert float(layout_awareness_loss(head, hidden, cover, (2, 2), known)) < 1e-6
    # the same tokens, the object mirrored: wrong wherever either copy lies
    mirrored = hidden.clone()
    mirrored[:, : f * 15, 0] = target.reshape(b, f, 3, 5).flip(3).reshape(b, -1)
    assert float(layout_awareness_loss(head, mirrored, cover, (2, 2), known)) > 1.0
    # unknown items do not count; none known: 0
    only_first = layout_awareness_loss(head, mirrored, cover, (2, 2), torch.tensor([True, False]))
    item0 = layout_awareness_loss(head, mirrored[:1], cover[:1], (2, 2),
                                  torch.tensor([True]))
    assert float(only_first) == pytest.approx(float(item0))
    assert float(layout_awareness_loss(head, mirrored, cover, (2, 2),
                                       torch.tensor([False, False]))) == 0.0
    with pytest.raises(ValueError, match="does not divide"):
        layout_awareness_loss(head, hidden, cover, (4, 4), known)
    with pytest.raises(ValueError, match="fewer than"):
        layout_awareness_loss(head, hidden[:, :20], cover, (2, 2), known)


def test_layout_awareness_trains_a_head_and_skips_dropped_captions(monkeypatch):
    import studio.tiny.denoiser as denoiser_module

    torch.manual_seed(0)
    vae = build_vae(spatial_compression=2, temporal_compression=2)
    with pytest.raises(ValueError, match="layout_awareness needs the object cover"):
        DenoiserTask(torch.device("cpu"), vae, layout_awareness=1.0)
    task = DenoiserTask(torch.device("cpu"), vae, image_batch=2, clip_batch=1,
                        layout_awareness=0.7, object_weight=10.0)
    assert "layout_head" in task.modules() and "layout_head" in task.optional_modules
    cover = torch.zeros(2, 1, 1, 32, 32)
    cover[:, :, :, :8, :8] = 1.0
    image = denoiser_module.DenoiserBatch(["a red circle at the top left", ""],
                                          torch.randn(2, 8, 1, 32, 32), None, np.zeros(2, bool),
                                          None, cover)
    gen = torch.Generator().manual_seed(0)
    loss, metrics = task.loss(image, gen)
    assert metrics["layout_bce"] > 0
    loss.backward()
    assert task.layout_head.weight.grad.abs().sum() > 0
    seen = {}
    real = denoiser_module.layout_awareness_loss

    def spy(head, hidden, cover, patch, known):
        seen.update(patch=patch, known=known.tolist(), tokens=hidden.shape[1])
        return real(head, hidden, cover, patch, known)

    monkeypatch.setattr(denoiser_module, "layout_awareness_loss", spy)
    monkeypatch.setattr(denoiser_module, "flow_matching_loss", _any_blocks_loss)
    loss, metrics = task.loss(image, gen)
    assert float(loss) == pytest.approx(0.7 * metrics["layout_bce"], rel=1e-5)
    assert seen == {"patch": (4, 4), "known": [True, False], "tokens": 64}


def test_shape_awareness_loss_reads_each_objects_shape_and_can_fail():
    from studio.tiny.denoiser import SHAPE_TOKEN_COVER, shape_awareness_loss

    b, f, h, w, dim, k = 2, 2, 6, 10, 8, 4  # 3 x 5 tokens of 2 x 2 patches per frame
    cover = torch.zeros(b, k, f, h, w)
    cover[0, 3, :, 0:2, 2:6] = 1.0  # item 0: a star under tokens (0, 1) and (0, 2)
    cover[0, 0, :, 4:6, 0:2] = 1.0  # and a circle under token (2, 0)
    cover[1, 2, 1, 4:6, 8:10] = 1.0  # item 1: a triangle under token (2, 4) of frame 1
    cover[1, 1, 0, 2, 4] = 1.0  # a quarter of token (1, 2) under a square: scored
    cover[1, 1, 0, 0, 0] = 0.9  # under a quarter: not scored
    cover[1, (0, 3), 0, 0:2, 6:8] = 1.0  # a star over a circle (token (0, 3)): which is seen
    pooled = torch.nn.functional.avg_pool3d(cover, (1, 2, 2)).reshape(b, k, -1)
    scored = (pooled >= SHAPE_TOKEN_COVER).sum(1) == 1  # is not known: not scored
    assert int(scored.sum()) == 2 * 3 + 1 + 1 and int((pooled.amax(1) >= 0.25).sum()) == 9
    label = pooled.argmax(1)
    head = torch.nn.Linear(dim, k)
    with torch.no_grad():  # channel j of a token says "shape j"
        head.weight.zero_()
        head.weight[:, :k] = 20.0 * torch.eye(k)
        head.bias.zero_()
    hidden = torch.zeros(b, f * 15 + 15, dim)  # plus an appended reference frame
    hidden[:, : f * 15, :k] = torch.nn.functional.one_hot(label, k).float()
    known = torch.tensor([True, True])
    loss, accuracy = shape_awareness_loss(head, hidden, cover, (2, 2), known)
    assert float(loss) < 1e-6 and accuracy == 1.0
    # background tokens say anything: not scored, so the loss does not move
    noisy = hidden.clone()
    noisy[:, : f * 15][~scored] = torch.randn(int((~scored).sum()), dim)
    assert float(shape_awareness_loss(head, noisy, cover, (2, 2), known)[0]) < 1e-6
    # every object read as the next shape (stars as circles): wrong on every scored token
    wrong = hidden.clone()
    wrong[:, : f * 15, :k] = torch.nn.functional.one_hot((label + 1) % k, k).float()
    loss, accuracy = shape_awareness_loss(head, wrong, cover, (2, 2), known)
    assert float(loss) > 10.0 and accuracy == 0.0
    # a dropped caption's tokens do not count; none known: 0 in the graph, no accuracy
    first, _ = shape_awareness_loss(head, wrong, cover, (2, 2), torch.tensor([True, False]))
    alone, _ = shape_awareness_loss(head, wrong[:1], cover[:1], (2, 2), torch.tensor([True]))
    assert float(first) == pytest.approx(float(alone))
    none, none_accuracy = shape_awareness_loss(head, wrong, cover, (2, 2),
                                               torch.tensor([False, False]))
    assert float(none) == 0.0 and none.requires_grad and none_accuracy is None
    with pytest.raises(ValueError, match="does not divide"):
        shape_awareness_loss(head, hidden, cover, (4, 4), known)
    with pytest.raises(ValueError, match="fewer than"):
        shape_awareness_loss(head, hidden[:, :20], cover, (2, 2), known)
    with pytest.raises(ValueError, match="3 logits for 4 shape planes"):
        shape_awareness_loss(torch.nn.Linear(dim, 3), hidden, cover, (2, 2), known)


def test_shape_cover_is_the_object_cover_split_by_shape():
    """``world.object_coverage(by_shape=True)`` puts each object in its shape's plane, and
    the task's per-shape latent cover is the plain cover plane by plane (its maximum over
    the planes is the plain cover, exactly)."""
    import studio.tiny.world as world

    rng = np.random.default_rng(3)
    scenes = [world.sample_scene(rng, video=v, two_object_prob=1.0) for v in (False, True)]
    for spec in scenes:
        frames = 9 if spec.video else None
        planes = world.object_coverage(spec, frames, 64, 64, by_shape=True)
        assert planes.shape == (4, *((9,) if frames else ()), 64, 64)
        np.testing.assert_array_equal(planes.max(0), world.object_coverage(spec, frames))
        for i, shape in enumerate(world.SHAPES):
            assert (planes[i].max() > 0.5) == any(o.shape == shape for o in spec.objects)
    vae = build_vae(spatial_compression=2, temporal_compression=2)
    task = DenoiserTask(torch.device("cpu"), vae, image_batch=2, clip_batch=1,
                        shape_awareness=1.0, object_weight=10.0)
    assert "shape_head" in task.optional_modules
    for spec in scenes:
        covers = task.batch_covers([spec], spec.video)
        shapes, plain = covers["shape_cover"], covers["object_cover"]
        assert shapes.shape == (1, 4, 5 if spec.video else 1, 32, 32)
        assert torch.equal(shapes.amax(1, keepdim=True), plain)
        assert torch.equal(plain, task.latent_coverage([spec], spec.video))
    # no object or motion weight: the shape cover alone
    alone = DenoiserTask(torch.device("cpu"), vae, image_batch=2, clip_batch=1,
                         shape_awareness=1.0)
    covers = alone.batch_covers(scenes[:1], False)
    assert covers["object_cover"] is None and covers["shape_cover"].shape[1] == 4
    with pytest.raises(ValueError, match="shape_awareness"):
        DenoiserTask(torch.device("cpu"), vae, shape_awareness=11.0)


def test_shape_awareness_trains_a_head_on_every_step(monkeypatch):
    import studio.tiny.denoiser as denoiser_module

    torch.manual_seed(0)
    vae = build_vae(spatial_compression=2, temporal_compression=2)
    task = DenoiserTask(torch.device("cpu"), vae, image_batch=2, clip_batch=1,
                        shape_awareness=0.6)
    assert "shape_head" in task.modules()
    rng = np.random.default_rng(0)
    batch = task.batch(rng)
    assert batch.shape_cover is not None and batch.object_cover is None
    shapes = torch.zeros(2, 4, 1, 32, 32)
    shapes[:, 3, :, :8, :8] = 1.0  # a star at the top left
    image = denoiser_module.DenoiserBatch(["a red star at the top left", ""],
                                          torch.randn(2, 8, 1, 32, 32), None, np.zeros(2, bool),
                                          None, None, shape_cover=shapes)
    gen = torch.Generator().manual_seed(0)
    loss, metrics = task.loss(image, gen)
    assert metrics["shape_ce"] > 0 and 0 <= metrics["shape_acc"] <= 1
    loss.backward()
    assert task.shape_head.weight.grad.abs().sum() > 0
    seen = {}
    real = denoiser_module.shape_awareness_loss

    def spy(head, hidden, cover, patch, known):
        seen.update(patch=patch, known=known.tolist(), tokens=hidden.shape[1])
        return real(head, hidden, cover, patch, known)

    monkeypatch.setattr(denoiser_module, "shape_awareness_loss", spy)
    monkeypatch.setattr(denoiser_module, "flow_matching_loss", _any_blocks_loss)
    loss, metrics = task.loss(image, gen)
    assert float(loss) == pytest.approx(0.6 * metrics["shape_ce"], rel=1e-5)
    assert seen == {"patch": (4, 4), "known": [True, False], "tokens": 64}
