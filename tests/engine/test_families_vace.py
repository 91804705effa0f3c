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


def test_vace_runs_the_fast_profile_with_the_step_cache(vace):
    import re

    from studio.core.request import OptimizationSettings

    folder, runner = vace
    request = GenerationRequest(model=str(folder), prompt="a red circle", seed=1, steps=10,
                                guidance_scale=4.0, width=32, height=32, mode="t2v",
                                num_frames=5, optimization=OptimizationSettings("fast"))
    out = runner.run(request, {}, lambda *a: None)
    assert np.isfinite(out.frames).all()
    [note] = [n for n in out.notes if n.startswith("step cache:")]
    assert int(re.findall(r"(\d+) forecast", note)[0]) > 0, note


def test_step_cache_on_vace_forecasts_the_hints_once(vace):
    """The cache on Wan VACE: the first VACE block probes, a skipped step zeroes the hints
    and skips every VACE and main block, and the main blocks' forecast residual carries the
    hints (they must not count twice). Called twice on the same input at nearly the same
    timestep, the skipped call's output equals a full computation; at threshold 0 the cache
    is exact."""
    from studio.engine.caching import StepCacheConfig, apply_step_cache, remove_step_cache

    folder, runner = vace
    transformer = runner.base.transformer
    g = torch.Generator().manual_seed(0)
    kwargs = dict(hidden_states=torch.randn(1, 16, 2, 4, 4, generator=g),
                  encoder_hidden_states=torch.randn(1, 7, 32, generator=g),
                  control_hidden_states=torch.randn(1, 16 * 2 + 8 * 8, 2, 4, 4, generator=g),
                  return_dict=False)

    def call(t):
        return transformer(timestep=torch.tensor([t]), **kwargs)[0]

    with torch.inference_mode():
        full = [call(500.0), call(499.99)]
        stats = apply_step_cache(transformer, StepCacheConfig(threshold=0.0))
        exact = [call(500.0), call(499.99)]
        assert stats.skipped_calls == 0
        stats = apply_step_cache(transformer, StepCacheConfig(
            threshold=10.0, order=0, warmup_steps=1, max_consecutive_skips=1))
        cached = [call(500.0), call(499.99)]
        remove_step_cache(transformer)
    assert (stats.full_calls, stats.skipped_calls) == (1, 1)
    for a, b in zip(exact, full, strict=True):
        assert torch.equal(a, b)
    assert torch.equal(cached[0], full[0])
    hint_scale = (full[1] - cached[1]).abs().max()
    assert hint_scale < 1e-3 * full[1].abs().max(), hint_scale  # a hint counted twice is O(1)
