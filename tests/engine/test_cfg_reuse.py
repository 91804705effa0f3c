"""Guidance reuse on a tiny Wan pipeline (separate cond/uncond calls): interval 1 is stock,
interval 2 computes the unconditional branch on every other step after the warm-up and
forecasts it otherwise; state never leaks between jobs; it composes with the step cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from studio.engine.caching.cfg_reuse import (
    CfgReuseConfig,
    apply_cfg_reuse,
    remove_cfg_reuse,
    reset_cfg_reuse,
)


@pytest.fixture(scope="module")
def pipe(tiny_models):
    import diffusers

    pipe = diffusers.WanPipeline.from_pretrained(str(tiny_models["wan-t2v"]),
                                                 local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def generate(pipe, steps=8, seed=0):
    calls = []  # denoiser calls that really ran (counted inside, at the first block)
    handle = pipe.transformer.blocks[0].register_forward_pre_hook(lambda m, a: calls.append(1))
    try:
        with torch.inference_mode():
            out = pipe("a red circle", num_inference_steps=steps, height=32, width=32,
                       num_frames=5, guidance_scale=4.0, output_type="np",
                       generator=torch.Generator().manual_seed(seed))
    finally:
        handle.remove()
    return np.asarray(out.frames), len(calls)


def test_config_ranges_are_checked():
    for bad in (dict(interval=0), dict(interval=9), dict(warmup_steps=-1), dict(order=3),
                dict(interval=True)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            CfgReuseConfig(**bad)


def test_interval_one_is_stock_and_two_halves_the_unconditional_calls(pipe):
    stock, calls = generate(pipe)
    assert calls == 16  # 8 steps × 2 branches
    stats = apply_cfg_reuse(pipe.transformer, CfgReuseConfig(interval=1))
    same, _ = generate(pipe)
    assert np.array_equal(same, stock) and (stats.computed, stats.reused) == (8, 0)
    stats = apply_cfg_reuse(pipe.transformer, CfgReuseConfig(interval=2, warmup_steps=3))
    reused, calls = generate(pipe)
    # steps 1-3 warm up; then steps 5 and 7 compute, 4, 6 and 8 reuse
    assert [r for _, r in stats.decisions] == [False] * 3 + [True, False, True, False, True]
    assert (stats.computed, stats.reused, calls) == (5, 3, 13)
    assert np.isfinite(reused).all()
    # close to stock, not equal: a forecast, not a copy
    assert 0 < np.abs(reused - stock).max() < 0.25
    # a second job starts a fresh trajectory (the timestep went back up): same decisions
    again, _ = generate(pipe)
    assert np.array_equal(again, reused)
    reset_cfg_reuse(pipe.transformer)
    remove_cfg_reuse(pipe.transformer)
    assert np.array_equal(generate(pipe)[0], stock)


def test_composes_with_the_step_cache_as_the_outer_hook(pipe):
    from studio.engine.caching import StepCacheConfig, apply_step_cache, remove_step_cache

    cache = apply_step_cache(pipe.transformer, StepCacheConfig(threshold=0.0))
    reuse = apply_cfg_reuse(pipe.transformer, CfgReuseConfig(interval=2, warmup_steps=3))
    out, calls = generate(pipe)
    assert calls == 13 and reuse.reused == 3
    assert cache.calls == 13  # reused unconditional calls never reach the cache
    remove_cfg_reuse(pipe.transformer)
    remove_step_cache(pipe.transformer)
    alone = apply_cfg_reuse(pipe.transformer, CfgReuseConfig(interval=2, warmup_steps=3))
    assert np.array_equal(generate(pipe)[0], out)  # an exact cache changes nothing
    assert alone.reused == 3
    remove_cfg_reuse(pipe.transformer)
