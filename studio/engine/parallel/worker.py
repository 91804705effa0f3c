"""A worker that runs every job on a long-lived group of ranks (one job split over devices).

The engine talks to :class:`RankGroupWorker` like to any worker. The worker spawns
``parallel.world_size`` processes on this machine (rendezvous on 127.0.0.1 only; NCCL on
GPUs, gloo on the CPU, collectives time out after ``timeout_s``), each with its own executor
on its own device; the ranks form a ``(cfg, ring, ulysses)`` mesh
(:class:`~studio.engine.parallel.mesh.ParallelMesh`). Each job goes to every rank, every
rank runs it with the same seed and the parallel plan applied to its denoisers (CFG parallel,
Ulysses, ring, or CFG × a sequence plan), and rank 0 reports the events. The group stays up
between jobs (models stay loaded). If a rank dies, the running job fails with a clear
message at once (the ranks' processes are watched, whatever the collective timeout), the
group is torn down, and the next job gets a new group. Ranks die with the process that
spawned them.

Cancelling keeps the group up: the ranks agree on the step to stop at (each step they
all-reduce a lock-free cancel flag the worker sets in shared memory), so all leave the
denoising loop together. Only a group that does not stop within the collective timeout is
torn down.

Nothing changes in the parent's environment: the rendezvous variables are set in the ranks.
"""

from __future__ import annotations

import os
import threading
from dataclasses import replace

from studio.engine import events as ev
from studio.engine.parallel.config import (
    ParallelConfig,
    ParallelConfigError,
    describe_plan,
    visible_gpus,
)
from studio.engine.worker import (
    EventFn,
    Worker,
    WorkerConfig,
    cancel_flag,
    event_channel,
    receive,
)

MAX_CPU_RANKS = 8  # gloo ranks on a machine without GPUs (the plans' tests use 2 and 4)


def apply_parallel_plan(runner, parallel: ParallelConfig, mesh=None) -> None:
    """Applies ``parallel`` to a freshly loaded runner's denoisers (on every rank).

    Args:
        runner: the family runner (its ``denoisers()`` get the plan).
        parallel: the degrees.
        mesh: the group's :class:`~studio.engine.parallel.mesh.ParallelMesh` (default: the
            whole world as one CFG pair or one sequence group).
    Raises:
        ParallelConfigError: the plan splits the guidance branches (cfg_degree 2) of a
            guidance-distilled family, which runs one branch per step (the second rank of
            each pair would idle), or the denoiser does not take the plan.
    """
    from studio.engine.parallel.cfg import apply_cfg_parallel
    from studio.engine.parallel.sequence import apply_sequence_parallel

    if parallel.cfg_degree == 2 and not getattr(runner, "classifier_free_guidance", True):
        raise ParallelConfigError(
            f"cfg parallel: {runner.entry.family} is guidance-distilled and runs one guidance "
            f"branch per step, so the second GPU of each pair would idle; choose a ulysses or "
            f"ring (sequence) plan in Settings")
    for module in runner.denoisers():
        if parallel.sequence_degree > 1:
            apply_sequence_parallel(module, parallel, mesh)
        if parallel.cfg_degree == 2:
            apply_cfg_parallel(module, mesh.cfg_group if mesh is not None else None)


def _rank_main(rank, world, port, backend, timeout_s, config, parallel, jobs, events, cancel,
               parent_pid=None):
    import torch
    import torch.distributed as dist

    from studio.engine.worker import _die_with_parent

    if parent_pid is not None:  # a studio killed outright takes its ranks (and GPUs) along
        _die_with_parent(parent_pid)
    from studio.engine.parallel.launch import init_loopback_group
    from studio.engine.parallel.mesh import ParallelMesh

    if not torch.cuda.is_available():
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
    init_loopback_group(backend, rank, world, port, timeout_s)
    device = f"cuda:{rank}" if torch.cuda.is_available() else "cpu"
    mesh = ParallelMesh.build(parallel)
    executor = replace(config, device=device).build_executor()
    executor.parallel_plan = describe_plan(parallel)
    executor.on_runner_loaded = lambda runner: apply_parallel_plan(runner, parallel, mesh)
    if events is not None:
        events.send(("ready", rank))
    flag = torch.zeros(1, dtype=torch.int32, device=device)

    def is_cancelled() -> bool:
        if world == 1:  # nobody to agree with: no collective, no host sync per step
            return bool(cancel.value)
        # every rank asks at the same points (job start, each step): agree on the answer
        flag.fill_(1 if cancel.value else 0)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def emit(event):
        if events is not None:  # rank 0 reports
            events.send(("event", event))

    try:
        while True:
            job = jobs.get()
            if job is None:
                break
            executor.execute(job, emit, is_cancelled)
    finally:
        dist.destroy_process_group()


def _died(dead: list[int]) -> str:
    ranks = ", ".join(str(i) for i in dead)
    return (f"rank {ranks} of the parallel group stopped during the job; the group is "
            f"restarted for the next job")


class RankGroupWorker(Worker):
    """Runs each job on ``parallel.world_size`` ranks (see the module docstring).

    Args:
        config: the executor configuration every rank builds (its device is set per rank).
        parallel: the degrees (cfg × ring × ulysses ranks; replicas are separate workers).
        timeout_s: the collectives' timeout. Long by default: the first collective of a job
            waits for every rank to load its model (8 ranks reading a 14B checkpoint from a
            cold disk differ by minutes), and a timed-out NCCL collective aborts the group. A
            rank that dies fails the job at once all the same: the ranks' processes are
            watched.
        cancel_grace_s: how long a cancelled job may take to reach its next step (the ranks
            stop together at a step) before the group is torn down and the job reported
            cancelled.

    Raises:
        ParallelConfigError: replicas > 1 (use ``Engine.for_devices``) or invalid degrees.
    """

    def __init__(self, config: WorkerConfig | None = None,
                 parallel: ParallelConfig | None = None, *, timeout_s: float = 900.0,
                 cancel_grace_s: float = 120.0):
        import multiprocessing as mp

        self.config = config or WorkerConfig()
        if parallel is None:
            parallel = (self.config.parallel if self.config.parallel.world_size > 1
                        else ParallelConfig(cfg_degree=2))
        self.parallel = parallel
        if self.parallel.replicas != 1:
            raise ParallelConfigError("replicas: a rank group runs one job at a time; use "
                                      "Engine.for_devices for independent replicas")
        gpus = visible_gpus()
        on_gpus = gpus > 0 and self.config.device != "cpu"
        # gloo ranks on the CPU are for testing the plans: a few, not one per core
        self.parallel.validate(devices=gpus if on_gpus else MAX_CPU_RANKS)
        self.timeout_s = timeout_s
        self.cancel_grace_s = cancel_grace_s
        self._ctx = mp.get_context("spawn")
        self._procs: list | None = None
        self._jobs: list | None = None
        self._events = None
        self._on_event: EventFn | None = None
        self._running: str | None = None
        self._lock = threading.Lock()
        self._closing = False
        self._cancel = cancel_flag(self._ctx, 0)  # 1: stop the running job (no lock: see there)

    @property
    def pids(self) -> list[int]:
        """The ranks' process ids (empty when no group is up)."""
        return [p.pid for p in self._procs] if self._procs else []

    def start(self, on_event: EventFn) -> None:
        self._on_event = on_event

    def _spawn(self) -> None:
        import torch

        from studio.engine.parallel.launch import free_port

        world = self.parallel.world_size
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        port = free_port()
        self._jobs = [self._ctx.Queue() for _ in range(world)]
        self._events, writer = event_channel(self._ctx)
        self._procs = [self._ctx.Process(
            target=_rank_main, name=f"studio-rank-{r}", daemon=True,
            args=(r, world, port, backend, self.timeout_s, self.config, self.parallel,
                  self._jobs[r], writer if r == 0 else None, self._cancel, os.getpid()))
            for r in range(world)]
        for p in self._procs:
            p.start()
        writer.close()  # rank 0 holds the only writer: its exit ends the channel
        threading.Thread(target=self._read, args=(self._procs, self._events),
                         name="studio-ranks-reader", daemon=True).start()

    def _read(self, procs, events) -> None:
        dead_seen = False
        while True:
            try:
                item = receive(events, 0.2)
            except (EOFError, OSError):  # rank 0 exited, or was killed mid-message
                self._group_died(procs, self._dead_ranks(procs, wait_s=2.0) or [0])
                events.close()
                return
            if item is None:
                dead = [i for i, p in enumerate(procs) if not p.is_alive()]
                if dead and dead_seen:  # polled once more: what rank 0 sent has been read
                    self._group_died(procs, dead)
                    return
                dead_seen = bool(dead)
                continue
            kind, payload = item
            if kind != "event":
                continue
            if payload.terminal:
                dead = self._dead_ranks(procs, wait_s=1.0 if isinstance(payload, ev.Failed)
                                        else 0.0)
                if dead:  # the job failed because a rank died: say so, restart the group
                    self._teardown(procs)
                    payload = ev.Failed(payload.job_id, ev.WORKER_DIED, _died(dead))
                with self._lock:
                    if self._running == payload.job_id:
                        self._running = None
                if self._on_event is not None:
                    self._on_event(payload)
                if dead:
                    return
                continue
            if self._on_event is not None:
                self._on_event(payload)

    @staticmethod
    def _dead_ranks(procs, wait_s: float = 0.0) -> list[int]:
        """Ranks whose process has exited (waiting up to ``wait_s`` for one to)."""
        import time

        deadline = time.monotonic() + wait_s
        while True:
            dead = [i for i, p in enumerate(procs) if not p.is_alive()]
            if dead or time.monotonic() >= deadline:
                return dead
            time.sleep(0.05)

    def _teardown(self, procs) -> None:
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(timeout=5)
        with self._lock:
            if self._procs is procs:
                self._procs = self._jobs = self._events = None

    def _group_died(self, procs, dead: list[int]) -> None:
        self._teardown(procs)
        with self._lock:
            running, self._running = self._running, None
        if running is not None and not self._closing and self._on_event is not None:
            self._on_event(ev.Failed(running, ev.WORKER_DIED, _died(dead)))

    def run(self, job) -> None:
        if self.parallel.cfg_degree == 2 and job.request.guidance_scale <= 1.0:
            if self._on_event is not None:  # nothing for the second branch's rank to do
                self._on_event(ev.Failed(job.job_id, ev.BAD_INPUT, (
                    f"guidance_scale: {job.request.guidance_scale} runs one branch, but the "
                    f"multi-GPU plan {describe_plan(self.parallel)} splits the two guidance "
                    f"branches; use a guidance scale > 1 or another plan in Settings")))
            return
        with self._lock:
            procs = self._procs
        if procs is not None and self._dead_ranks(procs):
            self._teardown(procs)
        with self._lock:
            if self._procs is None:
                self._spawn()
            self._running = job.job_id
            jobs = self._jobs
            self._cancel.value = 0
        for q in jobs:
            q.put(job)

    def cancel(self, job_id: str) -> None:
        """Asks the ranks to stop ``job_id`` at their next step (they agree on which); the
        group stays up. A group that has not stopped within ``cancel_grace_s`` is torn down
        and the job reported cancelled."""
        with self._lock:
            running = self._running == job_id
            procs = self._procs
        if not running or procs is None:
            return
        self._cancel.value = 1

        def stuck() -> None:
            with self._lock:
                still = self._running == job_id and self._procs is procs
                if still:
                    self._running = None
            if still:
                self._teardown(procs)
                if self._on_event is not None:
                    self._on_event(ev.Cancelled(job_id, 0))

        timer = threading.Timer(self.cancel_grace_s, stuck)
        timer.daemon = True
        timer.start()

    def close(self) -> None:
        self._closing = True
        with self._lock:
            procs, jobs = self._procs, self._jobs
        if procs is None:
            return
        for q in jobs:
            q.put(None)
        for p in procs:
            p.join(timeout=10)
        self._teardown(procs)
