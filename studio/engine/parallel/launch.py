"""Rank groups on torch.distributed: spawn ``n`` processes on this machine (loopback only),
NCCL on GPUs, gloo on the CPU, with short collective timeouts so a dead rank fails fast.

Nothing here changes the environment at import time; the spawned ranks set the rendezvous
variables in their own processes only.
"""

from __future__ import annotations

import datetime
import os
import socket
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for :func:`init_loopback_group`'s rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_LISTENERS: list[socket.socket] = []  # rank 0's rendezvous socket lives as long as its store


def init_loopback_group(backend: str, rank: int, world: int, port: int,
                        timeout_s: float) -> None:
    """``dist.init_process_group`` for ranks on this machine that listens on loopback only.

    torch's default rendezvous (``MASTER_ADDR``/``MASTER_PORT``, env://) makes rank 0's
    TCPStore server listen on every interface (``*:port``), with no authentication, for as
    long as the group lives. Here rank 0 binds the socket to 127.0.0.1 itself and hands it to
    the store (``master_listen_fd``); the other ranks connect to it. Gloo's and NCCL's own
    bootstrap sockets are pinned to the loopback interface (``GLOO_SOCKET_IFNAME`` /
    ``NCCL_SOCKET_IFNAME`` = ``lo``; NCCL still moves tensors over NVLink/PCIe within the
    machine). Sets those variables in this process only (a rank).

    Args:
        port: the rendezvous port (:func:`free_port`, chosen by the parent).
        timeout_s: the store's and the collectives' timeout, in seconds.
    Raises:
        OSError: rank 0 cannot bind 127.0.0.1:``port`` (taken meanwhile).
        RuntimeError / DistNetworkError: the rendezvous failed or timed out.
    """
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    os.environ["NCCL_SOCKET_IFNAME"] = "lo"
    timeout = datetime.timedelta(seconds=timeout_s)
    if rank == 0:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(max(16, world))
        _LISTENERS.append(listener)
        store = dist.TCPStore("127.0.0.1", port, world, True, timeout,
                              master_listen_fd=listener.fileno())
    else:
        store = dist.TCPStore("127.0.0.1", port, world, False, timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)


def _portable(value, to_numpy: bool):
    """Tensors <-> numpy arrays through nested tuples/lists/dicts: results cross the process
    boundary as plain pickles (torch's shared-memory handles die with the rank)."""
    import numpy as np

    if to_numpy and isinstance(value, torch.Tensor):
        return ("__tensor__", value.detach().cpu().numpy().copy())
    if not to_numpy and isinstance(value, tuple) and len(value) == 2 and \
            isinstance(value[0], str) and value[0] == "__tensor__" and \
            isinstance(value[1], np.ndarray):
        return torch.from_numpy(value[1])
    if isinstance(value, dict):
        return {k: _portable(v, to_numpy) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_portable(v, to_numpy) for v in value)
    return value


def run_ranks(fn: Callable, world_size: int, *args, backend: str | None = None,
              timeout_s: float = 60.0) -> list:
    """Runs ``fn(rank, world_size, *args)`` once on ``world_size`` freshly spawned ranks;
    returns the results by rank (a :class:`RankGroup` used once).

    Raises:
        RuntimeError: a rank failed or died (names it and why).
    """
    with RankGroup(world_size, backend=backend, timeout_s=timeout_s) as group:
        return group.run(fn, *args)


def _group_rank(rank: int, world: int, port: int, backend: str, timeout_s: float, tasks,
                results) -> None:
    torch.set_num_threads(1)
    init_loopback_group(backend, rank, world, port, timeout_s)
    try:
        while True:
            task = tasks.get()
            if task is None:
                break
            fn, args = task
            try:
                results.put((rank, "ok", _portable(fn(rank, world, *args), True)))
            except Exception as exc:  # reported; the rank stays up for the next task
                results.put((rank, "error", f"{type(exc).__name__}: {exc}"))
    finally:
        dist.destroy_process_group()


class RankGroup:
    """A long-lived group of ``world_size`` spawned ranks that runs one function at a time
    on every rank (the test modules start one group and reuse it: spawning and importing
    torch in each rank costs seconds).

    Args:
        world_size: ranks (processes) in the group.
        backend: "nccl" on GPUs, "gloo" on the CPU (default: picked from the machine).
        timeout_s: the collective timeout; :meth:`run` waits up to 4× this for results.

    Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, world_size: int, *, backend: str | None = None, timeout_s: float = 60.0):
        self.world_size = world_size
        self.timeout_s = timeout_s
        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        ctx = mp.get_context("spawn")
        self._results = ctx.Queue()
        self._tasks = [ctx.Queue() for _ in range(world_size)]
        port = free_port()
        self._procs = [ctx.Process(target=_group_rank, daemon=True,
                                   args=(r, world_size, port, backend, timeout_s,
                                         self._tasks[r], self._results))
                       for r in range(world_size)]
        for p in self._procs:
            p.start()

    def run(self, fn: Callable, *args) -> list:
        """Runs ``fn(rank, world_size, *args)`` on every rank; returns the results by rank.

        Raises:
            RuntimeError: a rank raised (names it and the error) or stopped.
        """
        for q in self._tasks:
            q.put((fn, args))
        results: dict[int, object] = {}
        errors = []
        for _ in range(self.world_size):
            try:
                rank, status, value = self._results.get(timeout=self.timeout_s * 4)
            except Exception:
                errors.append("a rank stopped without reporting (killed or crashed)")
                break
            if status == "ok":
                results[rank] = _portable(value, False)
            else:
                errors.append(f"rank {rank}: {value}")
        if errors or len(results) != self.world_size:
            raise RuntimeError("parallel task failed: " + "; ".join(errors or ["missing"]))
        return [results[r] for r in range(self.world_size)]

    def close(self) -> None:
        """Stops the ranks (kills any that do not exit within the timeout)."""
        for q in self._tasks:
            q.put(None)
        for p in self._procs:
            p.join(timeout=self.timeout_s)
            if p.is_alive():
                p.kill()

    def __enter__(self) -> RankGroup:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
