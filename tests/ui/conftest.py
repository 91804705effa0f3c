"""Fixtures for the studio UI tests: a qasync loop, a real engine on the embedded model (one
loaded executor for the session, a fresh thread-worker engine per window), real projects."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import shiboken6
from PySide6.QtCore import QCoreApplication, QEvent

from studio.store.project import Project


@pytest.fixture(scope="session")
def executor():
    """The embedded model, loaded once and shared by every test's engine."""
    from studio.engine.executor import JobExecutor
    from studio.engine.models.registry import ModelRegistry

    return JobExecutor(ModelRegistry(include_hf_cache=False))


@pytest.fixture
def loop(qapp):
    """A qasync loop on the test's QApplication (closing windows does not quit it)."""
    import qasync

    qapp.setQuitOnLastWindowClosed(False)
    loop = qasync.QEventLoop(qapp)
    asyncio.set_event_loop(loop)
    yield loop
    loop.close()
    asyncio.set_event_loop(None)
    # The loop's Qt objects (a timer object with pending timers, a signaller) must die on this
    # thread: left to Python's cyclic GC they may be freed on an engine thread, and a QObject
    # destroyed off its thread corrupts Qt's timer list (a crash in the next test).
    for name in ("_timer", "_QEventLoop__call_soon_signaller"):
        obj = getattr(loop, name, None)
        if obj is not None and shiboken6.isValid(obj):
            shiboken6.delete(obj)


@pytest.fixture(autouse=True)
def _collect_on_gui_thread():
    """Collects each test's garbage (Qt wrappers in reference cycles) on the GUI thread."""
    yield
    gc.collect()


def run(loop, coro: Coroutine[Any, Any, Any], timeout: float = 150) -> Any:
    """Runs a coroutine on the qasync loop (Qt events are processed meanwhile)."""
    return loop.run_until_complete(asyncio.wait_for(coro, timeout))


async def until(condition: Callable[[], Any], timeout: float = 60, what: str = "") -> Any:
    """Waits (processing events) until ``condition()`` is truthy; returns its value."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what or condition}")
        await asyncio.sleep(0.02)


@pytest.fixture
def model_failures():
    """Collects the messages of QAbstractItemModelTester (category ``qt.modeltest``) while
    the test runs; other Qt messages go on to the previous handler."""
    from PySide6.QtCore import qInstallMessageHandler

    failures: list[str] = []

    def handler(mode, context, message):
        if context.category == "qt.modeltest" or "FAIL!" in message:
            failures.append(message)
        elif previous is not None:
            previous(mode, context, message)

    previous = qInstallMessageHandler(handler)
    yield failures
    qInstallMessageHandler(previous)


@pytest.fixture
def settings(tmp_path):
    """Application settings in a private INI file."""
    from PySide6.QtCore import QSettings

    from studio.ui.settings import AppSettings

    return AppSettings(QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat))


@pytest.fixture
def make_window(qtbot, loop, settings, executor):
    """Builds a started MainWindow over a project; shut down (engine stopped) at teardown."""
    from studio.engine.api import Engine
    from studio.engine.models.registry import ModelRegistry
    from studio.engine.worker import ThreadWorker
    from studio.ui.main_window import MainWindow

    windows = []

    def make(project: Project, *, show: bool = True, process: bool = False):
        """``process``: the studio's own engine (a child process) instead of a thread."""
        factory = None if process else (lambda: Engine(ThreadWorker(executor=executor)))
        window = MainWindow(project, settings, engine_factory=factory,
                            registry=ModelRegistry(include_hf_cache=False))
        # qtbot closes and deletes the window after the test; the engine stops first.
        qtbot.addWidget(window, before_close_func=lambda w: run(loop, w.shutdown()))
        windows.append(window)
        if show:
            window.show()
        run(loop, window.start())
        return window

    yield make
    for window in windows:
        if shiboken6.isValid(window):
            run(loop, window.shutdown())  # (done already when qtbot closed it)
        if shiboken6.isValid(window):
            window.deleteLater()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)  # delete them here
    windows.clear()


def wait_hash(loop, window) -> None:
    """Waits until the panel knows the model's weights hash (requests then carry it)."""
    run(loop, until(window.params.model_hash, 60, "the model hash"))


def fill_prompt(window, prompt: str, seed: int = 7) -> None:
    """Types a prompt and locks a seed in the settings panel."""
    window.params.prompt_edit.setPlainText(prompt)
    window.params.set_seed(seed, lock=True)


def slow_video_settings(window) -> None:
    """Settings for a job that runs long enough to be cancelled or killed mid-way."""
    window.params.set_mode("t2v")
    window.params.set_size(128, 128)
    window.params.frames_spin.setValue(17)
    window.params.steps_spin.setValue(200)


def fast_image_settings(window) -> None:
    """Settings for a quick job."""
    window.params.set_mode("t2i")
    window.params.set_size(64, 64)
    window.params.steps_spin.setValue(4)


def render_image(window, loop, prompt: str = "a red circle on grass", seed: int = 7,
                 label: str = "the image") -> str:
    """Generates one quick image in ``window`` and waits until it is done; its variant id."""
    from studio.core.document import Status

    fill_prompt(window, prompt, seed)
    fast_image_settings(window)
    [vid] = window.generate()
    run(loop, until(lambda: window.document.variant(vid).status == Status.DONE, 120, label))
    return vid


def project_snapshot(folder: Path) -> dict[str, Any]:
    """Everything a project holds: table rows and the media files' names."""
    import sqlite3

    conn = sqlite3.connect(folder / "project.sqlite")
    try:
        tables = {t: sorted(conn.execute(f"SELECT * FROM {t}").fetchall())
                  for t in ("variants", "artifacts", "media", "shots", "queue")}
    finally:
        conn.close()
    files = sorted(str(p.relative_to(folder)) for p in (folder / "media").rglob("*")
                   if p.is_file())
    return {"tables": tables, "files": files}
