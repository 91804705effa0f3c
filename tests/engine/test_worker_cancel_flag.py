"""A child killed while it polls the cancel flag must not leave the parent blocked.

A ``multiprocessing.Value``/``Event`` takes a process-shared lock on every read; a child
SIGKILLed inside that read leaves the lock held, and the parent's next cancel (or the next
job's reset of the flag) blocks forever on the event loop's thread. That froze a CI run in
the rank-group test. These children spin on the flag, so a kill almost always lands mid-read:
with a locked flag the parent's write hangs within a few rounds."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time

import pytest

from studio.engine.parallel.config import ParallelConfig
from studio.engine.parallel.worker import RankGroupWorker
from studio.engine.worker import ProcessWorker, WorkerConfig


def _poll_forever(flag) -> None:
    while True:
        flag.value  # noqa: B018 - the read is the point


def _kill_readers_then_write(flag, rounds: int = 4) -> None:
    ctx = mp.get_context("spawn")
    for i in range(rounds):
        child = ctx.Process(target=_poll_forever, args=(flag,), daemon=True)
        child.start()
        time.sleep(0.3)
        os.kill(child.pid, signal.SIGKILL)
        child.join(timeout=10)
        writer = threading.Thread(target=setattr, args=(flag, "value", i), daemon=True)
        writer.start()
        writer.join(timeout=5)
        assert not writer.is_alive(), f"round {i}: writing the flag blocked after a kill"
        assert flag.value == i


@pytest.mark.parametrize("kind", ["process", "rank-group"])
def test_a_child_killed_mid_poll_leaves_the_cancel_flag_usable(kind):
    if kind == "process":
        worker = ProcessWorker(WorkerConfig(include_hf_cache=False))
    else:
        worker = RankGroupWorker(WorkerConfig(include_hf_cache=False),
                                 ParallelConfig(cfg_degree=2), timeout_s=10)
    try:
        _kill_readers_then_write(worker._cancel)  # the very object the children poll
    finally:
        worker.close()


def test_the_check_catches_a_locked_flag():
    """The same check on ``multiprocessing.Value`` (locked reads) hangs: it can fail."""
    flag = mp.get_context("spawn").Value("q", -1)
    with pytest.raises(AssertionError, match="blocked after a kill"):
        _kill_readers_then_write(flag, rounds=16)  # ~half the kills land mid-read
