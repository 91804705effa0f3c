"""The timeline dock: ordered shots pointing at variants, trim, duration, storyboard export.

:class:`TimelineModel` is a flat model over ``Document.shots()``; reordering (drag and drop or
the Up/Down buttons), trims and durations are undoable commands (a trim drag merges into one
step). "Export MP4" renders the whole storyboard with :mod:`studio.store.storyboard` (its
docstring holds the size, letterbox and frame-rate rules) on a worker thread. "Play" plays the
same film in the canvas (the window wires :attr:`TimelinePanel.playRequested`), frame for
frame what the export encodes.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from PySide6.QtCore import QMimeData, QModelIndex, QObject, Qt, Signal
from PySide6.QtGui import QIcon, QPixmap
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QSpinBox,
    QTreeView,
    QVBoxLayout,
    QWidget,
)

from studio.core.commands import AddShot, MoveShot, RemoveShot, SetShotDuration, TrimShot
from studio.core.document import (
    DEFAULT_IMAGE_DURATION_S,
    SHOTS_ADDED,
    SHOTS_CHANGED,
    SHOTS_MOVED,
    SHOTS_REMOVED,
    VARIANTS_CHANGED,
    ChangeEvent,
    Document,
    Shot,
    Status,
    Variant,
)
from studio.store.storyboard import StoryboardResult, StoryboardShot, render_storyboard
from studio.ui.background import Background
from studio.ui.exporting import EXPORT_LABEL
from studio.ui.listsync import sync_rows
from studio.ui.media_cache import MediaCache
from studio.ui.param_widgets import DecimalSpinBox
from studio.ui.table_model import RowsTableModel
from studio.ui.variants import VARIANTS_MIME, variant_label

log = logging.getLogger(__name__)

COLUMNS = ("Shot", "Kind", "In", "Out", "Seconds")
SHOT_MIME = "application/x-diffusion-studio-shot"
ShotIdRole = Qt.ItemDataRole.UserRole + 3


class TimelineModel(RowsTableModel):
    """The shots of a document, in order (see the module docstring).

    Signals:
        editRefused(str): an edit typed in the table was not applied, and why (the field
            and its allowed range); the value shown stays the shot's own.
    """

    columns = COLUMNS
    editRefused = Signal(str)

    def __init__(self, document: Document, media: MediaCache | None = None,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._doc = document
        self._media = media
        self._rows = [s.id for s in document.shots()]
        self._unsubscribe = document.subscribe(self._on_changes)
        if media is not None:
            media.thumbnailReady.connect(self._on_thumbnail)

    def detach(self) -> None:
        """Stops following the document."""
        self._unsubscribe()

    def _store(self, rows: list[str]) -> None:
        self._rows = rows

    def _on_changes(self, events: Sequence[ChangeEvent]) -> None:
        kinds = {e.kind for e in events}
        if kinds & {SHOTS_ADDED, SHOTS_REMOVED, SHOTS_MOVED}:
            sync_rows(self, self._rows, [s.id for s in self._doc.shots()], self._store)
        for e in events:
            if e.kind == SHOTS_CHANGED:
                for sid in e.ids:
                    self._refresh_row(sid)
            elif e.kind == VARIANTS_CHANGED:
                ids = set(e.ids)
                for s in self._doc.shots():
                    if s.variant_id in ids:
                        self._refresh_row(s.id)

    def _refresh_row(self, shot_id: str) -> None:
        if shot_id in self._rows:
            row = self._rows.index(shot_id)
            self.dataChanged.emit(self.index(row, 0), self.index(row, len(COLUMNS) - 1))

    def _on_thumbnail(self, media_id: str) -> None:
        for s in self._doc.shots():
            if not self._doc.has_variant(s.variant_id):
                continue
            v = self._doc.variant(s.variant_id)
            if any(a.media_id == media_id for a in v.artifacts):
                self._refresh_row(s.id)

    # -- lookups ----------------------------------------------------------------------------
    def _live(self, row: int) -> tuple[Shot, Variant] | None:
        """The shot of a row and its variant, or None while the row is being removed (the
        document changes before the model announces it, and views may ask meanwhile)."""
        sid = self.shot_id(row)
        if sid is None:
            return None
        try:
            shot = self._doc.shot(sid)
        except KeyError:
            return None
        if not self._doc.has_variant(shot.variant_id):
            return None
        return shot, self._doc.variant(shot.variant_id)

    def shot_id(self, row: int) -> str | None:
        """The shot of a row."""
        return self._rows[row] if 0 <= row < len(self._rows) else None

    def frame_count(self, shot: Shot) -> int:
        """Frames of the shot's result (1 for images, 0 while it has none)."""
        v = self._doc.variant(shot.variant_id)
        if not v.artifacts:
            return 0
        art = v.artifacts[0]
        if art.kind == "image":
            return 1
        if self._media is None:
            return 0
        try:
            return int(self._media.info(art.media_id)["meta"]["shape"][0])
        except (KeyError, ValueError):
            return 0

    def shot_seconds(self, shot: Shot) -> float:
        """How long the shot lasts in the storyboard, in seconds."""
        v = self._doc.variant(shot.variant_id)
        count = self.frame_count(shot)
        if count <= 1:
            return DEFAULT_IMAGE_DURATION_S if shot.duration_s is None else shot.duration_s
        out = count if shot.out_frame is None else min(shot.out_frame, count)
        fps = float(v.request.get("fps") or 16.0)
        return max(out - shot.in_frame, 1) / fps

    # -- Qt ---------------------------------------------------------------------------------
    def flags(self, index: QModelIndex) -> Qt.ItemFlag:
        """Qt override: rows drag; trims and durations are editable."""
        if not index.isValid():
            return Qt.ItemFlag.ItemIsDropEnabled
        flags = (Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable
                 | Qt.ItemFlag.ItemIsDragEnabled)
        live = self._live(index.row())
        if live is None:
            return flags
        if not self._doc.variant(live[0].variant_id).artifacts:
            return flags  # no result yet: whether it is a clip or a still is not known
        image = self.frame_count(live[0]) <= 1
        if (index.column() in (2, 3) and not image) or (index.column() == 4 and image):
            flags |= Qt.ItemFlag.ItemIsEditable
        return flags

    def data(self, index: QModelIndex, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        """Qt override."""
        live = self._live(index.row()) if index.isValid() else None
        if live is None:
            return None
        shot, v = live
        sid = shot.id
        col = index.column()
        if role == ShotIdRole:
            return sid
        count = self.frame_count(shot)
        image = count <= 1
        if role == Qt.ItemDataRole.DecorationRole and col == 0:
            if v.artifacts and self._media is not None:
                thumb = self._media.thumbnail(v.artifacts[0].media_id)
                if thumb is not None:
                    return QIcon(QPixmap.fromImage(thumb))
            return None
        if role == Qt.ItemDataRole.ToolTipRole and v.status != Status.DONE:
            return f"{variant_label(v)} has no result yet ({v.status})"
        if role not in (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.EditRole):
            return None
        if col == 0:
            return variant_label(v)
        if col == 1:
            return "image" if image else f"video, {count} frames"
        if col == 2:
            return "—" if image else shot.in_frame
        if col == 3:
            if image:
                return "—"
            return shot.out_frame if shot.out_frame is not None else (
                count if role == Qt.ItemDataRole.EditRole else f"end ({count})")
        if col == 4:
            seconds = self.shot_seconds(shot)
            return round(seconds, 3) if role == Qt.ItemDataRole.EditRole else f"{seconds:.2f}"
        return None

    def setData(self, index: QModelIndex, value: Any,  # noqa: N802
                role: int = Qt.ItemDataRole.EditRole) -> bool:
        """Qt override: edits push TrimShot / SetShotDuration."""
        live = self._live(index.row()) if index.isValid() else None
        if live is None or role != Qt.ItemDataRole.EditRole:
            return False
        shot = live[0]
        sid = shot.id
        count = self.frame_count(shot)
        try:
            if index.column() == 2:
                if count > 1 and int(value) >= count:
                    raise ValueError(f"in frame {int(value)} is past the clip's last frame "
                                     f"({count - 1})")
                self._doc.history.push(TrimShot(sid, int(value), shot.out_frame))
            elif index.column() == 3:
                if count > 1 and int(value) > count:
                    raise ValueError(f"out frame {int(value)} is past the clip's end "
                                     f"({count} frames)")
                self._doc.history.push(TrimShot(sid, shot.in_frame, int(value)))
            elif index.column() == 4:
                self._doc.history.push(SetShotDuration(sid, float(value)))
            else:
                return False
        except ValueError as exc:
            what = COLUMNS[index.column()].lower()
            self.editRefused.emit(f"Shot {index.row() + 1}: {what} not changed: {exc}")
            return False
        return True

    # -- drag and drop ----------------------------------------------------------------------
    def mimeTypes(self) -> list[str]:  # noqa: N802
        """Qt override: shots (moved within the table) and variants (dragged from the
        variant tree: new shots)."""
        return [SHOT_MIME, VARIANTS_MIME]

    def mimeData(self, indexes: Sequence[QModelIndex]) -> QMimeData:  # noqa: N802
        """Qt override: the dragged shot's id."""
        data = QMimeData()
        rows = sorted({i.row() for i in indexes if i.isValid()})
        if rows:
            data.setData(SHOT_MIME, (self.shot_id(rows[0]) or "").encode())
        return data

    def dropMimeData(self, data: QMimeData, action: Qt.DropAction, row: int,  # noqa: N802
                     column: int, parent: QModelIndex) -> bool:
        """Qt override: a shot dropped moves (an undoable MoveShot); variants dropped from the
        tree become shots there (one undo step); returns False so the view removes nothing
        itself."""
        if row < 0:
            row = parent.row() if parent.isValid() else len(self._rows)
        if data.hasFormat(VARIANTS_MIME):
            self.add_variants_at(_variant_ids(data), row)
            return False
        if action != Qt.DropAction.MoveAction or not data.hasFormat(SHOT_MIME):
            return False
        sid = bytes(data.data(SHOT_MIME).data()).decode()
        if sid not in self._rows:
            return False
        source = self._rows.index(sid)
        target = row - 1 if row > source else row
        target = min(max(target, 0), len(self._rows) - 1)
        if target != source:
            self._doc.history.push(MoveShot(sid, target))
        return False


    def add_variants_at(self, variant_ids: Sequence[str], row: int) -> list[str]:
        """Inserts a shot per variant from ``row`` on (clamped to the table; one undo step);
        variants that no longer exist are skipped. Returns the new shot ids."""
        ids = []
        index = min(max(row, 0), len(self._doc.shots()))
        with self._doc.history.group("Add to timeline"):
            for vid in variant_ids:
                if not self._doc.has_variant(vid):
                    continue
                cmd = AddShot(vid, index=index)
                self._doc.history.push(cmd)
                ids.append(cmd.shot_id)
                index += 1
        return ids

    def supportedDropActions(self) -> Qt.DropAction:  # noqa: N802
        """Qt override: shots move, variants are copied in."""
        return Qt.DropAction.MoveAction | Qt.DropAction.CopyAction


def _variant_ids(data: QMimeData) -> list[str]:
    """The variant ids of a variant-tree drag ([] for anything malformed)."""
    try:
        ids = json.loads(bytes(data.data(VARIANTS_MIME).data()).decode())
    except (UnicodeDecodeError, ValueError):
        return []
    return [v for v in ids if isinstance(v, str)] if isinstance(ids, list) else []


class TimelinePanel(QWidget):
    """The timeline table with add/remove/reorder, trim and duration editors, playback and
    export.

    Signals:
        message(str, bool): something to tell the user (text, is_error).
        exported(object): a :class:`StoryboardResult` after a successful export.
        playRequested(): Play / pause of the storyboard was clicked.
        stopRequested(): Stop was clicked (leave the storyboard playback).
    """

    message = Signal(str, bool)
    exported = Signal(object)
    playRequested = Signal()
    stopRequested = Signal()

    def __init__(self, model: TimelineModel, document: Document, background: Background,
                 media: MediaCache, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.model = model
        self._doc = document
        self._bg = background
        self._media = media
        self._loading = False
        model.editRefused.connect(lambda text: self.message.emit(text, True))
        self.view = QTreeView()
        self.view.setModel(model)
        self.view.setRootIsDecorated(False)
        self.view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.view.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        # moves within the table, and variants dropped from the tree (DragDrop, not
        # InternalMove, which refuses drops from other views)
        self.view.setDragDropMode(QAbstractItemView.DragDropMode.DragDrop)
        self.view.setDefaultDropAction(Qt.DropAction.MoveAction)
        self.view.setDragEnabled(True)
        self.view.setAcceptDrops(True)
        self.view.setDropIndicatorShown(True)
        self.view.header().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.remove_button = QPushButton("Remove")
        self.up_button = QPushButton("Up")
        self.down_button = QPushButton("Down")
        self.export_button = QPushButton("Export MP4…")
        self.play_button = QPushButton("▶ Play")
        self.play_button.setToolTip("Play the whole storyboard in the canvas, as exported")
        self.stop_button = QPushButton("■ Stop")
        self.stop_button.setToolTip("Stop playing the storyboard")
        self.stop_button.setEnabled(False)
        self.in_spin = QSpinBox(minimum=0, maximum=100_000, prefix="in ")
        self.out_spin = QSpinBox(minimum=0, maximum=100_000, prefix="out ",
                                 specialValueText="out: end")
        self.duration_spin = DecimalSpinBox(minimum=0.1, maximum=3600.0, decimals=2,
                                            singleStep=0.5, suffix=" s")
        self.status = QLabel("")
        buttons = QHBoxLayout()
        for b in (self.remove_button, self.up_button, self.down_button):
            buttons.addWidget(b)
        buttons.addStretch(1)
        buttons.addWidget(self.play_button)
        buttons.addWidget(self.stop_button)
        buttons.addWidget(self.export_button)
        editors = QHBoxLayout()
        editors.addWidget(QLabel("Trim"))
        editors.addWidget(self.in_spin)
        editors.addWidget(self.out_spin)
        editors.addWidget(QLabel("Duration"))
        editors.addWidget(self.duration_spin)
        editors.addStretch(1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(2, 2, 2, 2)
        layout.addLayout(buttons)
        layout.addWidget(self.view, 1)
        layout.addLayout(editors)
        layout.addWidget(self.status)
        self.remove_button.clicked.connect(self.remove_selected)
        self.up_button.clicked.connect(lambda: self.move_selected(-1))
        self.down_button.clicked.connect(lambda: self.move_selected(1))
        self.export_button.clicked.connect(self.ask_export)
        self.play_button.clicked.connect(self.playRequested)
        self.stop_button.clicked.connect(self.stopRequested)
        # a trim is taken when typed in whole (Enter, or leaving the box) or stepped: typing
        # "12" must not try "1" first
        self._trim_refused = False
        for spin in (self.in_spin, self.out_spin):
            spin.setKeyboardTracking(False)
        self.in_spin.valueChanged.connect(self._on_trim)
        self.out_spin.valueChanged.connect(self._on_trim)
        self.duration_spin.valueChanged.connect(self._on_duration)
        self.view.selectionModel().selectionChanged.connect(self._load_editors)
        model.dataChanged.connect(self._load_editors)
        model.rowsInserted.connect(self._load_editors)
        model.rowsRemoved.connect(self._load_editors)
        self._load_editors()

    # -- selection and editing --------------------------------------------------------------
    def selected(self) -> str | None:
        """The selected shot id."""
        rows = self.view.selectionModel().selectedRows()
        return self.model.shot_id(rows[0].row()) if rows else None

    def select(self, shot_id: str) -> None:
        """Selects a shot."""
        if shot_id in self.model._rows:
            self.view.setCurrentIndex(self.model.index(self.model._rows.index(shot_id), 0))

    def add_variants(self, variant_ids: Sequence[str]) -> list[str]:
        """Appends a shot per variant (one undo step); returns the shot ids."""
        ids = []
        with self._doc.history.group("Add to timeline"):
            for vid in variant_ids:
                cmd = AddShot(vid)
                self._doc.history.push(cmd)
                ids.append(cmd.shot_id)
        return ids

    def remove_selected(self) -> None:
        """Removes the selected shot."""
        sid = self.selected()
        if sid:
            self._doc.history.push(RemoveShot(sid))

    def move_selected(self, delta: int) -> None:
        """Moves the selected shot earlier (-1) or later (+1)."""
        sid = self.selected()
        if not sid:
            return
        index = self._doc.shot_index(sid) + delta
        if 0 <= index < len(self._doc.shots()):
            self._doc.history.push(MoveShot(sid, index))
            self.select(sid)

    def _load_editors(self, *_: object) -> None:
        sid = self.selected()
        shot = self._doc.shot(sid) if sid and sid in self.model._rows else None
        count = self.model.frame_count(shot) if shot else 0
        video = shot is not None and count > 1
        self._loading = True
        try:
            self.in_spin.setEnabled(video)
            self.out_spin.setEnabled(video)
            self.duration_spin.setEnabled(shot is not None and not video)
            self.remove_button.setEnabled(shot is not None)
            index = self._doc.shot_index(sid) if shot else -1
            self.up_button.setEnabled(index > 0)
            self.down_button.setEnabled(0 <= index < len(self._doc.shots()) - 1)
            if video:
                self.in_spin.setMaximum(max(count - 1, 0))
                self.out_spin.setMaximum(count)
                self.in_spin.setValue(shot.in_frame)
                self.out_spin.setValue(shot.out_frame or 0)
            else:  # disabled boxes show nothing of another shot
                self.in_spin.setValue(0)
                self.out_spin.setValue(0)
            if shot is not None and not video:
                self.duration_spin.setValue(self.model.shot_seconds(shot))
        finally:
            self._loading = False
        total = sum(self.model.shot_seconds(s) for s in self._doc.shots())
        self.status.setText(f"{len(self._doc.shots())} shots, {total:.2f} s")

    def _on_trim(self, *_: object) -> None:
        sid = self.selected()
        if self._loading or not sid:
            return
        start = self.in_spin.value()
        end = self.out_spin.value() or None
        if end is not None and end <= start:
            self.message.emit(f"Trim: the out frame ({end}) must come after the in frame "
                              f"({start}); the shot keeps its trim", True)
            self._trim_refused = True
            self._load_editors()  # the boxes show the trim the shot has
            return
        shot = self._doc.shot(sid)
        if (shot.in_frame, shot.out_frame) != (start, end):
            self._doc.history.push(TrimShot(sid, start, end))
            if self._trim_refused:  # said, so that the error above does not linger
                self._trim_refused = False
                self.message.emit(f"Trimmed: frames {start} to {end or 'the end'}", False)

    def _on_duration(self, value: float) -> None:
        sid = self.selected()
        if self._loading or not sid:
            return
        self._doc.history.push(SetShotDuration(sid, round(value, 3)))

    def set_playing(self, shown: bool, playing: bool) -> None:
        """Follows the canvas: whether the storyboard is shown there, and playing."""
        self.play_button.setText("❚❚ Pause" if playing else "▶ Play")
        self.stop_button.setEnabled(shown)

    # -- export -----------------------------------------------------------------------------
    async def gather_shots(self) -> list[StoryboardShot] | None:
        """The shots' frames (loaded off the GUI thread) and timing, in order; None (with a
        message) when the timeline is empty or a shot has no readable result."""
        shots = self._doc.shots()
        if not shots:
            self.message.emit("The timeline is empty: add variants to it first.", True)
            return None
        # the variants as they are now: one deleted during an await below (reading a long
        # clip) must not end the export with an unknown id
        variants = [self._doc.variant(shot.variant_id) for shot in shots]
        items = []
        for n, (shot, v) in enumerate(zip(shots, variants, strict=True), 1):
            if v.status != Status.DONE or not v.artifacts:
                self.message.emit(f"Shot {n} ({variant_label(v)}) has no result yet "
                                  f"({v.status}).", True)
                return None
            try:
                frames = await self._media.load_frames(v.artifacts[0].media_id)
            except (KeyError, OSError, ValueError) as exc:
                self.message.emit(f"Shot {n}: cannot read its result ({exc})", True)
                return None
            request = v.request
            items.append(StoryboardShot(
                frames, float(request.get("fps") or 16.0), shot.in_frame, shot.out_frame,
                shot.duration_s, {"variant_id": v.id, "name": v.name, "request": request}))
        return items

    def ask_export(self) -> None:
        """Asks where to write the storyboard MP4, then exports it."""
        path, _ = QFileDialog.getSaveFileName(self, "Export storyboard", "storyboard.mp4",
                                              "MP4 video (*.mp4)")
        if path:
            suffix = Path(path).suffix.lower()
            if suffix and suffix != ".mp4":  # said, not written as "board.gif.mp4"
                self.message.emit(f"Export failed: the storyboard is written as MP4; name the "
                                  f"file .mp4 instead of {suffix}", True)
                return
            if not suffix:
                path += ".mp4"
            task = asyncio.ensure_future(self.export_mp4(path))
            task.add_done_callback(self._report_failure)

    def _report_failure(self, task: asyncio.Future) -> None:
        """Says an unexpected export failure to the user (it would only reach the log)."""
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            log.error("storyboard export failed", exc_info=exc)
            self.message.emit(f"Export failed: {exc}", True)

    async def export_mp4(self, path: str | Path) -> StoryboardResult | None:
        """Renders the storyboard to ``path``; reports problems through :attr:`message`."""
        from studio.store.export import check_output_path

        items = await self.gather_shots()
        if items is None:
            return None
        try:
            check_output_path(path, label=EXPORT_LABEL)
        except ValueError as exc:  # the user's to fix: said plainly, no traceback
            self.message.emit(f"Export failed: {exc}", True)
            return None
        self.export_button.setEnabled(False)
        self.status.setText("Exporting…")
        try:
            result = await self._bg.call(render_storyboard, path, items, slow=True)
        except (OSError, ValueError) as exc:  # disk full, read-only disk: said, logged short
            log.warning("storyboard export failed: %s", exc)
            self.message.emit(f"Export failed: {exc}", True)
            return None
        except Exception as exc:
            log.exception("storyboard export failed")
            self.message.emit(f"Export failed: {exc}", True)
            return None
        finally:
            self.export_button.setEnabled(True)
            self._load_editors()
        self.message.emit(f"Exported {result.num_frames} frames ({result.width}x"
                          f"{result.height}, {result.fps:g} fps) to {result.path}", False)
        self.exported.emit(result)
        return result
