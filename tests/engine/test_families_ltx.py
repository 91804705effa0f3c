"""LTX-Video through the registry: text-to-video, text-to-image (one frame) and
image-to-video on a tiny random-weight pipeline give stock diffusers' pixels; the step
previews unpack LTX's token-sequence latents; every profile runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from studio.core.media import pixels_content_id
from studio.core.request import GenerationRequest, MediaRef, OptimizationSettings
from studio.engine.executor import runner_class
from studio.engine.models.registry import ModelRegistry
from studio.testing.tiny_pipelines import build_tiny_ltx

IMAGE = (np.random.default_rng(5).random((64, 96, 3)) * 255).astype(np.uint8)
REF = MediaRef(pixels_content_id(IMAGE), "first.png")


@pytest.fixture(scope="module")
def ltx(tmp_path_factory):
    folder = build_tiny_ltx(tmp_path_factory.mktemp("ltx") / "ltx")
    entry = ModelRegistry(include_hf_cache=False).resolve(str(folder))
    assert entry.family == "ltx" and entry.usable, entry.error
    return folder, runner_class(entry.family)(entry, torch.device("cpu"), torch.float32)


def stock(cls_name, folder, **kwargs):
    import diffusers

    pipe = getattr(diffusers, cls_name).from_pretrained(folder, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return np.asarray(pipe(generator=torch.Generator().manual_seed(kwargs.pop("seed")),
                           output_type="np", **kwargs).frames[0], dtype=np.float32)


@pytest.mark.parametrize("mode,cls_name,frames,extra", [
    ("t2v", "LTXPipeline", 9, {}),
    ("t2i", "LTXPipeline", 1, {}),
    ("i2v", "LTXImageToVideoPipeline", 9, {"image": Image.fromarray(IMAGE)})])
def test_same_pixels_as_stock_diffusers(ltx, mode, cls_name, frames, extra):
    folder, runner = ltx
    fields = {"first_frame": REF} if mode == "i2v" else {}
    request = GenerationRequest(model=str(folder), prompt="a red circle on grass",
                                negative_prompt="blurry", seed=2, steps=2, guidance_scale=3.0,
                                width=96, height=64, mode=mode, num_frames=frames, fps=24.0,
                                **fields)
    assert request.validate(runner.entry.capabilities) == []
    previews = []
    ours = runner.run(request, {REF.content_id: IMAGE},
                      lambda i, n, lat: previews.append(runner.preview(lat).shape))
    theirs = stock(cls_name, folder, prompt=request.prompt, negative_prompt="blurry", seed=2,
                   num_inference_steps=2, guidance_scale=3.0, height=64, width=96,
                   num_frames=frames, frame_rate=24, max_sequence_length=128, **extra)
    assert ours.frames.shape == theirs.shape == (frames, 64, 96, 3)
    assert np.abs(ours.frames - theirs).max() <= 1e-5
    assert len(previews) == 2 and all(p[2] == 3 for p in previews)


def test_ltx_runs_under_every_profile(ltx):
    folder, runner = ltx
    for profile in ("fast", "balanced", "quality", "exact"):
        request = GenerationRequest(model=str(folder), prompt="a red circle", seed=1, steps=8,
                                    guidance_scale=3.0, width=64, height=64, mode="t2v",
                                    num_frames=9, optimization=OptimizationSettings(profile))
        out = runner.run(request, {}, lambda *a: None)
        assert np.isfinite(out.frames).all()
        if profile != "exact":
            assert any("denoiser calls computed in full" in n for n in out.notes), out.notes
