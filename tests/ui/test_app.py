"""Starting the studio: ``python -m studio`` dispatch, the app coroutine, settings, layering."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtWidgets import QApplication

import studio.__main__ as entry
from studio.engine.api import Engine
from studio.engine.worker import ThreadWorker
from studio.store.project import Project
from studio.ui.app import run_studio
from studio.ui.main_window import MainWindow
from tests.conftest import sigterm_and_wait
from tests.ui.conftest import run, until

REPO = Path(__file__).resolve().parents[2]


def test_python_m_studio_dispatch(monkeypatch):
    calls = []
    monkeypatch.setattr("studio.cli.main", lambda argv: calls.append(("cli", argv)) or 0)
    monkeypatch.setattr("studio.ui.app.main", lambda argv: calls.append(("ui", argv)) or 0)
    monkeypatch.setattr(entry, "render_samples", lambda: calls.append(("samples",)) or 0)
    assert entry.main(["models"]) == 0
    assert entry.main(["render", "--prompt", "x", "--out", "a.png"]) == 0
    assert entry.main([]) == 0
    assert entry.main(["/some/project"]) == 0
    assert entry.main(["--samples"]) == 0
    assert calls == [("cli", ["models"]), ("cli", ["render", "--prompt", "x", "--out", "a.png"]),
                     ("ui", []), ("ui", ["/some/project"]), ("samples",)]


def test_run_studio_opens_creates_and_closes_a_project(tmp_path, loop, settings, executor):
    folder = tmp_path / "new project"
    # stored values the studio cannot use: replaced by defaults and said once at start
    settings.qsettings.setValue("engine/device", "tpu")
    settings.qsettings.setValue("engine/model_folders", [str(tmp_path / "gone")])
    assert settings.device == "auto"
    problems = settings.stored_problems()
    assert len(problems) == 2 and "'tpu'" in problems[0] and "gone does not exist" in problems[1]

    async def session() -> int:
        task = loop.create_task(run_studio(
            settings, folder, engine_factory=lambda: Engine(ThreadWorker(executor=executor))))
        window = await until(lambda: next((w for w in QApplication.topLevelWidgets()
                                           if isinstance(w, MainWindow) and w.isVisible()),
                                          None), 30, "the window")
        assert window.project.folder == folder
        assert "Settings: device 'tpu'" in window.statusBar().currentMessage()
        window.settings.device = "auto"
        window.settings.model_folders = [str(tmp_path / "models")]
        window.close()
        return await task

    assert run(loop, session()) == 0
    assert settings.last_project == str(folder)
    assert settings.worker_config().model_folders == (str(tmp_path / "models"),)
    with Project.open(folder) as project:  # created, closed and unlocked
        assert len(project.document) == 0


def test_the_ui_loads_neither_torch_nor_diffusers():
    code = ("import sys, studio.ui.main_window, studio.ui.app\n"
            "bad = [m for m in ('torch', 'diffusers', 'transformers') if m in sys.modules]\n"
            "print(bad); sys.exit(1 if bad else 0)\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                            text=True, env={"QT_QPA_PLATFORM": "offscreen", "PATH": ""})
    assert result.returncode == 0, result.stdout + result.stderr


def test_settings_dialog_applies_and_the_engine_restarts(tmp_path, loop, make_window):
    from studio.core.document import Status
    from studio.ui.settings import SettingsDialog
    from tests.ui.conftest import fill_prompt

    project = Project.create(tmp_path / "project")
    w = make_window(project)
    dialog = SettingsDialog(w.settings, w)
    dialog.folders.addItem(str(tmp_path / "models"))
    dialog.device.setCurrentText("cpu")
    dialog.memory.setValue(12.5)
    dialog.apply()
    assert w.settings.model_folders == [str(tmp_path / "models")]
    assert (w.settings.device, w.settings.memory_budget_gb) == ("cpu", 12.5)
    old_engine = w.controller.engine
    (tmp_path / "models").mkdir()
    w.apply_settings()  # the folders are scanned off the GUI thread, then the list changes
    run(loop, until(lambda: w.controller.engine not in (None, old_engine), 30, "new engine"))
    run(loop, until(w.model_scan.done, 30, "the model scan"))
    assert w.model_scan.exception() is None
    assert w.registry.model_folders == [tmp_path / "models"]
    assert w.params.entry() is not None and w.params.entry().model_id == "embedded"
    assert w.controller.config.device == "cpu"
    assert w.controller.config.model_folders == (str(tmp_path / "models"),)
    fill_prompt(w, "after the restart")
    [vid] = w.generate()
    run(loop, until(lambda: project.document.variant(vid).status == Status.DONE, 90))


def test_settings_offer_the_multi_gpu_plans_that_fit(tmp_path, make_window, monkeypatch):
    import studio.ui.settings as settings_module
    from studio.engine.parallel import ParallelConfig
    from studio.ui.settings import SettingsDialog

    w = make_window(Project.create(tmp_path / "project"))
    monkeypatch.setattr(settings_module, "visible_gpus", lambda: 4)
    dialog = SettingsDialog(w.settings, w)
    labels = [dialog.plan.itemText(i) for i in range(dialog.plan.count())]
    assert labels[0] == "single device" and dialog.plan.isEnabled()
    assert "ulysses 2 × cfg 2 (4 ranks)" in labels and "ring 4 (4 ranks)" in labels
    assert not any("8 ranks" in label for label in labels)  # only what 4 GPUs can run
    dialog.plan.setCurrentIndex(labels.index("ulysses 2 × cfg 2 (4 ranks)"))
    dialog.apply()
    plan = ParallelConfig(ulysses_degree=2, cfg_degree=2)
    assert w.settings.parallel_plan == plan and w.settings.worker_config().parallel == plan
    assert SettingsDialog(w.settings, w).plan.currentText() == "ulysses 2 × cfg 2 (4 ranks)"
    # the GPUs went away: only the single device is offered and used
    monkeypatch.setattr(settings_module, "visible_gpus", lambda: 0)
    dialog = SettingsDialog(w.settings, w)
    assert dialog.plan.count() == 1 and not dialog.plan.isEnabled()
    assert w.settings.worker_config().parallel == ParallelConfig()


def test_settings_do_not_offer_cuda_without_a_gpu(tmp_path, make_window, monkeypatch):
    import studio.ui.settings as settings_module
    from studio.ui.settings import DEVICES, SettingsDialog

    w = make_window(Project.create(tmp_path / "project"))
    monkeypatch.setattr(settings_module, "visible_gpus", lambda: 0)
    w.settings.device = "cuda"  # e.g. stored on a machine that had one
    assert w.settings.device == "auto" and w.settings.worker_config().device == "auto"
    dialog = SettingsDialog(w.settings, w)
    assert not dialog.device.model().item(DEVICES.index("cuda")).isEnabled()
    monkeypatch.setattr(settings_module, "visible_gpus", lambda: 1)
    assert SettingsDialog(w.settings, w).device.model().item(DEVICES.index("cuda")).isEnabled()
    assert w.settings.device == "cuda"


def test_a_bad_studio_attention_is_one_notice_and_jobs_still_run(tmp_path, loop, make_window,
                                                                 monkeypatch):
    """A bad STUDIO_ATTENTION (a developer's switch) is said once at start-up, naming the
    option as typed, and dropped, so generations run each profile's own attention instead of
    failing as internal errors."""
    import os

    from studio.core.document import Status
    from tests.ui.conftest import fill_prompt

    monkeypatch.setenv("STUDIO_ATTENTION", "sage,tiles=64x100")
    monkeypatch.setenv("STUDIO_CPU_THREADS", "atuo")  # and a typo in the other switch
    project = Project.create(tmp_path / "project")
    w = make_window(project)
    text, error = w.last_message
    assert error and "STUDIO_ATTENTION='sage,tiles=64x100' is ignored" in text
    assert "tiles: (64, 100) must be two of 16, 32, 64, 128" in text
    assert "STUDIO_CPU_THREADS='atuo' is ignored: must be auto" in text
    assert "STUDIO_ATTENTION" not in os.environ and "STUDIO_CPU_THREADS" not in os.environ
    fill_prompt(w, "a bad switch does not stop work")
    [vid] = w.generate()
    run(loop, until(lambda: project.document.variant(vid).status == Status.DONE, 90))


def test_opening_a_file_as_a_project_says_so(tmp_path):
    from studio.store.project import ProjectError
    from studio.ui.app import open_project

    afile = tmp_path / "notes.txt"
    afile.write_text("x")
    for folder in (afile, afile / "inside"):
        with pytest.raises(ProjectError, match="notes.txt is a file, not a folder"):
            open_project(folder)
    assert open_project(tmp_path / "new").folder == tmp_path / "new"


def test_a_new_project_needs_a_new_or_empty_folder(tmp_path):
    """A folder with other files but no project is refused with what is in it: the project's
    media would mix with them, and a project folder whose database was lost would get a
    fresh, empty one. Hidden files do not count; an existing project opens."""
    from studio.store.project import DB_NAME, ProjectError
    from studio.ui.app import open_project, project_folder_problem

    documents = tmp_path / "Documents"
    documents.mkdir()
    for name in ("a.txt", "b.txt", "c.txt", "d.txt"):
        (documents / name).write_text("mine")
    with pytest.raises(ProjectError, match=r"Documents holds other files \(a.txt, b.txt, "
                                           r"c.txt and 1 more\) but no project"):
        open_project(documents)
    assert sorted(p.name for p in documents.iterdir()) == ["a.txt", "b.txt", "c.txt", "d.txt"]
    lost = tmp_path / "lost"
    with open_project(lost) as project:
        project.close()
    (lost / DB_NAME).unlink()  # a project folder that lost its database: its media stay
    (lost / "media").mkdir(exist_ok=True)
    assert "holds other files (media) but no project" in project_folder_problem(lost)
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / ".DS_Store").write_bytes(b"")
    with open_project(hidden) as project:
        assert project.folder == hidden
    with open_project(hidden) as project:  # now a project: opens
        assert (hidden / DB_NAME).exists()


def test_open_project_refuses_a_folder_that_cannot_be_one_and_stays(tmp_path, make_window):
    """Open project with a folder that cannot hold a project keeps this project's window open
    and says why in the status bar (before, the window closed and the studio exited); this
    project's own folder is said to be open already; an empty folder switches."""
    window = make_window(Project.create(tmp_path / "here"))
    full = tmp_path / "full"
    full.mkdir()
    (full / "notes.txt").write_text("x")
    assert not window.switch_project(full)
    assert window.isVisible() and window.next_project is None
    assert "holds other files (notes.txt) but no project" in \
        window.statusBar().currentMessage()
    assert not window.switch_project(tmp_path / "here")
    assert "is the project open now" in window.statusBar().currentMessage()
    (tmp_path / "empty").mkdir()
    assert window.switch_project(tmp_path / "empty")
    assert window.next_project == tmp_path / "empty" and not window.isVisible()


def test_a_project_switch_that_fails_reopens_the_project_before(tmp_path, loop, settings,
                                                                 executor, capsys):
    """The chosen project cannot open (another studio holds it): the error is said, and the
    studio reopens the project the user was in instead of exiting."""
    first, other = tmp_path / "first", tmp_path / "other"
    Project.create(other).close()
    holder = Project.open(other)  # another studio has it open

    def visible():
        return next((w for w in QApplication.topLevelWidgets()
                     if isinstance(w, MainWindow) and w.isVisible()), None)

    async def session() -> int:
        task = loop.create_task(run_studio(
            settings, first, engine_factory=lambda: Engine(ThreadWorker(executor=executor))))
        window = await until(visible, 30, "the window")
        assert window.switch_project(other)
        again = await until(lambda: (w := visible()) is not None and w is not window and w,
                            30, "the first project again")
        assert again.project.folder == first
        again.close()
        return await task

    try:
        assert run(loop, session()) == 0
    finally:
        holder.close()
    err = capsys.readouterr().err
    assert f"Cannot open the project in {other}" in err and f"Reopening {first}" in err
    assert settings.last_project == str(first)


def test_sigterm_stops_the_studio_in_order(tmp_path):
    """``kill`` (SIGTERM: a logout, a shutdown) runs Ctrl+C's orderly stop: the engine child
    stopped, the project closed and unlocked, no leaked semaphores; exit 143 (128 + 15)."""
    import os
    import signal
    import time

    from studio.store.project import LOCK_NAME

    folder = tmp_path / "project"
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", HF_HUB_OFFLINE="1",
               HOME=str(tmp_path / "home"), PYTHONPATH=str(REPO))
    # launched as a desktop launcher or a background job would: SIGINT ignored
    proc = subprocess.Popen([sys.executable, "-m", "studio", str(folder)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    deadline = time.monotonic() + 120
    while not (folder / LOCK_NAME).exists() and time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(proc.communicate()[1][-2000:])
        time.sleep(0.2)
    time.sleep(3)  # the window up and the engine child starting
    err = sigterm_and_wait(proc)
    assert proc.returncode == 143, err[-2000:]
    assert "leaked semaphore" not in err and "Traceback" not in err, err[-2000:]
    with Project.open(folder) as project:  # unlocked (the lock is a flock on project.lock)
        assert project.integrity_check() == "ok"


def test_without_a_display_the_studio_says_what_to_do_instead(tmp_path):
    """On Linux with no X11/Wayland display and no QT_QPA_PLATFORM, Qt would abort with advice
    to reinstall; the studio exits 1 first with what to do instead, and creates nothing."""
    import os

    from studio.ui.app import missing_display

    assert missing_display({}, "linux") is not None
    assert missing_display({"DISPLAY": ":0"}, "linux") is None
    assert missing_display({"WAYLAND_DISPLAY": "wayland-0"}, "linux") is None
    assert missing_display({"QT_QPA_PLATFORM": "offscreen"}, "linux") is None
    assert missing_display({}, "darwin") is None
    env = {k: v for k, v in os.environ.items()
           if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    env.update(HOME=str(tmp_path / "home"), PYTHONPATH=str(REPO))
    result = subprocess.run([sys.executable, "-m", "studio", str(tmp_path / "project")],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr[-2000:]
    assert "no display found" in result.stderr and "--samples" in result.stderr
    assert "Traceback" not in result.stderr and "reinstall" not in result.stderr.lower()
    assert not (tmp_path / "project").exists()


def test_an_unusable_studio_home_stops_the_studio_with_one_line(tmp_path):
    import os

    a_file = tmp_path / "file"
    a_file.write_text("x")
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", STUDIO_HOME=str(a_file / "home"),
               HOME=str(tmp_path / "home"), PYTHONPATH=str(REPO))
    result = subprocess.run([sys.executable, "-m", "studio", str(tmp_path / "project")],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "error: STUDIO_HOME=" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "project").exists()


def test_without_a_screen_a_project_that_cannot_open_exits_with_the_line(tmp_path, loop,
                                                                         settings, capsys):
    """On the offscreen platform (the tests', a headless run) no one could close a box: the
    error line is printed and the studio returns 2 (bad input) at once."""
    from PySide6.QtWidgets import QMessageBox

    afile = tmp_path / "notes.txt"
    afile.write_text("x")
    assert run(loop, run_studio(settings, afile)) == 2
    err = capsys.readouterr().err
    assert "Cannot open the project" in err and "is a file, not a folder" in err
    assert len(err.strip().splitlines()) == 1, err
    assert not [w for w in QApplication.topLevelWidgets()
                if isinstance(w, QMessageBox) and w.isVisible()]


def test_a_project_that_cannot_open_is_said_in_a_box_that_a_stop_closes(tmp_path, loop,
                                                                       settings, capsys,
                                                                       monkeypatch):
    """On a screen, the box does not block the loop: closing it returns 1; cancelling the
    session (what SIGTERM does) while it is up closes it and raises nothing but
    CancelledError."""
    import asyncio

    from PySide6.QtWidgets import QMessageBox

    import studio.ui.app as app_module

    monkeypatch.setattr(app_module, "_has_screen", lambda: True)  # as with a display

    afile = tmp_path / "notes.txt"
    afile.write_text("x")

    def box():
        return next((w for w in QApplication.topLevelWidgets()
                     if isinstance(w, QMessageBox) and w.isVisible()), None)

    async def answered() -> int:
        task = loop.create_task(run_studio(settings, afile))
        (await until(box, 30, "the box")).accept()
        return await task

    assert run(loop, answered()) == 2
    assert "Cannot open the project" in capsys.readouterr().err

    async def stopped():
        task = loop.create_task(run_studio(settings, afile))
        await until(box, 30, "the box")
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        await asyncio.sleep(0.1)
        return box()

    assert run(loop, stopped()) is None  # closed with the session
