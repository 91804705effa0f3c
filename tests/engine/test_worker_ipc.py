"""A worker's child killed at any moment must not leave the parent blocked.

The cancel flag: a ``multiprocessing.Value``/``Event`` takes a process-shared lock on every read; a child
SIGKILLed inside that read leaves the lock held, and the parent's next cancel (or the next
job's reset of the flag) blocks forever on the event loop's thread. That froze a CI run in
the rank-group test. These children spin on the flag, so a kill almost always lands mid-read:
with a locked flag the parent's write hangs within a few rounds.

The event channel: a ``multiprocessing.Queue`` whose writer is killed halfway through a
message large enough to span several pipe writes (a preview of a big frame) leaves the
parent's ``get`` waiting forever for the rest, so the job is never failed and the engine
never dispatches again. The workers' pipe ends instead: the parent holds no writer."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time

import pytest

from studio.engine.parallel.config import ParallelConfig
from studio.engine.parallel.worker import RankGroupWorker
from studio.engine.worker import ProcessWorker, WorkerConfig, event_channel, receive


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


BIG = 20_000_000  # bytes: hundreds of pipe-buffer writes, so a kill lands mid-message


def _send_big(channel) -> None:
    channel.send(b"x" * BIG)
    time.sleep(60)


def _put_big(channel) -> None:
    channel.put(b"x" * BIG)
    time.sleep(60)


def _read_after_a_mid_message_kill(kind: str):
    """Starts a child writing one big message nobody reads yet, kills it, then reads with a
    5 s join: returns what the read gave (an exception's type name), or "blocked"."""
    ctx = mp.get_context("spawn")
    if kind == "channel":
        reader, writer = event_channel(ctx)
        child = ctx.Process(target=_send_big, args=(writer,), daemon=True)
        child.start()
        writer.close()
        read = lambda: receive(reader, 0.5)  # noqa: E731
    else:
        reader = ctx.Queue()
        child = ctx.Process(target=_put_big, args=(reader,), daemon=True)
        child.start()
        read = lambda: reader.get(timeout=0.5)  # noqa: E731
    time.sleep(1.5)  # the child is blocked in the middle of its write
    os.kill(child.pid, signal.SIGKILL)
    child.join(timeout=10)
    got: list = []

    def run() -> None:
        try:
            got.append(read())
        except Exception as exc:  # noqa: BLE001 - the type is the result
            got.append(type(exc).__name__)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=5)
    return "blocked" if thread.is_alive() else got[0]


def test_the_event_channel_reports_a_writer_killed_mid_message():
    assert _read_after_a_mid_message_kill("channel") == "OSError"


def test_a_queue_blocks_on_the_same_kill():
    """The check can fail: ``multiprocessing.Queue`` waits forever for the missing bytes."""
    assert _read_after_a_mid_message_kill("queue") == "blocked"


def test_a_finished_channel_gives_its_messages_then_eof():
    ctx = mp.get_context("spawn")
    reader, writer = event_channel(ctx)
    writer.send(("event", 1))
    writer.send(("event", 2))
    writer.close()
    assert receive(reader, 0.5) == ("event", 1)
    assert receive(reader, 0.5) == ("event", 2)
    with pytest.raises(EOFError):
        receive(reader, 0.5)


def test_result_folders_of_dead_studios_are_removed(tmp_path, monkeypatch):
    """A studio killed before close() leaves its ``studio-results-<pid>-*`` folder (finished
    frames as .npy) in /tmp; the next ProcessWorker removes it, and leaves alone a live
    process's folder and names it cannot read a pid from."""
    import os
    import subprocess
    import sys
    import tempfile
    import time

    from studio.engine.worker import ProcessWorker, remove_stale_result_dirs

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid that has exited (and been reaped)
    stale = tmp_path / f"studio-results-{gone.pid}-abc"
    live = tmp_path / f"studio-results-{os.getpid()}-def"
    odd = tmp_path / "studio-results-xyz-1"
    for folder in (stale, live, odd):
        folder.mkdir()
        (folder / "0.npy").write_bytes(b"frames")
    assert remove_stale_result_dirs(tmp_path) == []  # touched just now: it may be in use
    old = time.time() - 7 * 3600
    for folder in (stale, live, odd):
        os.utime(folder, (old, old))
    assert remove_stale_result_dirs(tmp_path) == [stale]
    assert not stale.exists() and live.exists() and odd.exists()
    stale.mkdir()
    os.utime(stale, (old, old))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    worker = ProcessWorker()  # its own folder, named by this pid; the stale one goes
    try:
        assert not stale.exists()
        assert os.path.basename(worker._result_dir).startswith(f"studio-results-{os.getpid()}-")
    finally:
        worker.close()
    assert not os.path.exists(worker._result_dir)
