"""The forecast step cache on tiny real diffusers transformers (Wan, Flux).

What must hold: threshold 0 / the exact profile is bit-identical to no cache; a skipped step
really skips the deep blocks (their attention never runs); state never leaks between jobs,
between the conditional and unconditional branches, or between the items of a batch; every
tiny family model runs under every profile through the engine.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch
from diffusers import FluxPipeline, WanPipeline

from studio.core.media import pixels_content_id
from studio.core.request import PROFILES, GenerationRequest, MediaRef, OptimizationSettings
from studio.engine.caching import (
    StepCacheConfig,
    apply_step_cache,
    remove_step_cache,
    reset_step_cache,
)
from studio.engine.caching.forecast import forecast
from studio.engine.caching.step_cache import transformer_blocks
from studio.engine.executor import runner_class
from studio.engine.models.registry import ModelRegistry
from studio.engine.profiles import levers_for, profile_table

# a data-independent schedule: 2 full steps, then skip, full, skip, full...
ALTERNATE = StepCacheConfig(threshold=10.0, order=1, warmup_steps=2, max_consecutive_skips=1)
# the same schedule, decided from the first block's modulated input (no block runs when skipped)
ALTERNATE_INPUT = dataclasses.replace(ALTERNATE, signal="input")
# and skipping the whole denoiser call, its output forecast (3 full steps first: the error
# estimate needs them)
ALTERNATE_OUTPUT = dataclasses.replace(ALTERNATE, signal="output", warmup_steps=3)
SCHEDULES = pytest.mark.parametrize("config", [ALTERNATE, ALTERNATE_INPUT, ALTERNATE_OUTPUT],
                                    ids=["block-signal", "input-signal", "output-signal"])


# -- forecast -----------------------------------------------------------------------------
def test_forecast_is_exact_for_polynomials_up_to_its_order():
    ts = [900.0, 700.0, 620.0]
    a, b, c = torch.randn(3, 4, 5).unbind(0)

    def quad(t):
        return a + b * t / 1000 + c * (t / 1000) ** 2

    def line(t):
        return a + b * t / 1000

    torch.testing.assert_close(forecast(ts, [line(t) for t in ts], 410.0, 1), line(410.0))
    torch.testing.assert_close(forecast(ts, [quad(t) for t in ts], 410.0, 2), quad(410.0))
    # order 1 on a curved path is not exact; order 0 is plain reuse of the newest value
    assert not torch.allclose(forecast(ts, [quad(t) for t in ts], 410.0, 1), quad(410.0))
    assert forecast(ts, [quad(t) for t in ts], 410.0, 0) is not None
    torch.testing.assert_close(forecast(ts, [quad(t) for t in ts], 410.0, 0), quad(620.0))
    # fewer points than the order asks: the highest order the points allow
    torch.testing.assert_close(forecast(ts[-2:], [line(t) for t in ts[-2:]], 100.0, 2),
                               line(100.0))


def test_forecast_and_config_reject_bad_input():
    with pytest.raises(ValueError, match="as many times as values"):
        forecast([1.0, 2.0], [torch.zeros(2)], 0.0, 1)
    with pytest.raises(ValueError, match="threshold"):
        StepCacheConfig(threshold=-1)
    with pytest.raises(ValueError, match="order"):
        StepCacheConfig(order=3)
    with pytest.raises(ValueError, match="max_consecutive_skips"):
        StepCacheConfig(max_consecutive_skips=-2)
    with pytest.raises(ValueError, match="optimization.profile"):
        levers_for("turbo")


def test_output_error_estimate_is_exact_for_quadratics():
    """The remainder estimate of linear extrapolation is the true error when the values
    are a quadratic in t (their second divided difference is then constant)."""
    from studio.engine.caching.step_cache import forecast_error_estimate

    a, b, c = torch.randn(3, 2, 6).unbind(0)
    ts = [950.0, 820.0, 700.0]

    def quad(t):
        return a + b * (t / 1000) + c * (t / 1000) ** 2

    at = 580.0
    error = forecast(ts, [quad(t) for t in ts], at, 1) - quad(at)
    want = float((error.abs().sum(1) / quad(ts[-1]).abs().sum(1)).max())
    got = forecast_error_estimate(ts, [quad(t) for t in ts], at)
    assert got == pytest.approx(want, rel=1e-4)
    # a straight line: nothing to fear from extrapolating it
    assert forecast_error_estimate(ts, [a + b * t for t in ts], at) == pytest.approx(0, abs=1e-5)
    with pytest.raises(ValueError, match="need 3"):
        forecast_error_estimate(ts[:2], [a, b], at)


def test_the_output_signal_returns_the_forecast_output_and_skips_by_estimated_error():
    """On a denoiser whose output is a fixed function of t: a skipped call returns the
    linear extrapolation of the last two full outputs; a threshold under every estimated
    error never skips; the decisions respect the warm-up and the skip limit."""
    from diffusers import ModelMixin

    class Curved(ModelMixin):
        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.ones(1))
            self.calls = 0

        def forward(self, hidden_states, timestep, return_dict=False):
            self.calls += 1
            s = timestep.float().view(-1, 1) / 1000
            return (hidden_states * self.scale + s + 3 * s ** 2,)

    x = torch.randn(2, 5)
    times = [999.0, 950.0, 880.0, 800.0, 700.0, 590.0, 470.0, 340.0, 200.0, 60.0]
    for threshold, expect_skips in ((1e-9, False), (10.0, True)):
        model = Curved()
        stats = apply_step_cache(model, StepCacheConfig(threshold=threshold, signal="output",
                                                        warmup_steps=3,
                                                        max_consecutive_skips=2))
        history, outs = [], []
        with torch.no_grad():
            for t in times:
                outs.append(model(x, torch.tensor([t]))[0])
                history.append((t, model.calls))
        remove_step_cache(model)
        flags = [computed for *_, computed in stats.decisions]
        assert flags[:3] == [True, True, True]
        assert "FFF" not in "".join("T" if f else "F" for f in flags)
        assert (stats.skipped_calls > 0) == expect_skips
        assert model.calls == stats.full_calls
        full = [(t, o) for (t, _), o, f in zip(history, outs, flags, strict=True) if f]
        for (t, _), out, computed in zip(history, outs, flags, strict=True):
            if computed:
                torch.testing.assert_close(out, x + t / 1000 + 3 * (t / 1000) ** 2)
            else:
                (t2, o2), (t1, o1) = [p for p in full if p[0] > t][-2:]
                torch.testing.assert_close(out, o1 + (o1 - o2) * (t - t1) / (t1 - t2))


# -- on pipelines -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def wan(tiny_models):
    pipe = WanPipeline.from_pretrained(tiny_models["wan-t2v"], local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module")
def flux(tiny_models):
    pipe = FluxPipeline.from_pretrained(tiny_models["flux"], local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def run_wan(pipe, prompt="a red circle", seed=0, steps=8, guidance=4.0, batch=None):
    kwargs = dict(num_frames=5, height=32, width=32, guidance_scale=guidance,
                  num_inference_steps=steps, output_type="np")
    if batch:
        gens = [torch.Generator().manual_seed(s) for s in batch]
        return pipe([prompt] * len(batch), generator=gens, **kwargs).frames
    return pipe(prompt, generator=torch.Generator().manual_seed(seed), **kwargs).frames[0]


def run_flux(pipe, seed=0, steps=8):
    return pipe("a red circle", generator=torch.Generator().manual_seed(seed), height=32,
                width=32, num_inference_steps=steps, output_type="np").images[0]


def count_attention(blocks) -> list[int]:
    """Counts forward calls of the self-attention inside ``blocks``."""
    counter = [0]
    for block in blocks:
        attn = getattr(block, "attn1", None) or block.attn
        attn.register_forward_pre_hook(lambda *_: counter.__setitem__(0, counter[0] + 1))
    return counter


def test_threshold_zero_is_bit_identical_to_no_cache(wan, flux):
    base_wan, base_flux = run_wan(wan), run_flux(flux)
    for pipe, run, base in ((wan, run_wan, base_wan), (flux, run_flux, base_flux)):
        stats = apply_step_cache(pipe.transformer, StepCacheConfig(threshold=0.0))
        try:
            out = run(pipe)
        finally:
            remove_step_cache(pipe.transformer)
        assert stats.skipped_calls == 0 and stats.full_calls > 0
        np.testing.assert_array_equal(out, base)
    np.testing.assert_array_equal(run_wan(wan), base_wan)  # removed: stock again


@pytest.mark.parametrize("name", ["wan", "flux"])
@SCHEDULES
def test_skipped_steps_do_not_run_the_blocks(name, config, wan, flux):
    """A skipped call runs none of the deep blocks; on the input and output signals not even
    the first."""
    pipe, run = (wan, run_wan) if name == "wan" else (flux, run_flux)
    model = copy.deepcopy(pipe.transformer)
    original, pipe.transformer = pipe.transformer, model
    blocks = transformer_blocks(model)
    counted = blocks if config.signal in ("input", "output") else blocks[1:]
    try:
        base = run(pipe)
        counter = count_attention(counted)
        stats = apply_step_cache(model, config)
        out = run(pipe)
        attention_calls = counter[0]
        remove_step_cache(model)
        np.testing.assert_array_equal(run(pipe), base)  # removed: stock again
    finally:
        pipe.transformer = original
    assert stats.skipped_calls > 0
    # every full call runs each counted block's attention once; skipped calls run none
    assert attention_calls == stats.full_calls * len(counted)
    assert np.isfinite(out).all() and not np.array_equal(out, base)


@pytest.mark.parametrize("name", ["wan", "flux"])
def test_the_input_signal_is_what_the_first_block_feeds_its_attention(name, wan, flux):
    """The modulated input read by the cache equals the first block's own: Wan's
    ``norm1(x) * (1 + scale) + shift`` as attn1 receives it, Flux's AdaLayerNormZero output."""
    from studio.engine.caching.step_cache import modulated_input

    model = (wan if name == "wan" else flux).transformer
    block = transformer_blocks(model)[0]
    seen = {}
    if name == "wan":
        hook = block.attn1.register_forward_pre_hook(
            lambda m, args: seen.update(x=seen.get("x", args[0])))
    else:
        hook = block.norm1.register_forward_hook(
            lambda m, args, out: seen.update(x=seen.get("x", out[0])))
    calls = []
    capture = block.register_forward_pre_hook(
        lambda m, args, kwargs: calls.append((args, kwargs)), with_kwargs=True)
    try:
        (run_wan(wan, steps=1) if name == "wan" else run_flux(flux, steps=1))
    finally:
        hook.remove()
        capture.remove()
    args, kwargs = calls[0]
    hidden = args[0] if args else kwargs["hidden_states"]
    signal = modulated_input(block, args, kwargs, hidden)
    torch.testing.assert_close(signal, seen["x"].float(), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(signal, hidden.float())


def test_the_input_signal_skips_only_while_the_input_barely_changes(wan):
    """Threshold 0.05 on the input signal skips some calls, never more in a row than allowed;
    a threshold above every change skips as many as max_consecutive_skips allow."""
    model = wan.transformer
    runs = {}
    for threshold in (0.05, 10.0):
        stats = apply_step_cache(model, StepCacheConfig(threshold=threshold, signal="input",
                                                        warmup_steps=2, max_consecutive_skips=2))
        try:
            run_wan(wan, steps=12)
        finally:
            remove_step_cache(model)
        runs[threshold] = stats
    assert runs[10.0].skipped_calls > runs[0.05].skipped_calls
    for stats in runs.values():
        per_branch = {}
        for context, _, _, computed in stats.decisions:
            per_branch.setdefault(context, []).append(computed)
        for flags in per_branch.values():
            assert flags[:2] == [True, True]  # the warm-up
            assert "FFF" not in "".join("T" if f else "F" for f in flags)


@SCHEDULES
def test_no_leak_between_jobs(wan, config):
    model = wan.transformer
    apply_step_cache(model, config)
    try:
        first = run_wan(wan, prompt="a blue square", seed=3)
        after_other = run_wan(wan, prompt="a red circle", seed=5)
        reset_step_cache(model)
        fresh = run_wan(wan, prompt="a red circle", seed=5)
        # even without an explicit reset, a new trajectory starts clean
        again = run_wan(wan, prompt="a red circle", seed=5)
    finally:
        remove_step_cache(model)
    np.testing.assert_array_equal(after_other, fresh)
    np.testing.assert_array_equal(again, fresh)
    assert not np.array_equal(first, fresh)


@SCHEDULES
def test_no_leak_between_cfg_branches(wan, config):
    """Each branch under one cache gives what a cache that only ever saw it gives."""
    torch.manual_seed(0)
    model = wan.transformer
    shared, cond_only, uncond_only = (copy.deepcopy(model) for _ in range(3))
    for m in (shared, cond_only, uncond_only):
        apply_step_cache(m, config)
    x = torch.randn(1, 16, 2, 4, 4)
    text_c, text_u = torch.randn(1, 8, 32), torch.randn(1, 8, 32)
    outputs = {"shared-c": [], "shared-u": [], "cond": [], "uncond": []}
    with torch.no_grad():
        for t in (999.0, 900.0, 780.0, 640.0, 500.0, 350.0, 200.0):
            step = torch.tensor([t])
            for key, m, ctx, text in (("shared-c", shared, "cond", text_c),
                                      ("shared-u", shared, "uncond", text_u),
                                      ("cond", cond_only, "cond", text_c),
                                      ("uncond", uncond_only, "uncond", text_u)):
                with m.cache_context(ctx):
                    outputs[key].append(m(x, step, text, return_dict=False)[0])
            x = x - 0.1 * outputs["cond"][-1]
    assert shared._studio_step_cache.skipped_calls > 0
    for a, b in (("shared-c", "cond"), ("shared-u", "uncond")):
        for got, want in zip(outputs[a], outputs[b], strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=0)


@SCHEDULES
def test_no_leak_between_batch_items(wan, config):
    """With a data-independent schedule, an item of a batch gets its solo result."""
    model = wan.transformer
    apply_step_cache(model, config)
    try:
        batch = run_wan(wan, batch=[1, 2], guidance=1.0)
        solo = [run_wan(wan, seed=s, guidance=1.0) for s in (1, 2)]
        swapped = run_wan(wan, batch=[2, 1], guidance=1.0)
    finally:
        remove_step_cache(model)
    for i in range(2):
        np.testing.assert_allclose(batch[i], solo[i], atol=2e-5)
        np.testing.assert_allclose(swapped[1 - i], solo[i], atol=2e-5)
    assert not np.allclose(solo[0], solo[1])


def test_profile_table_names_every_lever():
    table = profile_table()
    for profile in PROFILES:
        assert f"| {profile} | cpu |" in table and f"| {profile} | cuda |" in table
    assert "| exact | cpu | off |" in table


# -- through the engine -------------------------------------------------------------------
IMAGE = (np.random.default_rng(3).random((32, 32, 3)) * 255).astype(np.uint8)
REF = MediaRef(pixels_content_id(IMAGE), "test.png")
FAMILY_CASES = [("wan-t2v", dict(mode="t2v", num_frames=5)),
                ("wan-ti2v", dict(mode="i2v", num_frames=5, first_frame=REF)),
                ("wan-i2v", dict(mode="i2v", num_frames=5, first_frame=REF)),
                ("flux", dict(mode="t2i"))]


@pytest.mark.parametrize("model,fields", FAMILY_CASES, ids=[c[0] for c in FAMILY_CASES])
def test_every_family_runs_under_every_profile(tiny_models, model, fields):
    folder = tiny_models[model]
    entry = ModelRegistry(include_hf_cache=False).resolve(str(folder))
    runner = runner_class(entry.family)(entry, torch.device("cpu"), torch.float32)
    results = {}
    for profile in ("exact", "fast", "balanced", "quality", "exact"):
        request = GenerationRequest(model=str(folder), prompt="a red circle", seed=4,
                                    steps=10, guidance_scale=4.0, width=32, height=32,
                                    optimization=OptimizationSettings(profile), **fields)
        out = runner.run(request, {REF.content_id: IMAGE}, lambda *a: None)
        assert np.isfinite(out.frames).all()
        if profile == "exact":
            assert not any("step cache" in n for n in out.notes)
            if profile in results:  # back to exact after the cached profiles: stock again
                np.testing.assert_array_equal(out.frames, results[profile])
        else:
            assert any(n.startswith(f"profile {profile}: step cache") for n in out.notes)
            assert any("denoiser calls computed in full" in n for n in out.notes)
        results[profile] = out.frames


def test_performance_doc_holds_the_current_profile_table():
    from studio.paths import REPO_ROOT

    doc = (REPO_ROOT / "docs" / "PERFORMANCE.md").read_text()
    assert profile_table() in doc, "regenerate with: python -m studio.engine.profiles"


@pytest.mark.parametrize("order,warmup", [(0, 2), (0, 4), (1, 3), (2, 5)])
def test_the_warm_up_counts_full_steps_not_the_forecast_history(wan, order, warmup):
    """The history keeps order + 1 full steps; a longer warm-up must still end (it once did
    not: order 0, or the quality profile's warm-up 3 at order 1, never skipped)."""
    model = wan.transformer
    stats = apply_step_cache(model, StepCacheConfig(threshold=10.0, order=order,
                                                    warmup_steps=warmup,
                                                    max_consecutive_skips=1))
    try:
        run_wan(wan, steps=12)
    finally:
        remove_step_cache(model)
    flags = [computed for context, _, _, computed in stats.decisions if context == "cond"]
    assert flags[:warmup] == [True] * warmup
    assert flags[warmup:] == [False, True] * ((12 - warmup) // 2) + [False] * (warmup % 2)


def test_the_output_signal_goes_inside_cfg_parallel_and_leaves_it_in_place(wan):
    """Under CFG parallelism each rank must decide only for the branch it computes, so the
    output-signal cache goes inside the CFG-parallel hook (put on first, at load) and its
    removal leaves that hook working, outermost."""
    from diffusers.hooks import HookRegistry, ModelHook

    class Outer(ModelHook):  # stands in for CfgParallelHook: counts the calls it wraps
        def __init__(self):
            super().__init__()
            self.calls = 0

        def new_forward(self, module, *args, **kwargs):
            self.calls += 1
            return self.fn_ref.original_forward(*args, **kwargs)

    model = copy.deepcopy(wan.transformer)
    x, text = torch.randn(1, 16, 2, 4, 4), torch.randn(1, 8, 32)
    with torch.no_grad():  # the same module before any hook (a copy's float32 sums may
        want = model(x, torch.tensor([500.0]), text, return_dict=False)[0]  # differ by 1 ulp)
    registry = HookRegistry.check_if_exists_or_initialize(model)
    outer = Outer()
    registry.register_hook(outer, "studio_cfg_parallel")
    stats = apply_step_cache(model, ALTERNATE_OUTPUT)
    assert registry._hook_order[-1] == "studio_cfg_parallel"
    assert registry._hook_order.index("studio_step_cache_root") < len(registry._hook_order) - 1
    with torch.no_grad():
        for t in (999.0, 900.0, 780.0, 640.0, 500.0, 350.0):
            model(x, torch.tensor([t]), text, return_dict=False)
    assert outer.calls == 6 and stats.skipped_calls > 0
    remove_step_cache(model)
    assert registry._hook_order == ["studio_cfg_parallel"]
    with torch.no_grad():
        got = model(x, torch.tensor([500.0]), text, return_dict=False)[0]
    assert outer.calls == 7
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_job_takes_the_step_cache_setting_calibrated_nearest_its_schedule():
    from studio.engine.profiles import tuning_for_steps

    short = {"steps": 20, "signal": "output", "threshold": 0.002, "max_consecutive_skips": 2}
    long = {"steps": 50, "signal": "output", "threshold": 0.007, "max_consecutive_skips": 4}
    tuning = {"step_cache": {"fast": [short, long], "balanced": {"threshold": 0.3}}}
    assert levers_for("fast", "cpu", tuning, 20).step_cache.max_consecutive_skips == 2
    assert levers_for("fast", "cpu", tuning, 28).step_cache.max_consecutive_skips == 2
    assert levers_for("fast", "cpu", tuning, 36).step_cache.max_consecutive_skips == 4
    assert levers_for("fast", "cpu", tuning, 50).step_cache.threshold == 0.007
    assert levers_for("fast", "cpu", tuning, 8).step_cache.threshold == 0.002
    assert levers_for("fast", "cpu", tuning).step_cache.threshold == 0.002  # no steps: first
    # a single setting holds for every length; "steps" is not a StepCacheConfig field
    assert levers_for("balanced", "cpu", tuning, 50).step_cache.threshold == 0.3
    assert tuning_for_steps({"steps": 20, "threshold": 0.1}, 50, "x") == {"threshold": 0.1}
    # sqrt(20 * 50) ~ 31.6: the tie-break is by log distance, the shorter schedule on a tie
    assert tuning_for_steps([{"steps": 10, "a": 1}, {"steps": 40, "a": 2}], 20, "x") == {"a": 1}
    with pytest.raises(ValueError, match=r"step_cache.fast\[1\].*steps"):
        levers_for("fast", "cpu", {"step_cache": {"fast": [short, {"threshold": 0.1}]}}, 20)
    with pytest.raises(ValueError, match="step_cache.fast: expected"):
        levers_for("fast", "cpu", {"step_cache": {"fast": 0.5}}, 20)


class _Line(torch.nn.Module):
    """A denoiser whose output is ``x + a + b * (t / 1000)``: any forecast of order >= 1 is
    exact on it, and reuse (order 0) is not."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, hidden_states, timestep, return_dict=False):
        self.calls += 1
        s = timestep.float().view(-1, 1) / 1000
        return (hidden_states + 0.5 + 2.0 * s,)


def _run_line(config: StepCacheConfig, times: list[float]):
    from diffusers import ModelMixin

    class Model(ModelMixin, _Line):
        def __init__(self):
            ModelMixin.__init__(self)
            _Line.__init__(self)

    model, x = Model(), torch.randn(2, 5)
    stats = apply_step_cache(model, config)
    with torch.no_grad():
        outs = [model(x, torch.tensor([t]))[0] for t in times]
    remove_step_cache(model)
    return x, outs, [computed for *_, computed in stats.decisions], model.calls


TIMES = [1000.0 - 90.0 * i for i in range(11)]  # 1000 ... 100


def test_a_static_schedule_computes_exactly_its_calls():
    """With a high threshold the schedule alone decides: the calls it lists run, the others
    are forecast (the first three always run: the forecast's warm-up); a low threshold adds
    full calls between the scheduled ones where the forecast error would pass it."""
    schedule = [0, 1, 2, 5, 9]
    static = StepCacheConfig(threshold=10.0, signal="output", order=1, warmup_steps=3,
                             max_consecutive_skips=100, schedule=schedule)
    x, outs, flags, calls = _run_line(static, TIMES)
    assert [i for i, f in enumerate(flags) if f] == schedule
    assert calls == len(schedule)
    for t, out in zip(TIMES, outs, strict=True):  # linear in t: every forecast is exact
        torch.testing.assert_close(out, x + 0.5 + 2.0 * t / 1000)
    # the skip limit still forces a full call: at most 2 skips in a row
    _, _, flags, _ = _run_line(dataclasses.replace(static, max_consecutive_skips=2), TIMES)
    assert "FFF" not in "".join("T" if f else "F" for f in flags)
    assert {0, 1, 2, 5, 9} <= {i for i, f in enumerate(flags) if f}
    # threshold 0 is still exact: every call runs
    _, _, flags, _ = _run_line(dataclasses.replace(static, threshold=0.0), TIMES)
    assert all(flags)


def test_the_forecast_is_reuse_above_linear_below_and_linear_under_it():
    """Calls whose timestep is at or above ``linear_below`` of the first one reuse the last
    full output (order 0); below it they extrapolate linearly (exact on a line)."""
    config = StepCacheConfig(threshold=10.0, signal="output", order=1, warmup_steps=3,
                             max_consecutive_skips=100, schedule=[0, 1, 2], linear_below=0.5)
    x, outs, flags, _ = _run_line(config, TIMES)
    last_full = outs[2]
    for t, out, computed in zip(TIMES, outs, flags, strict=True):
        if computed:
            continue
        if t >= 500.0:
            torch.testing.assert_close(out, last_full)
        else:
            torch.testing.assert_close(out, x + 0.5 + 2.0 * t / 1000)
    assert any(t >= 500.0 and not f for t, f in zip(TIMES, flags, strict=True))
    assert any(t < 500.0 and not f for t, f in zip(TIMES, flags, strict=True))


def test_schedule_and_linear_below_reject_bad_values():
    with pytest.raises(ValueError, match="schedule"):
        StepCacheConfig(signal="output", schedule=[0, -1])
    with pytest.raises(ValueError, match="schedule"):
        StepCacheConfig(signal="output", schedule=[0, 1.5])
    with pytest.raises(ValueError, match="linear_below"):
        StepCacheConfig(signal="output", linear_below=1.5)
    with pytest.raises(ValueError, match="only the output signal"):
        StepCacheConfig(signal="block", schedule=[0, 4])
    # a list from studio.json becomes a tuple (the config stays hashable and frozen)
    assert StepCacheConfig(signal="output", schedule=[0, 2]).schedule == (0, 2)


def test_a_schedule_calibrated_at_one_length_is_stretched_to_the_jobs():
    from studio.engine.profiles import stretch_schedule, tuning_for_steps

    fast = {"steps": 50, "signal": "output", "threshold": 10.0,
            "schedule": [0, 1, 2, 5, 10, 25, 40, 48], "linear_below": 0.7}
    tuning = {"step_cache": {"fast": [fast]}}
    assert levers_for("fast", "cpu", tuning, 50).step_cache.schedule == (0, 1, 2, 5, 10, 25,
                                                                          40, 48)
    # 25 steps: each index to the same place along the shorter trajectory, duplicates gone
    assert stretch_schedule([0, 1, 2, 5, 10, 25, 40, 48], 50, 25, "x") == [0, 1, 2, 5, 12,
                                                                            20, 24]
    assert levers_for("fast", "cpu", tuning, 25).step_cache.schedule == (0, 1, 2, 5, 12, 20,
                                                                          24)
    assert tuning_for_steps([fast], 100, "x")["schedule"][-1] == 97
    with pytest.raises(ValueError, match=r"step_cache.fast schedule.*0..49"):
        levers_for("fast", "cpu", {"step_cache": {"fast": [{**fast, "schedule": [0, 50]}]}},
                   20)


def test_an_image_to_image_trajectory_starts_the_schedule_where_it_starts():
    from studio.engine.profiles import levers_from_step

    fast = {"steps": 50, "signal": "output", "threshold": 10.0, "schedule": [0, 1, 2, 6, 11,
                                                                             18, 25, 48]}
    levers = levers_for("fast", "cpu", {"step_cache": {"fast": [fast]}}, 50)
    # strength 0.6 at 50 steps runs steps 20..49: call k is step 20 + k
    assert levers_from_step(levers, 20).step_cache.schedule == (5, 28)
    assert levers_from_step(levers, 0) is levers
    exact = levers_for("exact", "cpu")
    assert levers_from_step(exact, 20) is exact  # no cache: nothing to move


def test_a_clip_job_takes_the_clip_setting_and_an_image_job_the_other(tiny_models, tmp_path):
    """A model's studio.json may calibrate a profile for clips alone (``"video": true``, as
    ``bench calibrate --per-mode --write`` does): the runner applies that setting to a
    text-to-video job and the one for both kinds to a text-to-image job of the same model,
    and says which in the job's notes."""
    import json
    import shutil

    from studio.core.request import GenerationRequest, OptimizationSettings
    from studio.engine.executor import runner_class
    from studio.engine.models.registry import ModelRegistry

    folder = tmp_path / "wan"
    shutil.copytree(tiny_models["wan-t2v"], folder)
    both = {"steps": 8, "signal": "output", "threshold": 0.0031, "order": 1,
            "warmup_steps": 3, "max_consecutive_skips": 2}
    clips = {**both, "video": True, "threshold": 0.0097}
    (folder / "studio.json").write_text(json.dumps({"step_cache": {"fast": [both, clips]}}))
    entry = ModelRegistry(include_hf_cache=False).resolve(str(folder))
    assert {"t2i", "t2v"} <= set(entry.capabilities.modes)
    runner = runner_class(entry.family)(entry, torch.device("cpu"), torch.float32)

    def notes(mode, frames):
        request = GenerationRequest(model=str(folder), prompt="a red circle", seed=4, steps=8,
                                    guidance_scale=4.0, width=32, height=32, mode=mode,
                                    num_frames=frames, optimization=OptimizationSettings("fast"))
        return " ".join(runner.run(request, {}, lambda *a: None).notes)

    assert "threshold 0.0097" in notes("t2v", 5)
    image = notes("t2i", 1)
    assert "threshold 0.0031" in image and "0.0097" not in image
