"""Where a model's weights go at load: on the engine's GPU when they fit, else on the CPU for
the first job's memory plan (offload from there, or the whole pipeline moved once it fits).
Loaded straight onto the GPU, a model bigger than its memory ran out of memory before any plan
was made. This machine has no GPU: a CUDA executor on a CPU-only torch build proves that a
load it sends to the CPU touches no CUDA (before, it raised at ``.to("cuda")``)."""

from __future__ import annotations

import pytest
import torch

from studio.core.request import GenerationRequest
from studio.engine.executor import JobExecutor, runner_class
from studio.engine.memory import MemoryPlan
from studio.engine.models.registry import EMBEDDED_ID, ModelRegistry

needs_cpu_only_torch = pytest.mark.skipif(torch.cuda.is_available(),
                                          reason="proves the load touches no CUDA")
CUDA = torch.device("cuda")
CPU = torch.device("cpu")


def devices_of(runner) -> set[torch.device]:
    modules = [m for m in runner.base.components.values() if isinstance(m, torch.nn.Module)]
    modules += runner.extra_modules()
    return {t.device for m in modules for t in [*m.parameters(), *m.buffers()]}


@needs_cpu_only_torch
@pytest.mark.parametrize("model,mode", [("embedded", "r2v"), ("wan-i2v", "i2v"),
                                        ("flux", "t2i")])
def test_a_model_too_big_for_the_gpu_loads_on_the_cpu_for_the_memory_plan(tiny_models, model,
                                                                          mode):
    registry = ModelRegistry(include_hf_cache=False)
    entry = registry.resolve(EMBEDDED_ID if model == "embedded" else str(tiny_models[model]))
    executor = JobExecutor(registry, CUDA, memory_budget_bytes=entry.size_bytes // 2)
    assert executor.load_device(entry) == CPU
    runner, _ = executor.runner_for(entry)
    assert runner.device == CUDA and runner.load_device == CPU
    assert devices_of(runner) == {CPU} and runner.weights_device() == CPU
    if model == "embedded":
        assert runner.extra_modules(), "the reference encoder is one of the runner's modules"
    assert runner.preview is not None  # fitted on the VAE where it lies
    # the estimate the plan is chosen from is traced where the weights are, not guessed
    kw = dict(num_frames=5) if mode != "t2i" else {}
    request = GenerationRequest(model=entry.model_id, prompt="a red circle", mode=mode,
                                width=32, height=32, steps=2, seed=1,
                                guidance_scale=4.0, **kw)
    est = runner.memory_estimate(request)
    assert est.notes == (), est.notes
    assert est.activations["denoise"] > 0 and est.weights["denoise"] > 0


@needs_cpu_only_torch
def test_a_model_that_fits_loads_on_its_device_and_a_rank_always_does(tiny_models):
    registry = ModelRegistry(include_hf_cache=False)
    entry = registry.resolve(str(tiny_models["flux"]))
    roomy = JobExecutor(registry, CUDA, memory_budget_bytes=4 * entry.size_bytes)
    assert roomy.load_device(entry) == CUDA
    with pytest.raises((AssertionError, RuntimeError)):  # it really goes to CUDA (none here)
        roomy.runner_for(entry)
    rank = JobExecutor(registry, CUDA, memory_budget_bytes=entry.size_bytes // 2)
    rank.on_runner_loaded = lambda runner: None  # a multi-GPU rank: its plan shards on-device
    assert rank.load_device(entry) == CUDA
    assert JobExecutor(registry, CPU, memory_budget_bytes=1).load_device(entry) == CPU


def test_the_first_plan_moves_cpu_loaded_weights_to_the_device():
    """Plan "all on device" on a runner loaded on the CPU moves the pipeline and the modules
    beside it (the reference encoder) to the runner's device; the meta device stands in for
    a GPU."""
    entry = ModelRegistry(include_hf_cache=False).resolve(EMBEDDED_ID)
    meta = torch.device("meta")
    runner = runner_class(entry.family)(entry, meta, torch.float32, CPU)
    assert devices_of(runner) == {CPU} and runner.extra_modules()
    runner.apply_memory_plan(MemoryPlan("none", False, 1, 2))
    assert devices_of(runner) == {meta} and runner.weights_device() == meta


@needs_cpu_only_torch
@pytest.mark.parametrize("family", ["sd", "sdxl", "ltx", "ltx2", "qwen-image", "flux2",
                                    "hidream", "wan-vace"])
def test_every_family_loads_on_the_cpu_when_short_of_gpu_memory(tmp_path, family):
    from studio.testing import tiny_pipelines as tp

    build = {"sd": tp.build_tiny_sd, "sdxl": lambda f: tp.build_tiny_sd(f, variant="sdxl"),
             "ltx": tp.build_tiny_ltx, "ltx2": tp.build_tiny_ltx2,
             "qwen-image": tp.build_tiny_qwen_image, "flux2": tp.build_tiny_flux2,
             "hidream": tp.build_tiny_hidream, "wan-vace": tp.build_tiny_wan_vace}[family]
    registry = ModelRegistry(include_hf_cache=False)
    entry = registry.resolve(str(build(tmp_path / family)))
    assert entry.usable, entry.error
    executor = JobExecutor(registry, CUDA, memory_budget_bytes=entry.size_bytes // 2)
    runner, _ = executor.runner_for(entry)
    assert devices_of(runner) == {CPU} and runner.device == CUDA
    video = "t2v" in entry.capabilities.modes
    request = GenerationRequest(model=entry.model_id, prompt="a red circle",
                                mode="t2v" if video else "t2i", width=32, height=32, steps=2,
                                seed=1, guidance_scale=4.0, num_frames=9 if video else 1)
    assert runner.memory_estimate(request).activations["denoise"] > 0
