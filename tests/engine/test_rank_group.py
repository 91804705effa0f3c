"""The engine over a long-lived group of 2 CPU ranks (gloo): a CFG-parallel job gives the
single-process pixels and records its plan, the group stays up between jobs and through a
cancel, and a killed rank fails the running job within the collective timeout while the
next job runs on a new group."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import numpy as np
import torch

from studio.core.request import GenerationRequest
from studio.engine import events as ev
from studio.engine.api import Engine
from studio.engine.executor import JobExecutor
from studio.engine.job import Job
from studio.engine.models.registry import ModelRegistry
from studio.engine.parallel import ParallelConfig
from studio.engine.parallel.worker import RankGroupWorker
from studio.engine.worker import WorkerConfig


def request(model, **kw):
    base = dict(mode="t2v", model=str(model), prompt="a red circle", seed=3, steps=4,
                guidance_scale=4.0, width=32, height=32, num_frames=5)
    base.update(kw)
    return GenerationRequest(**base)


def test_rank_group_runs_jobs_and_survives_a_dead_rank(tiny_models):
    model = tiny_models["wan-t2v"]
    single = JobExecutor(ModelRegistry(include_hf_cache=False), torch.device("cpu")).execute(
        Job("ref", request(model)), lambda e: None, lambda: False)
    # the default collective timeout (15 minutes, for loading): a dead rank still fails the
    # job at once, its process being watched
    worker = RankGroupWorker(WorkerConfig(include_hf_cache=False),
                             ParallelConfig(cfg_degree=2))
    assert worker.timeout_s >= 600

    async def main():
        async with Engine(worker) as engine:
            first = await engine.wait(engine.submit(request(model)))
            pids = worker.pids
            second = await engine.wait(engine.submit(request(model, seed=4)))
            same_group = worker.pids == pids
            # cancelling stops every rank at the same step and keeps the group up
            stream = engine.events()
            slow = engine.submit(request(model, steps=150, width=64, height=64))
            async for event in stream:
                if isinstance(event, ev.Progress) and event.job_id == slow and event.step >= 2:
                    break
            engine.cancel(slow)
            cancelled = await engine.wait(slow)
            third = await engine.wait(engine.submit(request(model)))
            kept_after_cancel = worker.pids == pids
            stream = engine.events()
            slow = engine.submit(request(model, steps=150, width=64, height=64))
            async for event in stream:
                if isinstance(event, ev.Progress) and event.job_id == slow:
                    break
            killed_at = time.monotonic()
            os.kill(worker.pids[1], signal.SIGKILL)
            failed = await engine.wait(slow)
            took = time.monotonic() - killed_at
            after = await engine.wait(engine.submit(request(model)))
            return (first, second, same_group, cancelled, third, kept_after_cancel, failed, took,
                    after, pids, worker.pids)

    (first, second, same_group, cancelled, third, kept_after_cancel, failed, took, after, pids,
     new_pids) = asyncio.run(asyncio.wait_for(main(), timeout=300))
    assert isinstance(first, ev.Finished), first
    assert np.array_equal(first.frames, single.frames)  # CFG parallel = one process
    assert isinstance(second, ev.Finished) and same_group  # the group stayed up
    assert first.environment["parallel"] == "cfg 2 (2 ranks)"
    assert isinstance(cancelled, ev.Cancelled) and 2 <= cancelled.during_step < 150
    assert isinstance(third, ev.Finished) and kept_after_cancel
    assert np.array_equal(third.frames, single.frames)
    assert isinstance(failed, ev.Failed) and failed.kind == ev.WORKER_DIED, failed
    assert "rank 1" in failed.message and took < 30
    assert isinstance(after, ev.Finished) and new_pids and new_pids != pids
    assert np.array_equal(after.frames, single.frames)


def test_ranks_die_with_a_studio_killed_outright(tmp_path):
    """A studio SIGKILLed with a rank group up must not leave its ranks (each holding a
    model on a GPU) waiting on their job queues forever."""
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    child = textwrap.dedent("""
        import os, signal, sys, time
        from studio.engine.parallel import ParallelConfig
        from studio.engine.parallel.worker import RankGroupWorker
        from studio.engine.worker import WorkerConfig

        if __name__ == "__main__":
            worker = RankGroupWorker(WorkerConfig(include_hf_cache=False),
                                     ParallelConfig(cfg_degree=2), timeout_s=10)
            worker._spawn()
            time.sleep(3)
            print(" ".join(map(str, worker.pids)), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    script = tmp_path / "studio_child.py"
    script.write_text(child)
    env = dict(os.environ, PYTHONPATH=str(root))
    proc = subprocess.run([sys.executable, str(script)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    pids = [int(p) for p in proc.stdout.split()]
    assert len(pids) == 2

    def alive(pid: int) -> bool:
        try:
            state = open(f"/proc/{pid}/status").read()
        except OSError:
            return False
        return "State:\tZ" not in state

    deadline = time.monotonic() + 30
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(alive(p) for p in pids)
