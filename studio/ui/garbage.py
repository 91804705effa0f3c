"""Media garbage collection for the open project, off the GUI thread.

Deleting a variant keeps its media on disk while the undo history can bring it back. Once
the history lets go (its oldest steps fall past the undo limit, a push drops the redo tail,
the history is cleared, the project is opened or closed), the document sends
:data:`~studio.core.history.HISTORY_RELEASED` and :class:`MediaCollector` runs
:meth:`Project.mark_garbage <studio.store.project.Project.mark_garbage>` on the GUI thread
(the database half: a quick transaction and a rename per file) and
:meth:`MediaStore.sweep_garbage <studio.store.media.MediaStore.sweep_garbage>` on a worker
thread (the file deletions and the orphan scan).

Kept besides what the document and its history refer to: whatever ``keep()`` returns (the
settings panel's inputs and mask, which no variant names yet).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence

from PySide6.QtCore import QObject, QTimer, Signal

from studio.core.document import ChangeEvent
from studio.core.history import HISTORY_RELEASED
from studio.store.media import MediaStore
from studio.store.project import Project
from studio.ui.background import Background

log = logging.getLogger(__name__)


class MediaCollector(QObject):
    """Collects the project's unreferenced media when the history lets go of some.

    Args:
        project: the open project.
        background: the thread pool the sweep runs on.
        keep: returns ids (media or pixels ids) to keep besides the document's.
        delay_ms: how long a request waits, so a burst of releases makes one collection.
        orphan_grace_s: age before a file without a row counts as an orphan.

    Signals:
        collected(list): the ids deleted by a finished collection.
    """

    collected = Signal(list)

    def __init__(
        self, project: Project, background: Background,
        keep: Callable[[], Iterable[str]] = lambda: (), *, delay_ms: int = 500,
        orphan_grace_s: float = 3600.0, parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.project = project
        self._bg = background
        self._keep = keep
        self.orphan_grace_s = orphan_grace_s
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(delay_ms)
        self._timer.timeout.connect(self._start)
        self._running: asyncio.Future | None = None
        self._lock: asyncio.Lock | None = None
        self._again = False
        self._closed = False
        self.runs = 0
        self._unsubscribe = project.document.subscribe(self._on_document)

    def _on_document(self, events: Sequence[ChangeEvent]) -> None:
        if any(e.kind == HISTORY_RELEASED for e in events):
            self.request()

    def request(self) -> None:
        """Asks for a collection soon (requests close together make one)."""
        if self._closed:
            return
        if self._running is not None:
            self._again = True
        else:
            self._timer.start()

    @property
    def busy(self) -> bool:
        """Whether a collection is waiting or running."""
        return self._timer.isActive() or self._running is not None

    def _start(self) -> None:
        if self._closed or self._running is not None:
            return
        self._running = task = asyncio.ensure_future(self.collect())

        def done(_: asyncio.Future) -> None:
            self._running = None
            if self._again and not self._closed:
                self._again = False
                self._timer.start()

        task.add_done_callback(done)

    async def collect(self, *, include_history: bool = True) -> list[str]:
        """Collects now: marks on this (the GUI) thread, sweeps on a worker thread; one
        collection at a time.

        Args:
            include_history: keep what the undo history holds (False when the history is
                going away: the window is closing).
        Returns:
            The ids deleted ([] when marking or deleting failed).
        """
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            try:
                plan = self.project.mark_garbage(set(self._keep()),
                                                 include_history=include_history)
            except Exception:
                log.exception("media collection: marking failed")
                return []
            grace = self.orphan_grace_s
            try:
                removed = await self._bg.call(
                    lambda: MediaStore.sweep_garbage(plan, orphan_grace_s=grace), slow=True)
            except OSError:  # e.g. the folder went away; the next sweep finishes the job
                log.exception("media collection: deleting files failed")
                removed = []
            self.runs += 1
            if removed:
                log.info("media collection: removed %d media", len(removed))
            self.collected.emit(removed)
            return removed

    async def aclose(self, *, final: bool = True) -> None:
        """Stops listening; with ``final``, collects once more ignoring the undo history
        (it does not outlive the window)."""
        self._unsubscribe()
        self._timer.stop()
        if final and not self._closed:
            try:
                await self.collect(include_history=False)
            except Exception:
                log.exception("media collection at close failed")
        self._closed = True
