"""LTX-Video and LTX-2 (one audio-video transformer) through the registry: text-to-video,
text-to-image (one frame) and image-to-video on tiny random-weight pipelines give stock
diffusers' pixels; the step previews unpack their token-sequence latents; discovery lists each
folder with its family, modes and rules; every profile runs and the step cache forecasts (on
LTX-2, both streams)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from PIL import Image

from studio.core.media import pixels_content_id
from studio.core.request import GenerationRequest, MediaRef, OptimizationSettings
from studio.engine.executor import runner_class
from studio.engine.models.registry import ModelRegistry
from studio.testing.tiny_pipelines import build_tiny_ltx, build_tiny_ltx2

IMAGE = (np.random.default_rng(5).random((64, 96, 3)) * 255).astype(np.uint8)
REF = MediaRef(pixels_content_id(IMAGE), "first.png")
# family -> (builder, text-to-video pipeline, image-to-video pipeline)
FAMILIES = {"ltx": (build_tiny_ltx, "LTXPipeline", "LTXImageToVideoPipeline"),
            "ltx2": (build_tiny_ltx2, "LTX2Pipeline", "LTX2ImageToVideoPipeline")}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def ltx(request, tmp_path_factory):
    """(family, folder, runner) for each LTX family."""
    family = request.param
    folder = FAMILIES[family][0](tmp_path_factory.mktemp(family) / family)
    # 128 text tokens instead of LTX-2's 1024 (a third of the time); the studio passes the
    # folder's call_kwargs to the pipeline
    (folder / "studio.json").write_text(json.dumps({"call_kwargs": {"max_sequence_length": 128}}))
    entry = ModelRegistry(include_hf_cache=False).resolve(str(folder))
    assert entry.family == family and entry.usable, entry.error
    return family, folder, runner_class(entry.family)(entry, torch.device("cpu"), torch.float32)


def stock(cls_name, folder, **kwargs):
    import diffusers

    pipe = getattr(diffusers, cls_name).from_pretrained(folder, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    out = pipe(generator=torch.Generator().manual_seed(kwargs.pop("seed")), output_type="np",
               **kwargs)
    return np.asarray(out.frames[0], dtype=np.float32)


def test_discovery_lists_the_family_with_its_modes(ltx):
    family, folder, _ = ltx
    entries = {e.model_id: e for e in ModelRegistry([folder.parent],
                                                    include_hf_cache=False).list()}
    entry = entries[str(folder)]
    assert entry.usable and entry.family == family, entry.error
    caps = entry.capabilities
    assert caps.family == family and caps.modes == {"t2v", "t2i", "i2v"}
    assert caps.spatial_multiple == 32 and caps.frame_multiple == 8
    assert caps.default_frames == 9 and caps.default_fps == 24.0
    from studio.engine.models.folders import check_folder

    files = {p.parent.name for p in check_folder(folder)[1]}
    assert {"transformer", "text_encoder", "vae"} <= files
    if family == "ltx2":  # the connectors' and vocoder's weights are checked and hashed too
        assert {"connectors", "vocoder"} <= files


@pytest.mark.parametrize("mode,frames", [("t2v", 9), ("t2i", 1), ("i2v", 9)])
def test_same_pixels_as_stock_diffusers(ltx, mode, frames):
    family, folder, runner = ltx
    _, t2v, i2v = FAMILIES[family]
    fields = {"first_frame": REF} if mode == "i2v" else {}
    extra = {"image": Image.fromarray(IMAGE)} if mode == "i2v" else {}
    request = GenerationRequest(model=str(folder), prompt="a red circle on grass",
                                negative_prompt="blurry", seed=2, steps=2, guidance_scale=3.0,
                                width=96, height=64, mode=mode, num_frames=frames, fps=24.0,
                                **fields)
    assert request.validate(runner.entry.capabilities) == []
    previews = []
    ours = runner.run(request, {REF.content_id: IMAGE},
                      lambda i, n, lat: previews.append(runner.preview(lat).shape))
    theirs = stock(i2v if mode == "i2v" else t2v, folder, prompt=request.prompt,
                   negative_prompt="blurry", seed=2, num_inference_steps=2, guidance_scale=3.0,
                   height=64, width=96, num_frames=frames, frame_rate=24.0,
                   max_sequence_length=128, **extra)
    assert ours.frames.shape == theirs.shape == (frames, 64, 96, 3)
    assert np.abs(ours.frames - theirs).max() <= 1e-5
    assert len(previews) == 2 and all(p[2] == 3 for p in previews)


def test_memory_estimate_traces_every_stage(ltx):
    _, folder, runner = ltx
    request = GenerationRequest(model=str(folder), prompt="a red circle", seed=1, steps=2,
                                guidance_scale=3.0, width=96, height=64, mode="t2v",
                                num_frames=9)
    est = runner.memory_estimate(request)
    assert set(est.weights) == {"text_encode", "denoise", "decode"}
    assert all(v > 0 for v in est.weights.values())
    assert all(v > 0 for v in est.activations.values())
    assert est.notes == (), est.notes  # every stage traced on fake tensors, none guessed


def test_every_profile_runs_and_the_cache_forecasts(ltx):
    """Every profile runs; the cache skips steps under ``fast``; ``exact`` is the uncached
    output. LTX-2's blocks carry a video and an audio stream: the cache forecasts both (it
    once handed the text stream on as audio)."""
    _, folder, runner = ltx
    outputs, notes = {}, {}
    for profile in ("exact", "quality", "balanced", "fast"):
        request = GenerationRequest(model=str(folder), prompt="a red circle", seed=1, steps=10,
                                    guidance_scale=3.0, width=64, height=64, mode="t2v",
                                    num_frames=9, optimization=OptimizationSettings(profile))
        out = runner.run(request, {}, lambda *a: None)
        outputs[profile] = out.frames
        notes[profile] = [n for n in out.notes if n.startswith("step cache:")]
    assert notes["exact"] == []
    forecast = int(re.findall(r"(\d+) forecast", notes["fast"][0])[0])
    assert forecast > 0, notes["fast"]
    for profile, frames in outputs.items():
        assert frames.shape == outputs["exact"].shape and np.isfinite(frames).all(), profile
    assert not np.array_equal(outputs["fast"], outputs["exact"])  # steps really were skipped


def test_newer_ltx_vaes_load_and_keep_their_stated_compression(tmp_path):
    """LTX-Video 0.9.1+ VAEs condition their decoder on a timestep (the preview fit and the
    memory estimate decode without the pipeline, and passed none: a TypeError at load), and
    0.9.5's says its compression (32, 8) outright, which its four scaling stages would read
    as 64 and 16."""
    from studio.engine.models.families import _ltx_caps

    folder = build_tiny_ltx(tmp_path / "ltx", timestep_conditioning=True)
    entry = ModelRegistry(include_hf_cache=False).resolve(str(folder))
    runner = runner_class(entry.family)(entry, torch.device("cpu"), torch.float32)
    assert runner.preview is not None
    request = GenerationRequest(mode="t2v", model=str(folder), prompt="a cat", seed=1,
                                steps=2, guidance_scale=3.0, width=64, height=64,
                                num_frames=9)
    assert "decode" in runner.memory_estimate(request).activations
    assert not any("decode" in n for n in runner.memory_estimate(request).notes)

    stated = tmp_path / "stated"
    (stated / "vae").mkdir(parents=True)
    (stated / "transformer").mkdir()
    (stated / "vae" / "config.json").write_text(json.dumps({
        "spatio_temporal_scaling": [True, True, True, True], "patch_size": 4,
        "patch_size_t": 1, "spatial_compression_ratio": 32, "temporal_compression_ratio": 8}))
    (stated / "transformer" / "config.json").write_text(json.dumps(
        {"patch_size": 1, "num_layers": 28}))
    caps = _ltx_caps(stated, {}, "ltx-0.9.5")
    assert (caps.spatial_multiple, caps.frame_multiple) == (32, 8)
    assert caps.default_width % 32 == 0 and (caps.default_frames - 1) % 8 == 0
