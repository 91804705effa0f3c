"""Guidance reuse on a tiny Wan pipeline (separate cond/uncond calls): interval 1 is stock,
interval 2 computes the unconditional branch on every other step after the warm-up and
forecasts it otherwise; state never leaks between jobs; it composes with the step cache."""

from __future__ import annotations

import re

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


def test_a_profile_turns_guidance_reuse_on_from_the_models_tuning(tiny_models, tmp_path):
    """A model's studio.json turns guidance reuse on for a profile (as `python -m bench
    calibrate --write` does): the runner forecasts unconditional calls under that profile and
    says so; `exact` afterwards is the stock output again (the hook is removed); a bad
    setting is refused naming the field; under CFG parallelism it is off, with a note."""
    import json
    import shutil

    from diffusers.hooks import HookRegistry, ModelHook

    from studio.core.request import GenerationRequest, OptimizationSettings
    from studio.engine.executor import runner_class
    from studio.engine.models.registry import ModelRegistry
    from studio.engine.profiles import apply_levers, levers_for

    folder = tmp_path / "wan"
    shutil.copytree(tiny_models["wan-t2v"], folder)
    tuning = {"guidance_reuse": {"balanced": {"interval": 2, "warmup_steps": 2}}}
    (folder / "studio.json").write_text(json.dumps(tuning))
    entry = ModelRegistry(include_hf_cache=False).resolve(str(folder))
    runner = runner_class(entry.family)(entry, torch.device("cpu"), torch.float32)

    def run(profile):
        request = GenerationRequest(model=str(folder), prompt="a red circle", seed=4, steps=8,
                                    guidance_scale=4.0, width=32, height=32, mode="t2v",
                                    num_frames=5, optimization=OptimizationSettings(profile))
        return runner.run(request, {}, lambda *a: None)

    stock = run("exact")
    balanced = run("balanced")
    assert any("guidance reuse (unconditional branch every 2 steps after 2)" in n
               for n in balanced.notes), balanced.notes
    [note] = [n for n in balanced.notes if n.startswith("guidance reuse:")]
    computed, total, forecast = map(int, re.findall(r"\d+", note))
    assert forecast > 0 and computed + forecast == total == 8
    assert not any(n.startswith("guidance reuse") for n in run("quality").notes)
    again = run("exact")
    np.testing.assert_array_equal(again.frames, stock.frames)
    with pytest.raises(ValueError, match="studio.json guidance_reuse.fast: interval: 0"):
        levers_for("fast", "cpu", {"guidance_reuse": {"fast": {"interval": 0}}})

    class Marker(ModelHook):
        pass

    transformer = runner.denoisers()[0]
    HookRegistry.check_if_exists_or_initialize(transformer).register_hook(
        Marker(), "studio_cfg_parallel")
    notes = apply_levers([transformer], levers_for("balanced", "cpu", tuning))
    assert "guidance reuse: off under CFG parallelism (each rank computes one branch)" in notes
    assert transformer._studio_cfg_reuse is None
