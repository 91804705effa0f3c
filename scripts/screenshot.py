"""Opens the studio on a sample project, generates real variants on the embedded model, and
saves a screenshot of the window in compare mode (docs/images/studio-compare.png).

    QT_QPA_PLATFORM=offscreen .venv/bin/python scripts/screenshot.py [OUT.png]

Runs offscreen (no display needed); the engine runs in this process on the CPU.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import qasync  # noqa: E402
from PySide6.QtCore import QSettings  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from studio.core.document import Status  # noqa: E402
from studio.engine.api import Engine  # noqa: E402
from studio.engine.models.registry import ModelRegistry  # noqa: E402
from studio.engine.worker import ThreadWorker, WorkerConfig  # noqa: E402
from studio.store.project import Project  # noqa: E402
from studio.ui.main_window import MainWindow  # noqa: E402
from studio.ui.settings import AppSettings  # noqa: E402

PROMPTS = [
    "a small red star in the top left corner on a grass background",
    "a large blue circle in the center on a white background",
    "a yellow triangle at the bottom right in a clear blue sky",
]


async def shoot(out: Path, workdir: Path) -> None:
    project = Project.create(workdir / "sample-project")
    settings = AppSettings(QSettings(str(workdir / "settings.ini"), QSettings.Format.IniFormat))
    window = MainWindow(project, settings, registry=ModelRegistry(include_hf_cache=False),
                        engine_factory=lambda: Engine(ThreadWorker(WorkerConfig(
                            include_hf_cache=False))))
    window.resize(1500, 900)
    window.show()
    await window.start()
    ids = []
    for i, prompt in enumerate(PROMPTS):
        window.params.prompt_edit.setPlainText(prompt)
        window.params.set_seed(100 + i, lock=True)
        ids += window.generate()
    doc = project.document
    deadline = time.monotonic() + 300
    while any(doc.variant(v).status != Status.DONE for v in ids):
        if time.monotonic() > deadline:
            raise TimeoutError("the sample variants did not finish")
        await asyncio.sleep(0.1)
    window.variants.select(ids)
    window.compare_action.trigger()
    while not window.compare.is_loaded():
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)
    out.parent.mkdir(parents=True, exist_ok=True)
    window.grab().save(str(out))
    print(f"wrote {out}")
    await window.shutdown()
    window.close()
    project.close()


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/images/studio-compare.png")
    app = QApplication([])
    # The runner must be closed: closing the qasync loop shuts down its default executor
    # (QThreads that ran Engine.aclose's blocking part); left open, Qt reports "QThread:
    # Destroyed while thread is still running" at exit.
    with tempfile.TemporaryDirectory() as tmp, \
            asyncio.Runner(loop_factory=lambda: qasync.QEventLoop(app)) as runner:
        runner.run(shoot(out, Path(tmp)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
