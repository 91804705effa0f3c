"""The queue dock: every job of the project, waiting ones first, with progress and ETA.

Rows: the document's queue (running and queued, in run order), then the finished, failed,
cancelled and interrupted variants, newest first (the last :data:`HISTORY_ROWS`). The
progress column paints a bar with the step count and the time left for the running job.
Cancel, move up/down and Retry act on the selected row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from PySide6.QtCore import QModelIndex, QObject, Qt, Signal
from PySide6.QtGui import QBrush, QPainter
from PySide6.QtWidgets import (
    QAbstractItemView,
    QApplication,
    QHBoxLayout,
    QHeaderView,
    QPushButton,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionProgressBar,
    QStyleOptionViewItem,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from studio.core.document import (
    PENDING,
    QUEUE_CHANGED,
    RETRYABLE,
    VARIANTS_ADDED,
    VARIANTS_CHANGED,
    VARIANTS_REMOVED,
    ChangeEvent,
    Document,
    Status,
)
from studio.ui.controller import StudioController
from studio.ui.listsync import sync_rows
from studio.ui.table_model import RowsTableModel
from studio.ui.variants import STATUS_COLORS, VariantIdRole, variant_label

HISTORY_ROWS = 200
COLUMNS = ("Variant", "Status", "Progress", "Message")
ProgressRole = Qt.ItemDataRole.UserRole + 2


def format_eta(seconds: float) -> str:
    """Seconds left as a short text ("3 s left", "2 min 5 s left"; "estimating the time
    left" while unknown: negative, the engine's ``ETA_UNKNOWN`` at the first step)."""
    if seconds < 0:
        return "estimating the time left"
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s left"
    return f"{seconds // 60} min {seconds % 60} s left"


class QueueModel(RowsTableModel):
    """The job list (see the module docstring) as a table model."""

    columns = COLUMNS

    def __init__(self, document: Document, controller: StudioController | None = None,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._doc = document
        self._controller = controller
        self._rows: list[str] = self._compute()
        self._unsubscribe = document.subscribe(self._on_changes)
        if controller is not None:
            controller.progressChanged.connect(self._on_progress)

    def detach(self) -> None:
        """Stops following the document."""
        self._unsubscribe()

    def _compute(self) -> list[str]:
        doc = self._doc
        pending = list(doc.queue())
        done = sorted((v for v in doc.variants() if v.status not in PENDING),
                      key=lambda v: (-v.created_at, v.id))
        return pending + [v.id for v in done[:HISTORY_ROWS]]

    def _store(self, rows: list[str]) -> None:
        self._rows = rows

    def _on_changes(self, events: Sequence[ChangeEvent]) -> None:
        kinds = {e.kind for e in events}
        if kinds & {QUEUE_CHANGED, VARIANTS_ADDED, VARIANTS_REMOVED, VARIANTS_CHANGED}:
            sync_rows(self, self._rows, self._compute(), self._store)
        changed = {vid for e in events if e.kind == VARIANTS_CHANGED for vid in e.ids}
        for vid in changed:
            self._refresh(vid)

    def _on_progress(self, vid: str) -> None:
        self._refresh(vid, 1, 2)

    def _refresh(self, vid: str, first: int = 0, last: int = len(COLUMNS) - 1) -> None:
        if vid in self._rows:
            row = self._rows.index(vid)
            self.dataChanged.emit(self.index(row, first), self.index(row, last))

    def variant_id(self, row: int) -> str | None:
        """The variant of a row."""
        return self._rows[row] if 0 <= row < len(self._rows) else None

    def row_of(self, variant_id: str) -> int:
        """The row of a variant (-1 when not listed)."""
        return self._rows.index(variant_id) if variant_id in self._rows else -1

    def data(self, index: QModelIndex, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        """Qt override."""
        if not index.isValid() or not 0 <= index.row() < len(self._rows):
            return None
        vid = self._rows[index.row()]
        if not self._doc.has_variant(vid):
            return None
        v = self._doc.variant(vid)
        col = index.column()
        progress = self._controller.progress(vid) if self._controller is not None else None
        if role == VariantIdRole:
            return vid
        if role == ProgressRole and col == 2:
            return progress.fraction if progress is not None else None
        if role == Qt.ItemDataRole.ForegroundRole and col == 1 and v.status in STATUS_COLORS:
            return QBrush(STATUS_COLORS[v.status])
        if role == Qt.ItemDataRole.ToolTipRole and col == 3 and v.error:
            return v.error
        if role != Qt.ItemDataRole.DisplayRole:
            return None
        if col == 0:
            return variant_label(v)
        if col == 1:
            return str(v.status)
        if col == 2:
            if v.status == Status.RUNNING and progress is not None:
                return (f"{progress.step}/{progress.total} · "
                        f"{format_eta(progress.eta_s)}")
            if v.status == Status.RUNNING:
                return "starting…"
            if v.status == Status.QUEUED:
                return f"#{self._doc.queue().index(vid) + 1} in queue"
            return ""
        if col == 3:
            return v.error or ""
        return None


class ProgressDelegate(QStyledItemDelegate):
    """Paints a progress bar (with the cell's text) where the model gives a fraction."""

    def paint(self, painter: QPainter, option: QStyleOptionViewItem,
              index: QModelIndex) -> None:
        """Qt override."""
        fraction = index.data(ProgressRole)
        if fraction is None:
            super().paint(painter, option, index)
            return
        bar = QStyleOptionProgressBar()
        bar.rect = option.rect.adjusted(2, 2, -2, -2)
        bar.minimum, bar.maximum = 0, 1000
        bar.progress = round(fraction * 1000)
        bar.text = str(index.data(Qt.ItemDataRole.DisplayRole) or "")
        bar.textVisible = True
        bar.state = option.state
        style = option.widget.style() if option.widget else QApplication.style()
        style.drawControl(QStyle.ControlElement.CE_ProgressBar, bar, painter)


class QueuePanel(QWidget):
    """The queue table with Cancel, Up, Down and Retry.

    Signals:
        activated(str): a row was double-clicked (its variant id).
    """

    activated = Signal(str)

    def __init__(self, model: QueueModel, controller: StudioController,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.model = model
        self.controller = controller
        self.view = QTableView()
        self.view.setTextElideMode(Qt.TextElideMode.ElideMiddle)  # keeps "· seed 12" shown
        self.view.setModel(model)
        self.view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.view.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.view.setItemDelegateForColumn(2, ProgressDelegate(self.view))
        self.view.verticalHeader().hide()
        header = self.view.horizontalHeader()
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        header.setStretchLastSection(True)  # the message
        header.resizeSection(0, 150)
        header.resizeSection(2, 150)
        self.cancel_button = QPushButton("Cancel")
        self.up_button = QPushButton("Up")
        self.down_button = QPushButton("Down")
        self.retry_button = QPushButton("Retry")
        buttons = QHBoxLayout()
        for b in (self.cancel_button, self.up_button, self.down_button, self.retry_button):
            buttons.addWidget(b)
        buttons.addStretch(1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(2, 2, 2, 2)
        layout.addLayout(buttons)
        layout.addWidget(self.view, 1)
        self.cancel_button.clicked.connect(self.cancel_selected)
        self.up_button.clicked.connect(lambda: self.move_selected(-1))
        self.down_button.clicked.connect(lambda: self.move_selected(1))
        self.retry_button.clicked.connect(self.retry_selected)
        self.view.selectionModel().selectionChanged.connect(self._update_buttons)
        model.dataChanged.connect(self._update_buttons)
        model.rowsInserted.connect(self._update_buttons)
        model.rowsRemoved.connect(self._update_buttons)
        self.view.doubleClicked.connect(
            lambda index: self.activated.emit(self.model.variant_id(index.row()) or ""))
        self._update_buttons()

    def selected(self) -> str | None:
        """The selected row's variant id."""
        rows = self.view.selectionModel().selectedRows()
        return self.model.variant_id(rows[0].row()) if rows else None

    def select(self, variant_id: str) -> None:
        """Selects a variant's row."""
        row = self.model.row_of(variant_id)
        if row >= 0:
            self.view.selectRow(row)

    def _update_buttons(self, *_: object) -> None:
        vid = self.selected()
        doc = self.model._doc
        v = doc.variant(vid) if vid and doc.has_variant(vid) else None
        self.cancel_button.setEnabled(v is not None and v.status in PENDING)
        queued = v is not None and v.status == Status.QUEUED
        queue = doc.queue()
        self.up_button.setEnabled(queued and queue.index(vid) > 0)
        self.down_button.setEnabled(queued and queue.index(vid) < len(queue) - 1)
        self.retry_button.setEnabled(v is not None and v.status in RETRYABLE)

    def cancel_selected(self) -> None:
        """Cancels the selected job."""
        vid = self.selected()
        if vid:
            self.controller.cancel(vid)

    def move_selected(self, delta: int) -> None:
        """Moves the selected waiting job up (-1) or down (+1) in the queue."""
        vid = self.selected()
        doc = self.model._doc
        if not vid or vid not in doc.queue():
            return
        index = doc.queue().index(vid) + delta
        if 0 <= index < len(doc.queue()):
            self.controller.move_job(vid, index)
            self.select(vid)

    def retry_selected(self) -> None:
        """Queues the selected failed, cancelled or interrupted variant again."""
        vid = self.selected()
        doc = self.model._doc
        if vid and doc.has_variant(vid) and doc.variant(vid).status in RETRYABLE:
            self.controller.retry(vid)
            self.select(vid)
