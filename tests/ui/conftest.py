"""Fixtures for the studio UI tests: a qasync loop, a real engine on the embedded model (one
loaded executor for the session, a fresh thread-worker engine per window), real projects."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

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

    def make(project: Project, *, show: bool = True):
        window = MainWindow(
            project, settings,
            engine_factory=lambda: Engine(ThreadWorker(executor=executor)),
            registry=ModelRegistry(include_hf_cache=False))
        qtbot.addWidget(window)
        windows.append(window)
        if show:
            window.show()
        run(loop, window.start())
        return window

    yield make
    for window in windows:
        run(loop, window.shutdown())


def wait_hash(loop, window) -> None:
    """Waits until the panel knows the model's weights hash (requests then carry it)."""
    run(loop, until(window.params.model_hash, 60, "the model hash"))


def fill_prompt(window, prompt: str, seed: int = 7) -> None:
    """Types a prompt and locks a seed in the settings panel."""
    window.params.prompt_edit.setPlainText(prompt)
    window.params.set_seed(seed, lock=True)


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
