"""Wan VACE through the registry: text-to-video, reference-to-video (reference images) and
image-to-video (a kept first control frame) on a tiny random-weight pipeline give stock
diffusers' pixels."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from studio.core.media import pixels_content_id
from studio.core.request import GenerationRequest, MediaRef
from studio.engine.executor import runner_class
from studio.engine.models.registry import ModelRegistry
from studio.testing.tiny_pipelines import build_tiny_wan_vace

IMAGE = (np.random.default_rng(9).random((32, 32, 3)) * 255).astype(np.uint8)
REF = MediaRef(pixels_content_id(IMAGE), "ref.png")


@pytest.fixture(scope="module")
def vace(tmp_path_factory):
    folder = build_tiny_wan_vace(tmp_path_factory.mktemp("vace") / "vace")
    entry = ModelRegistry(include_hf_cache=False).resolve(str(folder))
    assert entry.family == "wan-vace" and entry.usable, entry.error
    assert entry.capabilities.modes == {"t2v", "t2i", "i2v", "r2v"}
    return folder, runner_class(entry.family)(entry, torch.device("cpu"), torch.float32)


def conditioning(mode):
    image = Image.fromarray(IMAGE)
    if mode == "r2v":
        return {"references": (REF,)}, {"reference_images": [image]}
    if mode == "i2v":
        grey, size = (128, 128, 128), (32, 32)
        return {"first_frame": REF}, {
            "video": [image] + [Image.new("RGB", size, grey)] * 4,
            "mask": [Image.new("L", size, 0)] + [Image.new("L", size, 255)] * 4}
    return {}, {}


@pytest.mark.parametrize("mode", ["t2v", "r2v", "i2v"])
def test_same_pixels_as_stock_diffusers(vace, mode):
    import diffusers

    folder, runner = vace
    fields, extra = conditioning(mode)
    request = GenerationRequest(model=str(folder), prompt="a red circle on grass",
                                negative_prompt="blurry", seed=6, steps=2, guidance_scale=4.0,
                                width=32, height=32, mode=mode, num_frames=5, **fields)
    assert request.validate(runner.entry.capabilities) == []
    ours = runner.run(request, {REF.content_id: IMAGE}, lambda *a: None)
    pipe = diffusers.WanVACEPipeline.from_pretrained(folder, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    theirs = np.asarray(pipe(prompt=request.prompt, negative_prompt="blurry", height=32,
                             width=32, num_frames=5, num_inference_steps=2, guidance_scale=4.0,
                             generator=torch.Generator().manual_seed(6), output_type="np",
                             **extra).frames[0], dtype=np.float32)
    assert ours.frames.shape == theirs.shape == (5, 32, 32, 3)
    assert np.abs(ours.frames - theirs).max() <= 1e-5


def test_vace_runs_every_profile_without_the_step_cache(vace):
    from studio.core.request import OptimizationSettings

    folder, runner = vace
    request = GenerationRequest(model=str(folder), prompt="a red circle", seed=1, steps=4,
                                guidance_scale=4.0, width=32, height=32, mode="t2v",
                                num_frames=5, optimization=OptimizationSettings("fast"))
    out = runner.run(request, {}, lambda *a: None)
    assert np.isfinite(out.frames).all()
    assert any("adds VACE control hints" in n for n in out.notes)
