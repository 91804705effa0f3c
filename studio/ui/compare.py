"""The compare view: 2 to 4 variants side by side, as a wipe, or as a difference map.

* **Side by side**: one view per variant; zoom and pan are synchronized (the view state is
  shared as a zoom and a centre in fractions of the picture, so different sizes line up).
* **Wipe**: the first two variants in one view, split by a slider.
* **Difference**: a heat map of the per-pixel difference of the first two (the second is
  resized to the first when sizes differ), with the mean and largest difference.
* Videos play in step on one shared player (frame index, clamped to each video's length).
* A table lists the request parameters that differ between the variants.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QImage
from PySide6.QtWidgets import (
    QComboBox,
    QGridLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QSizePolicy,
    QSlider,
    QSplitter,
    QStackedWidget,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from studio.core.document import ChangeEvent, Document, Status
from studio.store.storyboard import film_rate
from studio.ui.background import difference_heatmap, to_qimage
from studio.ui.image_view import FramePlayer, ImageView, PlayerControls
from studio.ui.media_cache import MediaCache
from studio.ui.variants import variant_label

MODES = ("Side by side", "Wipe", "Difference")
MAX_COMPARE = 4


def flatten(obj: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as one level with dotted keys ("optimization.profile")."""
    out: dict[str, Any] = {}
    for key, value in obj.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def differing_parameters(requests: Sequence[dict[str, Any]]) -> list[tuple[str, list[Any]]]:
    """The fields whose values are not all equal, with each request's value, sorted."""
    flat = [flatten(r) for r in requests]
    keys = sorted(set().union(*flat)) if flat else []
    out = []
    for key in keys:
        values = [f.get(key) for f in flat]
        texts = {json.dumps(v, sort_keys=True) for v in values}
        if len(texts) > 1:
            out.append((key, values))
    return out


HEAT_CACHE_BYTES = 256 * 2**20  # difference maps kept per comparison (81 frames of 720p fit)


class CompareView(QWidget):
    """Compares variants (see the module docstring).

    Signals:
        message(str, bool): something to tell the user (text, is_error).
    """

    message = Signal(str, bool)

    def __init__(self, document: Document, media: MediaCache,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._doc = document
        self._media = media
        self._ids: list[str] = []
        self._frames: dict[str, np.ndarray] = {}
        # difference maps by frame pair, made once: a looping playback in Difference mode
        # would otherwise compute one per shown frame on the GUI thread (tens of ms at 720p)
        self._heat: dict[tuple[int, int], tuple[QImage, dict]] = {}
        self._heat_bytes = 0
        self._syncing = False
        self.stats = {"mean": 0.0, "max": 0.0}
        self.mode_combo = QComboBox()
        self.mode_combo.addItems(MODES)
        self.fit_button = QPushButton("Fit")
        self.actual_button = QPushButton("100%")
        self.title = QLabel("Select 2 to 4 variants and choose Compare.")
        self.title.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        top = QHBoxLayout()
        top.addWidget(self.mode_combo)
        top.addWidget(self.fit_button)
        top.addWidget(self.actual_button)
        top.addWidget(self.title, 1)

        self.views = [ImageView() for _ in range(MAX_COMPARE)]
        self.labels = [QLabel("") for _ in range(MAX_COMPARE)]
        for label in self.labels:
            label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        grid_page = QWidget()
        self._grid = QGridLayout(grid_page)
        self._grid.setContentsMargins(0, 0, 0, 0)
        self._cells = []
        for label, view in zip(self.labels, self.views, strict=True):
            cell = QWidget(grid_page)
            cell.hide()
            cl = QVBoxLayout(cell)
            cl.setContentsMargins(0, 0, 0, 0)
            cl.addWidget(label)
            cl.addWidget(view, 1)
            self._cells.append(cell)
        self.wipe_view = ImageView()
        self.wipe_slider = QSlider(Qt.Orientation.Horizontal, minimum=0, maximum=1000,
                                   value=500)
        wipe_page = QWidget()
        wl = QVBoxLayout(wipe_page)
        wl.setContentsMargins(0, 0, 0, 0)
        wl.addWidget(self.wipe_view, 1)
        wl.addWidget(self.wipe_slider)
        self.diff_view = ImageView()
        self.diff_label = QLabel("")
        self.diff_label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        diff_page = QWidget()
        dl = QVBoxLayout(diff_page)
        dl.setContentsMargins(0, 0, 0, 0)
        dl.addWidget(self.diff_view, 1)
        dl.addWidget(self.diff_label)
        self.pages = QStackedWidget()
        for page in (grid_page, wipe_page, diff_page):
            self.pages.addWidget(page)
        self.player = FramePlayer(self)
        self.controls = PlayerControls(self.player)
        self.table = QTableWidget(0, 0)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        upper = QWidget()
        ul = QVBoxLayout(upper)
        ul.setContentsMargins(0, 0, 0, 0)
        ul.addWidget(self.pages, 1)
        ul.addWidget(self.controls)
        splitter = QSplitter(Qt.Orientation.Vertical)
        splitter.addWidget(upper)
        splitter.addWidget(self.table)
        splitter.setStretchFactor(0, 4)
        splitter.setStretchFactor(1, 1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(2, 2, 2, 2)
        layout.addLayout(top)
        layout.addWidget(splitter, 1)

        for view in [*self.views, self.wipe_view, self.diff_view]:
            view.viewChanged.connect(lambda v=view: self._sync_from(v))
        self.mode_combo.currentIndexChanged.connect(self._on_mode)
        self.fit_button.clicked.connect(lambda: self._active_views()[0].fit())
        self.actual_button.clicked.connect(lambda: self._active_views()[0].actual_size())
        self.wipe_slider.valueChanged.connect(lambda v: self.wipe_view.set_split(v / 1000))
        self.player.positionChanged.connect(self._render)
        self.controls.refresh()
        self._unsubscribe = document.subscribe(self._on_document)

    def detach(self) -> None:
        """Stops following the document."""
        self._unsubscribe()

    def _on_document(self, events: Sequence[ChangeEvent]) -> None:
        """Follows the compared variants: a rename shows, and a variant deleted or undone
        leaves the comparison (all of it when fewer than two are left)."""
        if not self._ids or not any(set(e.ids) & set(self._ids) for e in events):
            return
        doc = self._doc
        still = [v for v in self._ids if doc.has_variant(v)
                 and doc.variant(v).status == Status.DONE and doc.variant(v).artifacts]
        if len(still) < 2:
            self.clear("The compared variants were deleted or undone: select two or more "
                       "finished variants and choose Compare.")
            return
        if still != self._ids:
            self._ids = still
            self._frames = {v: f for v, f in self._frames.items() if v in still}
            self._heat, self._heat_bytes = {}, 0
        self._layout_grid()
        self._fill_table()
        self.title.setText(" vs ".join(variant_label(doc.variant(v)) for v in still))
        self._render()

    def clear(self, text: str = "Select 2 to 4 variants and choose Compare.") -> None:
        """Compares nothing; shows ``text``."""
        self.player.set_source(0, 16.0)
        self._ids, self._frames = [], {}
        self._heat, self._heat_bytes = {}, 0
        self._layout_grid()
        self.table.clear()
        self.table.setRowCount(0)
        self.table.setColumnCount(0)
        for view in (*self.views, self.wipe_view, self.diff_view):
            view.set_image(None)
        self.title.setText(text)
        self.controls.refresh()

    # -- content ----------------------------------------------------------------------------
    @property
    def variant_ids(self) -> list[str]:
        """The variants compared."""
        return list(self._ids)

    def set_variants(self, variant_ids: Sequence[str]) -> bool:
        """Compares these variants (2 to 4 finished ones); False with a message otherwise."""
        ids = [v for v in variant_ids if self._doc.has_variant(v)]
        usable = [v for v in ids if self._doc.variant(v).status == Status.DONE
                  and self._doc.variant(v).artifacts]
        if len(usable) < 2:
            self.message.emit("Compare needs at least two finished variants: select them in "
                              "the variant tree.", True)
            return False
        if len(usable) > MAX_COMPARE:
            self.message.emit(f"Comparing the first {MAX_COMPARE} of {len(usable)} selected "
                              f"variants.", False)
            usable = usable[:MAX_COMPARE]
        self._ids = usable
        self._frames = {}
        self._heat, self._heat_bytes = {}, 0
        self._layout_grid()
        self._fill_table()
        self.title.setText(" vs ".join(variant_label(self._doc.variant(v)) for v in usable))
        for vid in usable:
            mid = self._doc.variant(vid).artifacts[0].media_id
            self._media.request_frames(mid, lambda f, v=vid: self._on_frames(v, f))
        return True

    def is_loaded(self) -> bool:
        """Whether every compared variant's frames are loaded."""
        return bool(self._ids) and all(v in self._frames for v in self._ids)

    def _on_frames(self, vid: str, frames: np.ndarray | None) -> None:
        if vid not in self._ids:
            return
        if frames is None:
            name = (variant_label(self._doc.variant(vid)) if self._doc.has_variant(vid)
                    else "a variant that was removed")
            self.message.emit(f"Cannot read the result of {name}", True)
            return
        self._frames[vid] = frames
        if self.is_loaded():
            shown = [v for v in self._ids if self._doc.has_variant(v)]
            fps = film_rate([(len(self._frames[v]),
                              float(self._doc.variant(v).request.get("fps") or 16.0))
                             for v in shown]) if shown else 16.0
            count = max(len(f) for f in self._frames.values())
            self.player.set_source(count, fps)
            self.controls.refresh()
            self._render()

    def _layout_grid(self) -> None:
        while self._grid.count():
            self._grid.takeAt(0)
        cols = 2 if len(self._ids) in (2, 4) else 3
        for i, cell in enumerate(self._cells):
            shown = i < len(self._ids)
            if shown:
                self._grid.addWidget(cell, i // cols, i % cols)
                self.labels[i].setText(variant_label(self._doc.variant(self._ids[i])))
            cell.setVisible(shown)

    def _fill_table(self) -> None:
        requests = [self._doc.variant(v).request for v in self._ids]
        rows = differing_parameters(requests)
        self.table.clear()
        self.table.setColumnCount(len(self._ids))
        self.table.setRowCount(len(rows))
        self.table.setHorizontalHeaderLabels(
            [variant_label(self._doc.variant(v)) for v in self._ids])
        self.table.setVerticalHeaderLabels([key for key, _ in rows])
        for r, (_, values) in enumerate(rows):
            for c, value in enumerate(values):
                text = value if isinstance(value, str) else json.dumps(value)
                item = QTableWidgetItem(text)
                item.setToolTip(text)
                self.table.setItem(r, c, item)

    def differing_fields(self) -> list[str]:
        """The parameter names listed in the table."""
        return [self.table.verticalHeaderItem(r).text() for r in range(self.table.rowCount())]

    # -- rendering --------------------------------------------------------------------------
    def mode(self) -> str:
        """The compare mode shown."""
        return self.mode_combo.currentText()

    def set_mode(self, mode: str) -> None:
        """Switches to "Side by side", "Wipe" or "Difference"."""
        self.mode_combo.setCurrentIndex(MODES.index(mode))

    def _on_mode(self, index: int) -> None:
        self.pages.setCurrentIndex(index)
        self._render()

    def _index(self, vid: str) -> int:
        return min(self.player.position, len(self._frames[vid]) - 1)

    def _frame(self, vid: str) -> np.ndarray:
        return np.asarray(self._frames[vid][self._index(vid)])

    def _difference(self) -> tuple[QImage, dict]:
        """The heat map and stats of the first two variants' current frames (cached per
        frame pair, up to :data:`HEAT_CACHE_BYTES`)."""
        key = (self._index(self._ids[0]), self._index(self._ids[1]))
        hit = self._heat.get(key)
        if hit is None:
            a, b = (self._frame(v) for v in self._ids[:2])
            heat, stats = difference_heatmap(a, b)
            hit = (to_qimage(heat), stats)
            if self._heat_bytes + heat.nbytes <= HEAT_CACHE_BYTES:
                self._heat[key] = hit
                self._heat_bytes += heat.nbytes
        return hit

    def _render(self, *_: object) -> None:
        if not self.is_loaded():
            return
        mode = self.mode()
        if mode == "Side by side":
            for i, vid in enumerate(self._ids):
                self.views[i].set_image(to_qimage(self._frame(vid)))
        elif mode == "Wipe":
            a, b = (self._frame(v) for v in self._ids[:2])
            self.wipe_view.set_image(to_qimage(a), to_qimage(b))
            self.wipe_view.set_split(self.wipe_slider.value() / 1000)
        else:
            heat, self.stats = self._difference()
            self.diff_view.set_image(heat)
            note = "" if len(self._ids) == 2 else " (the first two variants)"
            self.diff_label.setText(
                f"Difference{note}: mean |Δ| {self.stats['mean']:.2f}, largest "
                f"{self.stats['max']:.0f} of 255 (brightest = largest)")

    def _active_views(self) -> list[ImageView]:
        mode = self.mode()
        if mode == "Wipe":
            return [self.wipe_view]
        if mode == "Difference":
            return [self.diff_view]
        return self.views[: max(len(self._ids), 1)]

    def _sync_from(self, source: ImageView) -> None:
        if self._syncing:
            return
        self._syncing = True
        try:
            zoom, center = source.view_state()
            for view in [*self.views, self.wipe_view, self.diff_view]:
                if view is not source:
                    view.set_view_state(zoom, center)
        finally:
            self._syncing = False
