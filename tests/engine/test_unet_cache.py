"""The deep-feature cache on a tiny real SD 1.5 / SDXL UNet, and every SD family under every
profile through the runner."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from diffusers import StableDiffusionPipeline

from studio.core.request import GenerationRequest, OptimizationSettings
from studio.engine.caching import StepCacheConfig
from studio.engine.caching.unet_cache import apply_unet_cache, remove_unet_cache
from studio.engine.executor import runner_class
from studio.engine.models.registry import ModelRegistry
from studio.testing.tiny_pipelines import build_tiny_sd

ALTERNATE = StepCacheConfig(threshold=10.0, order=1, warmup_steps=2, max_consecutive_skips=1)


@pytest.fixture(scope="module")
def sd_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("sd-cache")
    return {v: build_tiny_sd(root / v, variant=v) for v in ("sd15", "sdxl", "sd3")}


def run(pipe, seed=0, prompt="a red circle"):
    return pipe(prompt, num_inference_steps=8, height=64, width=64, guidance_scale=5.0,
                generator=torch.Generator().manual_seed(seed), output_type="np").images


def test_unet_cache_exact_at_zero_and_skips_the_deep_path(sd_models):
    pipe = StableDiffusionPipeline.from_pretrained(sd_models["sd15"], local_files_only=True,
                                                   safety_checker=None,
                                                   requires_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    unet = pipe.unet
    base = run(pipe)
    stats = apply_unet_cache(unet, StepCacheConfig(threshold=0.0))
    np.testing.assert_array_equal(run(pipe), base)
    assert stats.skipped_calls == 0 and stats.full_calls == 8
    deep, shallow = [0], [0]
    unet.mid_block.attentions[0].register_forward_pre_hook(
        lambda *_: deep.__setitem__(0, deep[0] + 1))
    unet.up_blocks[-1].resnets[0].register_forward_pre_hook(
        lambda *_: shallow.__setitem__(0, shallow[0] + 1))
    stats = apply_unet_cache(unet, ALTERNATE)
    out = run(pipe)
    assert stats.skipped_calls == 3 and stats.full_calls == 5
    assert deep[0] == 5 and shallow[0] == 8  # the shallow path runs every step
    assert np.isfinite(out).all() and not np.array_equal(out, base)
    again = run(pipe)  # a new trajectory starts clean
    np.testing.assert_array_equal(again, out)
    remove_unet_cache(unet)
    np.testing.assert_array_equal(run(pipe), base)


@pytest.mark.parametrize("model", ["sd15", "sdxl", "sd3"])
def test_every_sd_family_runs_under_every_profile(sd_models, model):
    folder = sd_models[model]
    entry = ModelRegistry(include_hf_cache=False).resolve(str(folder))
    runner = runner_class(entry.family)(entry, torch.device("cpu"), torch.float32)
    results = {}
    for profile in ("exact", "quality", "fast", "balanced", "exact", "balanced"):
        request = GenerationRequest(model=str(folder), prompt="a red circle", seed=4,
                                    steps=10, guidance_scale=5.0, width=64, height=64,
                                    mode="t2i", optimization=OptimizationSettings(profile))
        out = runner.run(request, {}, lambda *a: None)
        assert np.isfinite(out.frames).all()
        if profile in results:  # the same profile again: the same pixels
            np.testing.assert_array_equal(out.frames, results[profile])
        if profile != "exact":
            assert any("denoiser calls computed in full" in n for n in out.notes), out.notes
        results[profile] = out.frames
