"""The engine's narrow interface: submit a request, stream events, cancel.

Every caller (the CLI, the studio, the tests, the benchmarks) goes through :class:`Engine`::

    async with Engine() as engine:
        job = engine.submit(request, inputs)
        async for event in engine.events():
            ...
        # or: final = await engine.wait(job)

The engine holds the queue (jobs run one at a time, in submission order unless reordered) and
a worker that owns the device (:mod:`studio.engine.worker`). ``submit``, ``cancel`` and
``reorder`` never block; events are delivered on the event loop the engine was first used
from. This module imports neither torch nor diffusers, so the UI can import it cheaply.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import deque
from collections.abc import Mapping

import numpy as np

from studio.core.request import GenerationRequest
from studio.engine import events as ev
from studio.engine.attention_config import (  # the STUDIO_ATTENTION switch, checked up front
    ATTENTION_ENV,
    attention_override,
)
from studio.engine.parallel.config import (  # the multi-GPU plans, for the studio's settings
    ParallelConfig,
    available_plans,
    describe_plan,
    visible_gpus,
)
from studio.engine.worker import ProcessWorker, ThreadWorker, Worker, WorkerConfig

__all__ = ["ATTENTION_ENV", "Engine", "EventStream", "ParallelConfig", "attention_override",
           "available_plans", "describe_plan", "visible_gpus"]


class EventStream:
    """An async iterator over engine events, subscribed when created; ``aclose()`` (or leaving
    an ``async with``) unsubscribes."""

    def __init__(self, engine: Engine):
        self._engine = engine
        self._queue: asyncio.Queue = asyncio.Queue()
        engine._subscribers.append(self._queue)
        self._open = True

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> ev.JobEvent:
        if not self._open:
            raise StopAsyncIteration
        item = await self._queue.get()
        if item is None:
            self.aclose_nowait()
            raise StopAsyncIteration
        return item

    def aclose_nowait(self) -> None:
        if self._open:
            self._open = False
            if self._queue in self._engine._subscribers:
                self._engine._subscribers.remove(self._queue)

    async def aclose(self) -> None:
        self.aclose_nowait()

    async def __aenter__(self) -> EventStream:
        return self

    async def __aexit__(self, *exc) -> None:
        self.aclose_nowait()


class Engine:
    """Queue + workers + event fan-out.

    One worker per device (data parallelism: independent jobs run at once, each on the first
    free worker, in queue order); a single worker by default.

    Args:
        worker: the worker to use (default: a :class:`ThreadWorker`), or ``workers``.
        config: used to build the default worker(s); a ``config.parallel`` plan of more
            than one rank builds a rank-group worker.
        in_process: with no ``worker``, ``False`` runs the engine in a child process.
        workers: several workers (e.g. one per GPU, see :meth:`for_devices`).

    Raises:
        ParallelConfigError: ``config.parallel`` has degrees below 1 or more ranks than the
            machine's GPUs (gloo CPU ranks: at most 8).
    """

    def __init__(self, worker: Worker | None = None, *, config: WorkerConfig | None = None,
                 in_process: bool = True, workers: list[Worker] | None = None):
        if workers is None:
            if worker is None:
                config = config or WorkerConfig()
                if config.parallel != ParallelConfig():  # one job split over a group of ranks
                    config.parallel.validate(devices=config.parallel.world_size)
                    from studio.engine.parallel.worker import RankGroupWorker

                    worker = RankGroupWorker(config, config.parallel)
                else:
                    worker = ThreadWorker(config) if in_process else ProcessWorker(config)
            workers = [worker]
        if not workers:
            raise ValueError("workers: at least one worker is needed")
        self.workers = list(workers)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: deque = deque()
        self._running: dict[str, int] = {}  # job id -> worker index
        self._subscribers: list[asyncio.Queue] = []
        self._final: dict[str, asyncio.Future] = {}
        self._closed = False

    @classmethod
    def for_devices(cls, devices: list[str], *, config: WorkerConfig | None = None,
                    in_process: bool = False) -> Engine:
        """One worker per device (``["cuda:0", "cuda:1"]``): jobs spread over them.

        Raises:
            ValueError: an empty or repeated device list.
        """
        from dataclasses import replace

        if not devices or len(set(devices)) != len(devices):
            raise ValueError(f"devices: {devices!r} must be a non-empty list without repeats")
        config = config or WorkerConfig()
        kind = ThreadWorker if in_process else ProcessWorker
        return cls(workers=[kind(replace(config, device=d)) for d in devices])

    @property
    def worker(self) -> Worker:
        """The first worker (the only one unless several devices were given)."""
        return self.workers[0]

    # -- lifecycle --------------------------------------------------------------------------
    def _bind(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            for w in self.workers:
                w.start(self._from_worker)
        return self._loop

    async def __aenter__(self) -> Engine:
        self._bind()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Cancels queued jobs and stops the worker (waits for the running step to end)."""
        if self._closed:
            return
        self._closed = True
        for job in list(self._pending):
            self.cancel(job.job_id)
        for job_id, index in list(self._running.items()):
            self.workers[index].cancel(job_id)
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(None, w.close) for w in self.workers))
        for q in self._subscribers:
            q.put_nowait(None)

    # -- the API ----------------------------------------------------------------------------
    def submit(self, request: GenerationRequest,
               inputs: Mapping[str, np.ndarray] | None = None) -> str:
        """Queues a job; returns its id at once. Problems surface as a ``Failed`` event.

        Args:
            request: the request.
            inputs: content id -> uint8 pixels of every input image the request names.
        Raises:
            RuntimeError: the engine was closed.
        """
        from studio.engine.job import Job

        if self._closed:
            raise RuntimeError("the engine is closed")
        loop = self._bind()
        job = Job(uuid.uuid4().hex, request, dict(inputs or {}))
        self._final[job.job_id] = loop.create_future()
        self._pending.append(job)
        self._publish(ev.Queued(job.job_id, position=len(self._pending) - 1 +
                                len(self._running)))
        self._dispatch()
        return job.job_id

    def cancel(self, job_id: str) -> bool:
        """Cancels a queued or running job (a running one stops within one denoising step).

        Returns:
            False if the job is unknown or already over.
        """
        for job in self._pending:
            if job.job_id == job_id:
                self._pending.remove(job)
                self._publish(ev.Cancelled(job_id, 0))
                return True
        if job_id in self._running:
            self.workers[self._running[job_id]].cancel(job_id)
            return True
        return False

    def reorder(self, job_id: str, position: int) -> bool:
        """Moves a queued job to ``position`` (0 = next). False if it is not queued."""
        for job in self._pending:
            if job.job_id == job_id:
                self._pending.remove(job)
                self._pending.insert(max(0, min(position, len(self._pending))), job)
                return True
        return False

    @property
    def queued(self) -> list[str]:
        """Ids of the jobs waiting, in the order they will run."""
        return [job.job_id for job in self._pending]

    @property
    def running(self) -> str | None:
        """The running job (the earliest started one when several workers run)."""
        return next(iter(self._running), None)

    @property
    def running_jobs(self) -> list[str]:
        """Every running job, one per busy worker."""
        return list(self._running)

    def events(self) -> EventStream:
        """Every event of every job from the moment of this call, in order, until the engine
        is closed. Subscribe before submitting to see a job's ``Queued`` event::

            stream = engine.events()
            job = engine.submit(request)
            async for event in stream: ...
        """
        self._bind()
        return EventStream(self)

    async def wait(self, job_id: str) -> ev.JobEvent:
        """The terminal event (Finished, Failed or Cancelled) of ``job_id``."""
        return await asyncio.shield(self._final[job_id])

    # -- internals (all on the event loop) --------------------------------------------------
    def _from_worker(self, event: ev.JobEvent) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._on_worker_event, event)

    def _on_worker_event(self, event: ev.JobEvent) -> None:
        self._publish(event)
        if event.terminal and event.job_id in self._running:
            del self._running[event.job_id]
            self._dispatch()

    def _publish(self, event: ev.JobEvent) -> None:
        for q in self._subscribers:
            q.put_nowait(event)
        if event.terminal:
            fut = self._final.get(event.job_id)
            if fut is not None and not fut.done():
                fut.set_result(event)

    def _dispatch(self) -> None:
        busy = set(self._running.values())
        for index, worker in enumerate(self.workers):
            if not self._pending or self._closed:
                return
            if index in busy:
                continue
            job = self._pending.popleft()
            self._running[job.job_id] = index
            worker.run(job)
