"""The memory manager: plan choice for injected budgets, traced estimates against real runs,
the executor's use of it (clear error, tiling, retry after an out-of-memory error, models kept
within the budget)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from studio.core.request import GenerationRequest
from studio.engine import events as ev
from studio.engine.executor import JobExecutor, runner_class
from studio.engine.job import Job
from studio.engine.memory import (
    LiveBytes,
    MemoryEstimate,
    NotEnoughMemory,
    choose_plan,
    trace_peak,
)
from studio.engine.models.registry import ModelRegistry

GiB = 2**30


def estimate() -> MemoryEstimate:
    g = lambda x: int(x * GiB)  # noqa: E731
    return MemoryEstimate(
        weights={"text_encode": g(4), "denoise": g(12), "decode": g(0.2)},
        activations={"text_encode": g(0.5), "denoise": g(3), "decode": g(8)},
        decode_tiled=g(1),
        largest_block={"text_encode": g(0.1), "denoise": g(0.5), "decode": g(0.05)},
        largest_layer={"text_encode": g(0.05), "denoise": g(0.1), "decode": g(0.01)},
        resident=g(0.1))


# budget (GiB) -> the documented plan: fastest first, tiling before the next offload level
PLANS = [(30, ("none", False)), (20, ("none", True)), (16, ("model", False)),
         (10, ("group", False)), (8.15, ("group", True)), (5, ("group", True)),
         (3.5, ("sequential", True))]


@pytest.mark.parametrize("budget,want", PLANS, ids=[f"{b}GiB" for b, _ in PLANS])
def test_planner_picks_the_fastest_plan_that_fits(budget, want):
    plan = choose_plan(estimate(), int(budget * GiB), "cuda")
    assert (plan.offload, plan.vae_tiling) == want
    assert plan.peak_bytes <= plan.budget_bytes


def test_planner_errors_with_the_numbers_and_steps_down_after_a_failure():
    with pytest.raises(NotEnoughMemory, match=r"needs about 3,277 MiB .* budget is 3,072 MiB"):
        choose_plan(estimate(), 3 * GiB, "cuda")
    first = choose_plan(estimate(), 30 * GiB, "cuda")
    assert (first.offload, first.vae_tiling) == ("none", False)
    second = choose_plan(estimate(), 30 * GiB, "cuda", after=first)
    assert (second.offload, second.vae_tiling) == ("none", True)
    # on the CPU there is nowhere to offload to
    assert choose_plan(estimate(), 20 * GiB, "cpu").offload == "none"
    with pytest.raises(NotEnoughMemory):
        choose_plan(estimate(), 16 * GiB, "cpu")
    with pytest.raises(ValueError, match="budget_bytes"):
        choose_plan(estimate(), 0)
    with pytest.raises(ValueError, match="offload"):
        estimate().peak("disk", False)


def test_fake_trace_equals_the_live_bytes_of_a_real_run():
    from diffusers import AutoencoderKLWan, WanTransformer3DModel

    torch.manual_seed(0)
    tr = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=32, in_channels=8,
        out_channels=8, text_dim=32, freq_dim=32, ffn_dim=128, num_layers=2,
        cross_attn_norm=True, qk_norm="rms_norm_across_heads").eval()
    vae = AutoencoderKLWan(base_dim=8, z_dim=8, dim_mult=[1, 2], num_res_blocks=1,
                           temperal_downsample=[True]).eval()
    x, t, e = torch.randn(1, 8, 3, 24, 20), torch.tensor([500.0]), torch.randn(1, 11, 32)
    z = torch.randn(1, 8, 3, 12, 10)
    for fn, args, module in ((lambda x, t, e: tr(x, t, e, return_dict=False), (x, t, e), tr),
                             (lambda z: vae.decode(z, return_dict=False), (z,), vae)):
        estimated = trace_peak(fn, *args)
        real = LiveBytes()
        with torch.no_grad(), real:
            fn(*args)
        assert estimated == real.peak > 0
        # told the weights, both leave out their views (a linear layer's transposed weight)
        weights = [*module.parameters(), *module.buffers()]
        activations_only = LiveBytes(weights)
        with torch.no_grad(), activations_only:
            fn(*args)
        assert trace_peak(fn, *args, modules=[module]) == activations_only.peak > 0


def request_for(folder, **fields):
    return GenerationRequest(model=str(folder), prompt="a red circle on grass", seed=3,
                             steps=2, guidance_scale=4.0, **fields)


@pytest.mark.parametrize("model,fields", [
    ("wan-t2v", dict(mode="t2v", num_frames=17, width=96, height=64)),
    ("flux", dict(mode="t2i", width=128, height=96))])
def test_estimate_matches_the_measured_peak_of_a_real_job(tiny_models, model, fields):
    """The traced estimate against the activations a real CPU job allocates (live tensor
    bytes measured during the real run, weights excluded on both sides): within 25 %."""
    folder = tiny_models[model]
    entry = ModelRegistry(include_hf_cache=False).resolve(str(folder))
    runner = runner_class(entry.family)(entry, torch.device("cpu"), torch.float32)
    request = request_for(folder, **fields)
    est = runner.memory_estimate(request)
    runner.run(request, {}, lambda *a: None)  # warm: text embeddings cached
    runner.embeddings.clear()
    measured = LiveBytes([t for m in runner.base.components.values()
                          if isinstance(m, torch.nn.Module) for t in [*m.parameters(),
                                                                      *m.buffers()]])
    with torch.inference_mode(), measured:
        runner.run(request, {}, lambda *a: None)
    predicted = est.peak("none", False) - sum(est.weights.values())
    assert 0.75 * measured.peak <= predicted <= 1.25 * measured.peak, \
        (predicted, measured.peak)


def run_job(executor, request) -> ev.JobEvent:
    events = []
    return executor.execute(Job("job1", request), events.append, lambda: False)


def test_executor_reports_a_budget_too_small_with_numbers(tiny_models):
    folder = tiny_models["wan-t2v"]
    executor = JobExecutor(ModelRegistry(include_hf_cache=False), torch.device("cpu"),
                           memory_budget_bytes=1 * 2**20)
    result = run_job(executor, request_for(folder, mode="t2v", num_frames=5, width=32,
                                           height=32))
    assert isinstance(result, ev.Failed) and result.kind == ev.OUT_OF_MEMORY
    assert "MiB" in result.message and "budget is 1 MiB" in result.message


def test_executor_tiles_the_decode_when_that_is_what_fits(tiny_models):
    folder = tiny_models["flux"]
    executor = JobExecutor(ModelRegistry(include_hf_cache=False), torch.device("cpu"))
    request = request_for(folder, mode="t2i", width=384, height=384)
    runner, _ = executor.runner_for(executor.registry.resolve(str(folder)))
    vae = runner.base.vae  # tiles of 128 px (the tiny VAE's default, 32 px, makes 250 tiles)
    vae.tile_sample_min_size, vae.tile_latent_min_size = 128, 16
    est = runner.memory_estimate(request)
    untiled, tiled = est.peak("none", False), est.peak("none", True)
    assert tiled < untiled
    executor.memory_budget_bytes = (tiled + untiled) // 2
    result = run_job(executor, request)
    assert isinstance(result, ev.Finished), result
    assert any("VAE tiling" in n for n in result.notes)


def test_executor_retries_once_after_out_of_memory(tiny_models, monkeypatch):
    folder = tiny_models["wan-t2v"]
    executor = JobExecutor(ModelRegistry(include_hf_cache=False), torch.device("cpu"))
    runner, _ = executor.runner_for(executor.registry.resolve(str(folder)))
    real_run, calls = runner.run, []

    def flaky(*args, **kwargs):
        calls.append(getattr(runner, "_memory_plan", None))
        if len(calls) == 1:
            raise torch.OutOfMemoryError("injected")
        return real_run(*args, **kwargs)

    monkeypatch.setattr(runner, "run", flaky)
    result = run_job(executor, request_for(folder, mode="t2i", width=32, height=32))
    assert isinstance(result, ev.Finished), result
    assert "retried after running out of memory" in result.notes
    assert [p.vae_tiling for p in calls] == [False, True]


def test_models_stay_loaded_within_the_budget(tiny_models):
    wan, flux = tiny_models["wan-t2v"], tiny_models["flux"]
    registry = ModelRegistry(include_hf_cache=False)
    sizes = [registry.resolve(str(m)).size_bytes for m in (wan, flux)]
    roomy = JobExecutor(registry, torch.device("cpu"), max_loaded=4)
    for m in (wan, flux, wan):
        roomy.runner_for(registry.resolve(str(m)))
    assert roomy.load_count == 2  # switching back did not reload
    tight = JobExecutor(registry, torch.device("cpu"), max_loaded=4,
                        memory_budget_bytes=max(sizes) + min(sizes) // 2)
    for m in (wan, flux, wan):
        tight.runner_for(registry.resolve(str(m)))
    assert tight.load_count == 3 and len(tight.loaded) == 1  # evicted, least recent first
    assert np.isfinite(sizes).all()


def test_automatic_budget_unloads_the_least_recent_model_when_memory_runs_short(
        tiny_models, monkeypatch):
    """Under the automatic budget (0) a model is loaded beside the others only while the
    device's free memory holds twice its file size; the free memory here is simulated as a
    fixed total less the loaded models' file sizes, so unloading frees it."""
    import studio.engine.memory as memory

    wan, flux = tiny_models["wan-t2v"], tiny_models["flux"]
    registry = ModelRegistry(include_hf_cache=False)
    entries = [registry.resolve(str(m)) for m in (wan, flux)]
    total = {"bytes": 0}
    executor = JobExecutor(registry, torch.device("cpu"), max_loaded=4)
    monkeypatch.setattr(memory, "available_bytes", lambda device: total["bytes"] - sum(
        r.entry.size_bytes for r in executor.loaded.values()))
    small, large = sorted(entries, key=lambda e: e.size_bytes)
    total["bytes"] = small.size_bytes + 2 * large.size_bytes  # room for both side by side
    for entry in (small, large, small):
        executor.runner_for(entry)
    assert executor.load_count == 2 and len(executor.loaded) == 2
    executor.loaded.clear()
    total["bytes"] -= 1  # one byte short of both: the large one needs the small one's room
    executor.runner_for(small)
    executor.runner_for(large)
    assert executor.load_count == 4 and len(executor.loaded) == 1
    assert next(iter(executor.loaded.values())).entry.model_id == large.model_id


@pytest.mark.parametrize("model,fields", [("wan-t2v", dict(mode="t2v", num_frames=5)),
                                          ("flux", dict(mode="t2i"))])
def test_failed_decode_is_retried_tiled_without_denoising_again(tiny_models, model, fields,
                                                                 monkeypatch):
    folder = tiny_models[model]
    entry = ModelRegistry(include_hf_cache=False).resolve(str(folder))
    runner = runner_class(entry.family)(entry, torch.device("cpu"), torch.float32)
    request = request_for(folder, width=32, height=32, **fields)
    want = runner.run(request, {}, lambda *a: None).frames
    vae, real_decode = runner.base.vae, runner.base.vae.decode
    calls = {"denoiser": 0, "decode": 0}
    runner.base.transformer.register_forward_pre_hook(
        lambda *_: calls.__setitem__("denoiser", calls["denoiser"] + 1))

    def decode(*args, **kwargs):
        calls["decode"] += 1
        if not vae.use_tiling:
            raise torch.OutOfMemoryError("injected")
        return real_decode(*args, **kwargs)

    monkeypatch.setattr(vae, "decode", decode)
    out = runner.run(request, {}, lambda *a: None)
    assert calls["decode"] == 2 and calls["denoiser"] == 2 * (2 if model != "flux" else 1)
    assert any("decoded again tiled" in n for n in out.notes)
    # tiling changes nothing at this size (one tile): the same pixels
    np.testing.assert_allclose(out.frames, want, atol=1e-5)


def test_a_job_after_an_offloaded_one_keeps_the_offload_or_loads_again(tiny_models,
                                                                        monkeypatch):
    """Back-to-back jobs in one engine: after a job that offloaded, a small job that would fit
    all on the device keeps the offload (it used to fail with an internal error, and every
    small job after it), and another offload than the one in force loads the model again
    (diffusers' offload hooks, and our levers wrapped by them, do not come off cleanly).
    The device here is the CPU, where nothing offloads: the planner's choice and the
    diffusers call are stood in for; the jobs are real."""
    from studio.engine import memory
    from studio.engine.memory import MemoryPlan

    folder = tiny_models["wan-t2v"]
    executor = JobExecutor(ModelRegistry(include_hf_cache=False), torch.device("cpu"))
    applied = []
    wanted = iter([("model", False), ("group", False), ("none", False), ("group", True)])
    monkeypatch.setattr(memory, "apply_plan", lambda pipe, plan, device: applied.append(
        (id(pipe), plan.offload)))
    monkeypatch.setattr(memory, "quick_bound", lambda runner, request: 2**62)  # "big" jobs
    monkeypatch.setattr(memory, "choose_plan", lambda est, budget, kind, after=None:
                        MemoryPlan(*next(wanted), 1, budget))
    request = request_for(folder, mode="t2i", width=32, height=32)
    first = run_job(executor, request)  # offloads ("model")
    runner = next(iter(executor.loaded.values()))
    second = run_job(executor, request)  # offloads another way ("group"): loaded again
    fresh = next(iter(executor.loaded.values()))
    third = run_job(executor, request)  # would fit all on the device: keeps "group"
    assert all(isinstance(r, ev.Finished) for r in (first, second, third)), (first, second,
                                                                               third)
    assert fresh is not runner and executor.load_count == 2 and len(executor.loaded) == 1
    assert [o for _, o in applied] == ["model", "group"]  # the third applied nothing new
    assert applied[0][0] != applied[1][0]  # on the fresh pipeline
    assert "memory plan: group offload" in " ".join(third.notes)
    # the same offload with VAE tiling: the tiling alone changes (enabling an offload again
    # would stack its hooks)
    fourth = run_job(executor, request)
    assert isinstance(fourth, ev.Finished), fourth
    assert len(applied) == 2 and fresh.base.vae.use_tiling
    assert "group offload, VAE tiling" in " ".join(fourth.notes)


def test_the_automatic_budget_counts_only_the_jobs_own_weights_on_the_device(tiny_models,
                                                                           monkeypatch):
    from studio.engine import memory

    monkeypatch.setattr(memory, "available_bytes", lambda device: 10 * 2**30)
    wan, flux = tiny_models["wan-t2v"], tiny_models["flux"]
    registry = ModelRegistry(include_hf_cache=False)
    executor = JobExecutor(registry, torch.device("cpu"), max_loaded=4)
    a, _ = executor.runner_for(registry.resolve(str(wan)))
    b, _ = executor.runner_for(registry.resolve(str(flux)))
    own = sum(memory.module_bytes(m) for m in a.base.components.values()
              if isinstance(m, torch.nn.Module))
    assert own > 0 and b is not a
    # the other loaded model's weights are not free memory for this job
    assert executor.budget_bytes(a) == 10 * 2**30 + own
    assert executor.budget_bytes() == 10 * 2**30


def test_an_unfinished_stage_clock_leaves_no_hook_behind():
    """A cancelled or failed job never calls StageClock.finish(): the next job's clock on the
    same denoiser removes the hook it left, so hooks do not pile up in a long-lived engine."""
    from studio.engine.pipelines.base import StageClock

    denoiser = torch.nn.Linear(2, 2)
    for _ in range(3):
        StageClock([denoiser, None])  # never finished
    assert len(denoiser._forward_pre_hooks) == 1
    clock = StageClock([denoiser])
    denoiser(torch.zeros(1, 2))
    assert clock.first_forward is not None
    assert set(clock.finish()) == {"prepare", "denoise", "decode"}
    assert len(denoiser._forward_pre_hooks) == 0


class MovingOffload(torch.nn.Module):
    """Two linear layers with a forward pre-hook that moves them and the inputs onto
    ``onload``, as accelerate's hook for diffusers' model CPU offload does
    (``module.to(device)``; the module goes back to the CPU when the next model's hook
    runs)."""

    def __init__(self, onload: torch.device):
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(),
                                          torch.nn.Linear(256, 64))
        self.moves = 0

        def move_on(module, args):
            self.moves += 1
            self.layers.to(onload)
            return tuple(a.to(onload) for a in args)

        self.register_forward_pre_hook(move_on)

    def forward(self, x):
        return self.layers(x)


def test_a_trace_through_offload_hooks_keeps_the_weights_and_counts_only_activations():
    """An offload hook runs inside the estimate's trace: its moves of the weights are not
    activations, and the weights are put back real afterwards. Before, a move under
    FakeTensorMode left fake tensors in the model: after an offloaded job, the estimate for
    a new size broke the model for every later job (and counted the weights moved onto the
    device as activations). The meta device stands in for a GPU."""
    meta = torch.device("meta")
    hooked = MovingOffload(meta).eval()
    before = {n: p.detach().clone() for n, p in hooked.named_parameters()}
    x = torch.randn(8, 64)
    peak = trace_peak(hooked, x, modules=[hooked])
    assert hooked.moves == 1, "the hook ran inside the trace"
    plain = MovingOffload(meta).eval()
    plain._forward_pre_hooks.clear()
    plain.to(meta)
    # the same peak as the model already on the device, plus the hook's copy of the input
    assert peak == trace_peak(plain, x.to(meta), modules=[plain]) + x.nbytes > x.nbytes
    from torch._subclasses.fake_tensor import FakeTensor

    for name, p in hooked.named_parameters():
        assert not isinstance(p.data, FakeTensor) and p.device.type == "cpu", name
        torch.testing.assert_close(p.detach(), before[name], rtol=0, atol=0)
    with torch.no_grad():
        hooked._forward_pre_hooks.clear()  # the hooks' meta device cannot compute
        assert torch.isfinite(hooked(x)).all()


def test_the_estimate_after_a_sequential_offload_leaves_the_model_whole():
    """diffusers' sequential CPU offload (accelerate's hooks) on the embedded model, the meta
    device standing in for a GPU: the estimate for a new size is traced through the hooks,
    and afterwards no weight is a fake tensor and the denoiser's activations are those of
    the model all on the device (the hooks' copies of the weights not counted)."""
    from torch._subclasses.fake_tensor import FakeTensor

    from studio.engine.memory import MemoryPlan
    from studio.engine.models.registry import EMBEDDED_ID

    entry = ModelRegistry(include_hf_cache=False).resolve(EMBEDDED_ID)
    meta, cpu = torch.device("meta"), torch.device("cpu")

    def request(width):
        return GenerationRequest(model=entry.model_id, prompt="a red circle", mode="t2v",
                                 width=width, height=width, steps=2, seed=1,
                                 guidance_scale=4.0, num_frames=9)

    def tensors(runner):
        return [t for m in runner.base.components.values() if isinstance(m, torch.nn.Module)
                for t in [*m.parameters(), *m.buffers()]]

    whole = runner_class(entry.family)(entry, meta, torch.float32, cpu)
    whole.apply_memory_plan(MemoryPlan("none", False, 1, 2))
    offloaded = runner_class(entry.family)(entry, meta, torch.float32, cpu)
    offloaded.memory_estimate(request(64))  # the first plan's estimate: no hooks yet
    offloaded.apply_memory_plan(MemoryPlan("sequential", False, 1, 2))
    devices = [t.device for t in tensors(offloaded)]
    est = offloaded.memory_estimate(request(96))  # a new size: traced through the hooks
    assert not any(isinstance(t, FakeTensor) for t in tensors(offloaded))
    assert [t.device for t in tensors(offloaded)] == devices
    want = whole.memory_estimate(request(96)).activations["denoise"]
    # within 5 %: the hooks also copy the rotary tables from "meta" to "meta:0" (an artefact
    # of the stand-in device; on a GPU "cuda:0" is "cuda")
    assert want <= est.activations["denoise"] <= 1.05 * want, (est.activations, want)
