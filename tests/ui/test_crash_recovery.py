"""Case 004: the whole studio is SIGKILLed while the second of three jobs is denoising.

A child process runs the real studio window (offscreen) with its real child-process engine,
finishes a job, renames it, queues two more and kills itself with SIGKILL while the second
denoises. The project must then hold the finished variant with its media and parameters, the
rename, the interrupted job (retryable), the queued one and the unsent draft (prompt, init
image, batch size, branch parent); SQLite's integrity check is "ok";
the engine process must not outlive the studio; reopening runs the queued job and a retry.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from studio.core.document import Status
from studio.store.project import Project
from tests.ui.conftest import run, until

ROOT = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent('''
    import asyncio, json, os, signal, sys
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication
    import qasync
    from studio.core.commands import RenameVariant
    from studio.core.document import Status
    from studio.engine.models.registry import ModelRegistry
    from studio.store.project import Project
    from studio.ui.main_window import MainWindow
    from studio.ui.settings import AppSettings
    from tests.ui.conftest import fast_image_settings, fill_prompt

    folder, ini = sys.argv[1], sys.argv[2]
    app = QApplication([])

    async def main():
        project = Project.create(folder)
        settings = AppSettings(QSettings(ini, QSettings.Format.IniFormat))
        w = MainWindow(project, settings, registry=ModelRegistry(include_hf_cache=False))
        w.show()
        await w.start()
        doc = project.document
        fill_prompt(w, "a red circle")
        fast_image_settings(w)
        [first] = w.generate()
        while doc.variant(first).status != Status.DONE:
            await asyncio.sleep(0.05)
        doc.history.push(RenameVariant(first, "keeper"))
        w.params.set_mode("t2v")
        w.params.set_size(64, 64)
        w.params.frames_spin.setValue(9)
        w.params.steps_spin.setValue(200)
        [second] = w.generate()
        fast_image_settings(w)
        [third] = w.generate()
        # an unsent draft: an imported init image, a prompt, a batch of 3, a branch parent
        from pathlib import Path
        from PIL import Image
        init = Path(folder + "-init.png")
        Image.new("RGB", (40, 24), (200, 30, 30)).save(init)
        w.import_input(init, "init.png", "init_image")
        while not w.params.init_slot.refs():
            await asyncio.sleep(0.02)
        w.params.prompt_edit.setPlainText("unsent: a blue star on sand")
        w.params.batch_spin.setValue(3)
        w.params.set_parent(first, "keeper")
        while (project.load_draft() or {}).get("request", {}).get("prompt") != \
                "unsent: a blue star on sand":
            await asyncio.sleep(0.05)
        while not w.controller.progress(second):
            await asyncio.sleep(0.01)
        print(json.dumps({"first": first, "second": second, "third": third,
                          "init": w.params.init_slot.refs()[0].content_id,
                          "engine_pid": w.controller.engine.worker.pid}), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    asyncio.Runner(loop_factory=lambda: qasync.QEventLoop(app)).run(main())
''')


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "State:\tZ" not in state  # a zombie is dead (no parent left to reap it)


def test_sigkill_mid_generation_loses_nothing(tmp_path, loop, make_window):
    folder = tmp_path / "project"
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", HF_HUB_OFFLINE="1",
               PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", CHILD, str(folder),
                           str(tmp_path / "settings.ini")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    ids = json.loads(proc.stdout.strip().splitlines()[-1])

    # the engine child dies with its parent: no orphan holding the device
    deadline = time.monotonic() + 10
    while _alive(ids["engine_pid"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(ids["engine_pid"])

    project = Project.open(folder)
    assert project.integrity_check() == "ok"
    doc = project.document
    first = doc.variant(ids["first"])
    assert first.status == Status.DONE and first.name == "keeper" and first.artifacts
    assert json.loads(first.request_json)["prompt"] == "a red circle"
    for art in first.artifacts:
        assert project.media.path(art.media_id).exists()
    assert doc.variant(ids["second"]).status == Status.INTERRUPTED
    assert doc.variant(ids["third"]).status == Status.QUEUED
    assert doc.queue() == (ids["third"],)

    # reopening brings the unsent draft back, its init image kept; it runs the queued job,
    # and one click retries the interrupted one
    w = make_window(project)
    assert w.params.prompt_edit.toPlainText() == "unsent: a blue star on sand"
    assert w.params.mode() == "i2i" and w.params.batch_spin.value() == 3
    assert [r.content_id for r in w.params.init_slot.refs()] == [ids["init"]]
    assert w.params.parent_id == ids["first"]
    run(loop, until(lambda: not w.collector.busy, 30, "the sweep at open"))
    assert project.media.find_by_pixels(ids["init"]) is not None
    run(loop, until(lambda: doc.variant(ids["third"]).status == Status.DONE, 120, "job 3"))
    w.queue.select(ids["second"])
    assert w.queue.retry_button.isEnabled()
    w.queue.retry_button.click()
    run(loop, until(lambda: doc.variant(ids["second"]).status == Status.DONE, 180, "retry"))
    w.close()
    run(loop, w.shutdown())
    project.close()
