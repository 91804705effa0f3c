"""Modes beyond stock pipelines: masked image-to-image and reference-to-video."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from studio.core.media import pixels_content_id
from studio.core.request import GenerationRequest, MediaRef
from studio.engine.executor import runner_class
from studio.engine.models.registry import ModelRegistry


@pytest.fixture(scope="module")
def runner():
    entry = ModelRegistry(include_hf_cache=False).resolve("embedded")
    assert {"r2v", "i2i"} <= entry.capabilities.modes and entry.capabilities.supports_mask
    return runner_class(entry.family)(entry, torch.device("cpu"), torch.float32)


def image(seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).random((64, 64, 3)) * 255).astype(np.uint8)


def ref(pixels) -> MediaRef:
    return MediaRef(pixels_content_id(pixels))


def base(**kw) -> GenerationRequest:
    fields = dict(model="embedded", prompt="a small object moves left on grass", seed=3,
                  steps=4, guidance_scale=4.0, width=64, height=64)
    fields.update(kw)
    return GenerationRequest(**fields)


def test_masked_image_to_image_keeps_pixels_outside_the_mask(runner):
    init = image(1)
    mask = np.zeros((64, 64), np.uint8)
    mask[16:48, 16:48] = 255
    req = base(mode="i2i", init_image=ref(init), mask=ref(mask), strength=0.9)
    assert req.validate(runner.entry.capabilities) == []
    out = runner.run(req, {ref(init).content_id: init, ref(mask).content_id: mask},
                     lambda *a: None).frames[0]
    outside = mask < 128
    assert np.abs(out[outside] - init[outside] / 255.0).max() < 1e-6
    assert np.abs(out[~outside] - init[~outside] / 255.0).mean() > 0.02
    unmasked = runner.run(base(mode="i2i", init_image=ref(init), strength=0.9),
                          {ref(init).content_id: init}, lambda *a: None).frames[0]
    assert np.abs(unmasked[outside] - init[outside] / 255.0).mean() > 0.02


def test_reference_to_video_conditions_on_the_reference(runner):
    a, b = image(5), image(6)
    outs = []
    seen = []
    transformer = runner.pipes["t2v"].transformer
    spy = transformer.register_forward_hook(
        lambda m, args, kwargs, out: seen.append((kwargs["hidden_states"].shape,
                                                  kwargs["timestep"][0, -1].item(),
                                                  out[0].shape)), with_kwargs=True)
    for pixels in (a, b, a):
        req = base(mode="r2v", num_frames=9, references=(ref(pixels),))
        assert req.validate(runner.entry.capabilities) == []
        outs.append(runner.run(req, {ref(pixels).content_id: pixels}, lambda *x: None).frames)
    assert outs[0].shape == (9, 64, 64, 3)  # the reference frame is not part of the output
    assert np.array_equal(outs[0], outs[2])  # deterministic
    assert np.abs(outs[0] - outs[1]).max() > 0  # the reference reaches the pixels
    spy.remove()
    # the denoiser saw 3 video latent frames + 1 reference frame at timestep 0
    assert seen and all(s[0][2] == 4 and s[1] == 0.0 for s in seen)
    assert not transformer._forward_pre_hooks and not transformer._forward_hooks
