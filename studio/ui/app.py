"""Starting the studio: the Qt application, the asyncio loop (qasync) and the project.

``python -m studio [PROJECT_FOLDER]`` opens the folder's project (creating it when the folder
is new or empty; see :func:`project_folder_problem`); without a folder it reopens the last
project, or creates ``~/DiffusionStudio/Untitled``. When "Open project" chose a project that
cannot open, the studio reopens the one before. Qt and asyncio share one loop: ``asyncio.Runner`` with
``qasync.QEventLoop`` as its loop factory (Python 3.11 has no ``loop_factory`` in
``asyncio.run``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from studio.paths import expand_path

DEFAULT_PROJECT = Path.home() / "DiffusionStudio" / "Untitled"


def project_folder_problem(folder: Path) -> str | None:
    """Why ``folder`` can neither be opened as a project nor hold a new one, or None: a file
    (or a file above it) in its place, or a folder with other files in it but no project.
    A new project needs a new or empty folder (hidden files such as ``.DS_Store`` and a
    project lock file aside):
    made among other files, its ``media/`` folder would mix with them, and a project folder
    that lost its database would get a fresh, empty one beside its media."""
    from studio.store.project import DB_NAME, LOCK_NAME

    blocker = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()),
                   None)
    if blocker is not None:
        return (f"{blocker} is a file, not a folder; a project is a folder (give a new or "
                f"existing folder)")
    if folder.is_dir() and not (folder / DB_NAME).exists():
        others = sorted(p.name for p in folder.iterdir()
                        if not p.name.startswith(".") and p.name != LOCK_NAME)
        if others:
            shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more"
                                             if len(others) > 3 else "")
            return (f"{folder} holds other files ({shown}) but no project ({DB_NAME}); a new "
                    f"project needs a new or empty folder")
    return None


def open_project(folder: Path):
    """Opens the project in ``folder``, creating one when the folder is new or empty.

    Raises:
        ProjectError: :func:`project_folder_problem`, or the project is locked by another
            studio or written by a newer one.
        OSError: the folder cannot be created or read.
    """
    from studio.store.project import DB_NAME, Project, ProjectError

    problem = project_folder_problem(folder)
    if problem is not None:
        raise ProjectError(problem)
    if (folder / DB_NAME).exists():
        return Project.open(folder)
    return Project.create(folder)


async def run_studio(settings, folder: Path, engine_factory=None) -> int:
    """Shows the studio on ``folder`` until the window closes; follows "Open project".

    Args:
        settings: :class:`~studio.ui.settings.AppSettings`.
        engine_factory: see :class:`~studio.ui.main_window.MainWindow`.
    Returns:
        The exit code.
    """
    restore_sigterm = _sigterm_cancels(asyncio.current_task(), asyncio.get_running_loop())
    try:
        return await _run_projects(settings, folder, engine_factory)
    finally:
        restore_sigterm()


_TERMINATED = []  # set by SIGTERM: main() then exits 143 (128 + 15), not Ctrl+C's 130


def _sigterm_cancels(task, loop):
    """SIGTERM (a logout, a system shutdown, ``kill``) cancels the studio's session as Ctrl+C
    does, so the same orderly stop runs: the window closes, the engine stops, the project
    closes (no leaked semaphores). Independent of SIGINT's handler, which a launcher may have
    set to ignored. Returns the function that puts the previous handler back; a no-op off the
    main thread."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def on_sigterm(signum, frame):
        _TERMINATED.append(signum)
        loop.call_soon_threadsafe(task.cancel)

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    return lambda: signal.signal(signal.SIGTERM, previous)


def _has_screen() -> bool:
    """Whether Qt shows windows anyone can see: not the ``offscreen`` or ``minimal``
    platform (``QT_QPA_PLATFORM``), where a modal box would wait forever."""
    from PySide6.QtGui import QGuiApplication

    return QGuiApplication.platformName() not in ("offscreen", "minimal")


async def _run_projects(settings, folder: Path, engine_factory) -> int:
    from PySide6.QtWidgets import QMessageBox

    from studio.store.project import ProjectError
    from studio.ui.main_window import MainWindow

    next_folder: Path | None = folder
    previous: Path | None = None  # the project open before "Open project" chose another
    while next_folder is not None:
        try:
            project = open_project(next_folder)
        except (ProjectError, OSError) as exc:
            message = f"Cannot open the project in {next_folder}:\n{exc}"
            if previous is not None:
                message += f"\n\nReopening {previous}."
            logging.getLogger(__name__).error("%s", message)
            one_line = message.replace("\n", " ")
            print(f"error: {one_line}", file=sys.stderr)
            if not _has_screen():  # offscreen / minimal: nobody could close the box
                if previous is not None:  # a switch that failed: back to where the user was
                    next_folder, previous = previous, None
                    continue
                return 2  # a folder the user gave or chose: bad input, not an internal error
            # window-modal but not a nested event loop: a SIGTERM or Ctrl+C meanwhile
            # cancels this await and closes the box (a blocking exec() under qasync left a
            # future set after cancellation: InvalidStateError)
            box = QMessageBox(QMessageBox.Icon.Critical, "Diffusion Studio", message)
            shown = asyncio.get_running_loop().create_future()
            box.finished.connect(lambda *_, f=shown: f.done() or f.set_result(None))
            box.open()
            try:
                await shown
            finally:
                box.close()
                box.deleteLater()
            if previous is not None:
                next_folder, previous = previous, None
                continue
            return 2
        settings.last_project = str(next_folder)
        window = MainWindow(project, settings, engine_factory=engine_factory)
        problems = settings.stored_problems()
        if problems:  # replaced by defaults: said once, in the status bar and the log
            logging.getLogger(__name__).warning("settings: %s", "; ".join(problems))
            window.notify(f"Settings: {'; '.join(problems)}", error=True)
        closed = asyncio.get_running_loop().create_future()
        window.closed.connect(lambda f=closed: f.done() or f.set_result(None))
        window.show()
        try:
            await window.start()
            await closed
        finally:
            previous, next_folder = project.folder, window.next_project
            if window.isVisible():  # cancelled (Ctrl+C): still save the layout
                window.close()
            await window.shutdown()
            project.close()
            dispose(window)
    return 0


def dispose(widget) -> None:
    """Deletes a widget now, on the GUI thread.

    A Python-owned window left to ``deleteLater`` can instead be freed by Python's cyclic
    garbage collector first, on whatever thread it runs (an engine or worker thread); Qt
    objects destroyed off their thread corrupt Qt's state.
    """
    from PySide6.QtCore import QCoreApplication, QEvent

    widget.deleteLater()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)


def _setup_logging() -> None:
    from studio.paths import log_dir

    handler = logging.FileHandler(log_dir() / "studio.log", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    for noisy in ("diffusers", "transformers", "PIL"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def missing_display(environ=None, platform: str | None = None) -> str | None:
    """Why the window cannot open on this machine (None when it can): on Linux, Qt needs an
    X11 or Wayland display unless ``QT_QPA_PLATFORM`` names another platform (``offscreen``);
    without one Qt aborts with a message about reinstalling. Checked before Qt starts."""
    import os

    env = os.environ if environ is None else environ
    platform = sys.platform if platform is None else platform
    if not platform.startswith("linux") or env.get("QT_QPA_PLATFORM"):
        return None
    if env.get("DISPLAY") or env.get("WAYLAND_DISPLAY"):
        return None
    return ("error: no display found (neither DISPLAY nor WAYLAND_DISPLAY is set), so the "
            "studio window cannot open.\n"
            "  Without a window: ./scripts/studio.sh --samples renders a sample image and "
            "video,\n"
            "  and python -m studio render --help shows the command-line renderer.\n"
            "  Over SSH, forward X11 (ssh -X); for a window nobody sees (tests, screenshots), "
            "set QT_QPA_PLATFORM=offscreen.")


def main(argv: list[str] | None = None) -> int:
    """Runs the studio window; returns the exit code (1 when there is no display)."""
    import qasync
    from PySide6.QtCore import QSettings, QTimer
    from PySide6.QtWidgets import QApplication

    from studio.ui.settings import AppSettings

    parser = argparse.ArgumentParser(prog="python -m studio",
                                     description="Diffusion Studio: the desktop studio.")
    parser.add_argument("project", nargs="?", default=None,
                        help="project folder (default: the last one, else "
                             f"{DEFAULT_PROJECT}); created when it holds no project")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    problem = None if QApplication.instance() else missing_display()
    if problem:
        print(problem, file=sys.stderr)
        return 1
    try:
        _setup_logging()
    except ValueError as exc:  # an unusable STUDIO_HOME: said in one line, before any window
        print(f"error: {exc}", file=sys.stderr)
        return 2
    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setOrganizationName("Diffusion Studio")
    app.setApplicationName("Diffusion Studio")
    app.setQuitOnLastWindowClosed(False)  # the coroutine below decides when to stop
    settings = AppSettings(QSettings())
    try:
        folder = expand_path(args.project or settings.last_project or DEFAULT_PROJECT,
                             "project")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # Python runs signal handlers only between bytecodes; while Qt waits in C++ a Ctrl+C would
    # wait for the next event. An idle tick lets the Runner's handler cancel the session, which
    # then closes the engine and the project in order.
    tick = QTimer()
    tick.timeout.connect(lambda: None)
    tick.start(250)
    try:
        with asyncio.Runner(loop_factory=lambda: qasync.QEventLoop(app)) as runner:
            return runner.run(run_studio(settings, folder))
    except KeyboardInterrupt:
        return 143 if _TERMINATED else 130
    except asyncio.CancelledError:  # cancelled by SIGTERM (see _sigterm_cancels)
        if _TERMINATED:
            return 143
        raise
    finally:
        tick.stop()
