"""CPU thread count under load (studio.engine.executor.cpu_threads_for_load): a job uses the
cores other processes leave free, read from the kernel's runnable-thread count, so that it
does not queue behind a busy machine's threads on torch's barriers."""

from __future__ import annotations

import torch

from studio.core.request import GenerationRequest
from studio.engine import executor as executor_module
from studio.engine.executor import (
    JobExecutor,
    cpu_threads_for_load,
    other_runnable_threads,
)
from studio.engine.job import Job
from studio.engine.models.registry import ModelRegistry
from studio.engine.worker import WorkerConfig


def test_other_runnable_threads_reads_the_kernels_count(tmp_path):
    loadavg = tmp_path / "loadavg"
    loadavg.write_text("2.10 1.80 1.20 3/412 90210\n")
    assert other_runnable_threads(str(loadavg), samples=2, interval_s=0) == 2  # less itself
    loadavg.write_text("0.00 0.00 0.00 1/100 5\n")
    assert other_runnable_threads(str(loadavg), samples=1) == 0
    assert other_runnable_threads(str(tmp_path / "missing"), samples=1) == 0  # not Linux
    loadavg.write_text("garbage\n")
    assert other_runnable_threads(str(loadavg), samples=1) == 0


def test_threads_are_the_free_cores_and_at_least_one():
    assert cpu_threads_for_load(cores=2, others=0) == 2
    assert cpu_threads_for_load(cores=2, others=2) == 1
    assert cpu_threads_for_load(cores=2, others=7) == 1
    assert cpu_threads_for_load(cores=16, others=3) == 13


def test_auto_threads_are_opt_in_and_a_busy_cpu_gets_a_note(monkeypatch):
    # off by default: the thread count changes the last bit, and repeats must match exactly
    monkeypatch.delenv("STUDIO_CPU_THREADS", raising=False)
    assert not WorkerConfig(device="cpu", include_hf_cache=False).build_executor() \
        .auto_cpu_threads
    monkeypatch.setenv("STUDIO_CPU_THREADS", "auto")
    assert WorkerConfig(device="cpu", include_hf_cache=False).build_executor().auto_cpu_threads
    explicit = WorkerConfig(device="cpu", include_hf_cache=False, torch_threads=1)
    before = torch.get_num_threads()
    try:
        assert not explicit.build_executor().auto_cpu_threads
    finally:
        torch.set_num_threads(before)
    executor = JobExecutor(ModelRegistry(include_hf_cache=False), torch.device("cpu"))
    monkeypatch.setattr(executor_module, "other_runnable_threads", lambda **kw: 64)
    job = Job("j", GenerationRequest(mode="t2i", model="embedded", prompt="a red circle",
                                     steps=1, width=64, height=64, num_frames=1, seed=1,
                                     guidance_scale=4.0))
    try:
        # a busy machine, threads as set: the job says why it may be slow
        torch.set_num_threads(2)
        done = executor.execute(job, lambda e: None, lambda: False)
        assert done.environment["torch_threads"] == 2
        assert any(n.startswith("the CPU is busy (64 threads") for n in done.notes)
        # auto: the job runs on one thread, records it, and needs no note
        executor.auto_cpu_threads = True
        done = executor.execute(job, lambda e: None, lambda: False)
        assert done.environment["torch_threads"] == 1
        assert not any("CPU is busy" in n for n in done.notes)
    finally:
        torch.set_num_threads(before)
