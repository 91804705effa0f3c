"""Workers: the one owner of the device, in a thread or in a child process.

Both kinds take one job at a time from the engine (:mod:`studio.engine.api`), run it with a
:class:`~studio.engine.executor.JobExecutor`, and call ``on_event`` from a background thread
for every event. The engine keeps the queue; a worker only ever holds the running job.

* :class:`ThreadWorker`: in this process (the CLI, tests). Cheapest; a crash of the engine is
  a crash of the process.
* :class:`ProcessWorker`: a spawned child process (the studio). A crash of the child fails the
  running job with ``worker_died`` and the next job starts a new child; the child dies with
  its parent (``PR_SET_PDEATHSIG`` and a parent watchdog), so a killed UI leaves no orphan
  holding the GPU. Frames cross as ``.npy`` files read by a background thread, never through
  the pipe on the caller's thread.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import signal
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from studio.engine import events as ev
from studio.engine.parallel.config import ParallelConfig

EventFn = Callable[[ev.JobEvent], None]


#: ``auto``: CPU jobs run on the cores other programs leave free (see WorkerConfig).
CPU_THREADS_ENV = "STUDIO_CPU_THREADS"


def cpu_threads_auto() -> bool:
    """Whether ``STUDIO_CPU_THREADS`` asks for ``auto`` threads (any case, spaces ignored);
    unset or empty: torch's default thread count.

    Raises:
        ValueError: any other value (a typo would otherwise silently keep the default).
    """
    value = os.environ.get(CPU_THREADS_ENV, "")
    if value.strip().lower() in ("", "auto"):
        return value.strip().lower() == "auto"
    raise ValueError(f"{CPU_THREADS_ENV}={value!r}: must be auto (jobs on the cores other "
                     f"programs leave free) or unset (torch's default thread count)")


@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    """What a worker needs to build its executor (picklable, for child processes).

    Attributes:
        model_folders: the user's model folders.
        include_hf_cache: also resolve models from the HF cache.
        device: ``"auto"``, ``"cpu"`` or ``"cuda[:N]"``.
        torch_threads: intra-op threads (0: torch's default; with ``STUDIO_CPU_THREADS=auto``,
            on the CPU before each job, the cores other processes leave free:
            ``executor.cpu_threads_for_load``. Off by default: the thread count changes the
            last bit of the pixels, and a repeated request must match exactly).
        max_loaded: models kept loaded between jobs.
        preload: model ids a child-process worker loads as soon as it starts, so the first
            job does not wait for imports and loading (errors are left for that job to report).
        memory_budget_gb: device memory the engine may use, GiB (0: what is free).
        parallel: the multi-GPU plan; more than one rank runs each job on a rank group
            (:class:`~studio.engine.parallel.worker.RankGroupWorker`).
    """

    model_folders: tuple[str, ...] = ()
    include_hf_cache: bool = True
    device: str = "auto"
    torch_threads: int = 0
    max_loaded: int = 2
    preload: tuple[str, ...] = ()
    memory_budget_gb: float = 0.0
    parallel: ParallelConfig = ParallelConfig()

    def build_executor(self):
        import torch

        from studio.engine.executor import JobExecutor
        from studio.engine.models.registry import ModelRegistry

        if self.torch_threads:
            torch.set_num_threads(self.torch_threads)
        from studio.engine.executor import resolve_device

        device = resolve_device(self.device)
        registry = ModelRegistry(list(self.model_folders),
                                 include_hf_cache=self.include_hf_cache)
        executor = JobExecutor(registry, device, max_loaded=self.max_loaded,
                               memory_budget_bytes=int(self.memory_budget_gb * 2**30))
        try:
            auto = cpu_threads_auto()
        except ValueError:  # the studio and the CLI refuse it up front; never fail the engine
            auto = False
        executor.auto_cpu_threads = not self.torch_threads and auto
        return executor


def cancel_flag(ctx, initial: int):
    """A 64-bit integer in shared memory that a worker's child processes poll for cancels.

    Lock-free on purpose (``RawValue``, an aligned int64 whose loads and stores are atomic on
    x86-64 and arm64): a ``multiprocessing.Value``/``Event`` guards reads with a process-shared
    lock, and a child killed while reading (SIGKILL, the OOM killer) would leave that lock
    held forever, so the parent's next cancel or job start would block the event loop.

    Args:
        ctx: the multiprocessing context the children are spawned with.
        initial: the starting value.

    Returns:
        a ``ctypes.c_int64`` in shared memory; read and write it through ``.value``.
    """
    return ctx.RawValue("q", initial)


def event_channel(ctx):
    """A one-way pipe that carries a child's events to the parent: ``(reader, writer)``.

    Preferred to a ``multiprocessing.Queue`` because the end of the writer is visible: the
    parent closes its copy of ``writer`` once the child has started, so when the child exits
    (or is killed, even halfway through writing a large event) :func:`receive` raises instead
    of waiting forever for bytes that will never come, as ``Queue.get`` does.

    Args:
        ctx: the multiprocessing context the child is spawned with.

    Returns:
        ``(reader, writer)`` :class:`multiprocessing.connection.Connection` objects; give
        ``writer`` to one child only (messages larger than the pipe buffer from two writers
        would interleave) and close it in the parent after ``Process.start``.
    """
    return ctx.Pipe(duplex=False)


def receive(reader, timeout_s: float) -> Any | None:
    """The next message from an :func:`event_channel` reader, or None if none arrived within
    ``timeout_s`` seconds.

    Raises:
        EOFError: the writer is closed (the child exited) and every message has been read.
        OSError: the writer closed halfway through a message (the child was killed).
    """
    if not reader.poll(timeout_s):
        return None
    return reader.recv()


class Worker:
    """Interface of a worker. ``run`` and ``cancel`` never block."""

    def start(self, on_event: EventFn) -> None:
        raise NotImplementedError

    def run(self, job) -> None:
        raise NotImplementedError

    def cancel(self, job_id: str) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class ThreadWorker(Worker):
    """Runs jobs on a daemon thread of this process.

    Args:
        config: see :class:`WorkerConfig`; or pass ``executor`` directly (tests).
    """

    def __init__(self, config: WorkerConfig | None = None, executor=None):
        self.config = config or WorkerConfig()
        self.executor = executor
        self._jobs: queue.Queue = queue.Queue()
        self._cancelled: set[str] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._on_event: EventFn | None = None

    def start(self, on_event: EventFn) -> None:
        self._on_event = on_event
        self._thread = threading.Thread(target=self._loop, name="studio-engine", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if self.executor is None:
                try:
                    self.executor = self.config.build_executor()
                except Exception as exc:  # e.g. a broken torch install
                    self._on_event(ev.Failed(job.job_id, ev.INTERNAL,
                                             f"the engine could not start: {exc}"))
                    continue

            def is_cancelled(jid: str = job.job_id) -> bool:
                with self._lock:
                    return jid in self._cancelled

            self.executor.execute(job, self._on_event, is_cancelled)
            with self._lock:
                self._cancelled.discard(job.job_id)

    def run(self, job) -> None:
        self._jobs.put(job)

    def cancel(self, job_id: str) -> None:
        with self._lock:
            self._cancelled.add(job_id)

    def close(self) -> None:
        self._jobs.put(None)
        if self._thread is not None:
            self._thread.join(timeout=30)


# --------------------------------------------------------------------------------------------
# Child process
# --------------------------------------------------------------------------------------------
def _die_with_parent(parent_pid: int) -> None:
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass

    def watchdog() -> None:
        import time

        while True:
            if os.getppid() != parent_pid:
                os._exit(3)
            time.sleep(0.5)

    threading.Thread(target=watchdog, daemon=True).start()
    if os.getppid() != parent_pid:
        os._exit(3)


def _child_main(config: WorkerConfig, jobs, events, cancel_serial, parent_pid: int,
                result_dir: str) -> None:
    _die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C is the parent's to handle
    try:
        executor = config.build_executor()
    except ValueError as exc:  # a setting this machine cannot honour (e.g. cuda, no GPU)
        events.send(("ready", os.getpid()))
        while (item := jobs.get()) is not None:  # fail each job with the reason, stay up
            events.send(("event", ev.Failed(item[1].job_id, ev.BAD_INPUT,
                                            f"engine settings: {exc}")))
        return
    for model_id in config.preload:
        try:
            executor.runner_for(executor.registry.resolve(model_id))
        except Exception:  # the first job that names it reports the problem
            pass
    events.send(("ready", os.getpid()))
    while True:
        item = jobs.get()
        if item is None:
            return
        serial, job = item

        def emit(event: ev.JobEvent) -> None:
            if isinstance(event, ev.Finished):
                path = os.path.join(result_dir, f"{event.job_id}.npy")
                np.save(path, event.frames, allow_pickle=False)
                event = dataclasses.replace(event, frames=np.zeros((0, 0, 0, 3), np.uint8))
                events.send(("finished", path, event))
            else:
                events.send(("event", event))

        executor.execute(job, emit, lambda s=serial: cancel_serial.value == s)


RESULT_DIR_PREFIX = "studio-results-"


#: a dead owner's result folder is removed only once untouched this long: a studio in
#: another pid namespace (a container or flatpak sharing /tmp) looks dead from here
STALE_RESULT_DIR_S = 6 * 3600.0


def remove_stale_result_dirs(root: str | os.PathLike[str] | None = None,
                             min_age_s: float = STALE_RESULT_DIR_S) -> list[Path]:
    """Removes the result folders (``studio-results-<pid>-*`` under the temporary folder,
    or ``root``) of studios that are no longer running: a killed studio cannot remove its
    own, and a finished job's frames (``.npy``, megabytes to gigabytes) would stay in /tmp.
    Folders of live processes, folders touched in the last ``min_age_s`` seconds, other
    users' folders, links and names without a pid are left alone. Returns the folders
    removed."""
    import shutil
    import time

    removed = []
    base = Path(root if root is not None else tempfile.gettempdir())
    try:
        candidates = list(base.glob(f"{RESULT_DIR_PREFIX}*-*"))
    except OSError:
        return removed
    for folder in candidates:
        pid_text = folder.name[len(RESULT_DIR_PREFIX):].split("-", 1)[0]
        if not (pid_text.isascii() and pid_text.isdigit()) or folder.is_symlink():
            continue
        try:
            os.kill(int(pid_text), 0)
            continue  # alive
        except ProcessLookupError:
            pass  # gone: its folder is stale
        except (PermissionError, OverflowError, ValueError):
            continue  # another user's process, or not a pid
        try:
            st = folder.lstat()
        except OSError:
            continue
        if st.st_uid != os.getuid() or time.time() - st.st_mtime < min_age_s:
            continue  # another user's folder (a shared /tmp), or one in use lately
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


class ProcessWorker(Worker):
    """Runs jobs in a spawned child process (see the module docstring)."""

    def __init__(self, config: WorkerConfig | None = None):
        import multiprocessing as mp

        self.config = config or WorkerConfig()
        self._ctx = mp.get_context("spawn")
        self._cancel = cancel_flag(self._ctx, -1)
        remove_stale_result_dirs()
        # the owner's pid in the name: a studio killed before close() leaves its folder,
        # and the next one removes it (remove_stale_result_dirs)
        self._result_dir = tempfile.mkdtemp(prefix=f"{RESULT_DIR_PREFIX}{os.getpid()}-")
        self._proc = None
        self._jobs = None
        self._events = None
        self._reader: threading.Thread | None = None
        self._on_event: EventFn | None = None
        self._running: tuple[int, str] | None = None
        self._serial = 0
        self._lock = threading.Lock()
        self._closing = False

    @property
    def pid(self) -> int | None:
        """The child's process id (None before the first job)."""
        return self._proc.pid if self._proc is not None else None

    def start(self, on_event: EventFn) -> None:
        """Starts the child at once, so imports and preloading overlap the user's typing."""
        self._on_event = on_event
        with self._lock:
            if self._proc is None:
                self._spawn()

    def _spawn(self) -> None:
        self._jobs = self._ctx.Queue()
        self._events, writer = event_channel(self._ctx)
        self._proc = self._ctx.Process(
            target=_child_main, name="studio-engine",
            args=(self.config, self._jobs, writer, self._cancel, os.getpid(),
                  self._result_dir), daemon=True)
        self._proc.start()
        writer.close()  # the child holds the only writer: its exit ends the channel
        self._reader = threading.Thread(target=self._read, args=(self._proc, self._events),
                                        name="studio-engine-reader", daemon=True)
        self._reader.start()

    def _read(self, proc, events) -> None:
        exited = False
        while True:
            try:  # what the child sent before it died is read first, then EOFError
                item: Any = receive(events, 0.2)
            except (EOFError, OSError):  # exited, or killed halfway through a message
                proc.join(timeout=2)  # reap it, for its exit code
                self._child_died(proc)
                events.close()
                return
            if item is None:
                if proc.is_alive():
                    continue
                if not exited:  # one more poll: what it wrote before exiting is there
                    exited = True
                    continue
                self._child_died(proc)  # exited, yet a grandchild holds the writer open
                return
            kind = item[0]
            if kind == "ready":
                continue
            if kind == "finished":
                _, path, event = item
                frames = np.load(path, allow_pickle=False)
                Path(path).unlink(missing_ok=True)
                event = dataclasses.replace(event, frames=frames)
            else:
                event = item[1]
            if event.terminal:
                with self._lock:
                    if self._running and self._running[1] == event.job_id:
                        self._running = None
            self._on_event(event)

    def _child_died(self, proc) -> None:
        with self._lock:
            running, self._running = self._running, None
            if self._proc is proc:
                self._proc = None
        if running is not None and not self._closing:
            code = proc.exitcode
            self._on_event(ev.Failed(
                running[1], ev.WORKER_DIED,
                f"the engine process stopped unexpectedly (exit code {code}) while running this "
                f"job; the next job starts a new engine"))

    def run(self, job) -> None:
        with self._lock:
            if self._proc is None or not self._proc.is_alive():
                self._spawn()
            self._serial += 1
            self._running = (self._serial, job.job_id)
            self._jobs.put((self._serial, job))

    def cancel(self, job_id: str) -> None:
        with self._lock:
            if self._running and self._running[1] == job_id:
                self._cancel.value = self._running[0]

    def kill(self) -> None:
        """Kills the child process at once (tests; the next job starts a new one)."""
        proc = self._proc
        if proc is not None and proc.pid:
            os.kill(proc.pid, signal.SIGKILL)

    def close(self) -> None:
        self._closing = True
        proc = self._proc
        if proc is not None:
            try:
                self._jobs.put(None)
                proc.join(timeout=10)
            finally:
                if proc.is_alive():
                    proc.kill()
                    proc.join(timeout=5)
        try:
            for p in Path(self._result_dir).iterdir():
                p.unlink(missing_ok=True)
            os.rmdir(self._result_dir)
        except OSError:
            pass
