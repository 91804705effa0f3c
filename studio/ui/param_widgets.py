"""Small pieces of the settings panel: size presets, the input-image slot, and a decimal
spin box that takes either decimal separator."""

from __future__ import annotations

import math
from collections.abc import Iterable

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QImage, QPixmap
from PySide6.QtWidgets import QDoubleSpinBox, QHBoxLayout, QLabel, QToolButton, QWidget

from studio.core.capabilities import ModelCapabilities
from studio.core.request import MediaRef

PRESETS: tuple[tuple[str, int, int], ...] = (
    ("Square 1:1", 1, 1),
    ("Landscape 16:9", 16, 9),
    ("Portrait 9:16", 9, 16),
    ("Portrait 4:5", 4, 5),
    ("Landscape 4:3", 4, 3),
    ("Portrait 3:4", 3, 4),
)
class DecimalSpinBox(QDoubleSpinBox):
    """A QDoubleSpinBox that takes "4,5" as well as "4.5", whatever the locale's decimal
    separator: a plain one in an English (or C) locale refuses the comma keystroke, so
    typing "4,5" gave 45, and "1,5" a valid but wrong 15."""

    def _as_locale(self, text: str) -> str:
        point = self.locale().decimalPoint()
        other = "," if point == "." else "."
        return text.replace(other, point) if other in text and point not in text else text

    def validate(self, text: str, pos: int):  # noqa: D102 (Qt override)
        state, _, _ = super().validate(self._as_locale(text), pos)
        return state, text, pos

    def valueFromText(self, text: str) -> float:  # noqa: N802 (Qt override)
        return super().valueFromText(self._as_locale(text))


def preset_size(ratio_w: int, ratio_h: int, caps: ModelCapabilities) -> tuple[int, int]:
    """A (width, height) of about the model's default pixel count at ratio_w:ratio_h.

    Both sides are multiples of the model's spatial multiple and within its limits; among
    the candidates the one closest in aspect ratio wins, then the one closest in area.
    """
    m = caps.spatial_multiple
    lo = max(m, -(-caps.min_size // m) * m)
    hi = max(lo, caps.max_size // m * m)
    area = min(caps.default_width * caps.default_height, caps.max_pixels)
    ratio = ratio_w / ratio_h
    ideal_w = math.sqrt(area * ratio)
    best: tuple[float, int, int] | None = None
    base = round(ideal_w / m)
    for k in range(max(1, base - 3), base + 4):
        w = min(max(k * m, lo), hi)
        h = min(max(round(w / ratio / m) * m, lo), hi)
        if w * h > caps.max_pixels:
            continue
        score = abs(math.log((w / h) / ratio)) + 0.25 * abs(math.log(w * h / area))
        if best is None or score < best[0]:
            best = (score, w, h)
    if best is None:
        return lo, lo
    return best[1], best[2]


class InputSlot(QWidget):
    """An input image (or a list of references): thumbnails, a name, Load and Clear.

    Signals:
        changed(): the inputs changed.
        loadRequested(): the user asked to load a file into this slot.
    """

    changed = Signal()
    loadRequested = Signal()

    def __init__(self, multi: bool = False, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.multi = multi
        self._items: list[tuple[MediaRef, QImage | None]] = []
        self._thumbs = QHBoxLayout()
        self._thumbs.setContentsMargins(0, 0, 0, 0)
        self._name = QLabel("none — drop or paste an image on the canvas")
        self._name.setWordWrap(True)
        load = QToolButton(text="Load…")
        clear = QToolButton(text="Clear")
        load.clicked.connect(self.loadRequested)
        clear.clicked.connect(self.clear)
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.addLayout(self._thumbs)
        row.addWidget(self._name, 1)
        row.addWidget(load)
        row.addWidget(clear)
        self.setLayout(row)

    def refs(self) -> tuple[MediaRef, ...]:
        """The media references held."""
        return tuple(ref for ref, _ in self._items)

    def set_items(self, items: Iterable[tuple[MediaRef, QImage | None]]) -> None:
        """Replaces the inputs."""
        self._items = list(items)
        self._refresh()

    def add(self, ref: MediaRef, thumbnail: QImage | None) -> None:
        """Adds an input (replaces the one held unless ``multi``)."""
        if self.multi:
            self._items.append((ref, thumbnail))
        else:
            self._items = [(ref, thumbnail)]
        self._refresh()

    def clear(self) -> None:
        """Removes every input."""
        if self._items:
            self._items = []
            self._refresh()

    def _refresh(self) -> None:
        while self._thumbs.count():
            item = self._thumbs.takeAt(0)
            if item.widget() is not None:
                item.widget().deleteLater()
        for _, thumb in self._items[:6]:
            label = QLabel()
            if thumb is not None:
                label.setPixmap(QPixmap.fromImage(thumb).scaled(
                    40, 40, Qt.AspectRatioMode.KeepAspectRatio,
                    Qt.TransformationMode.SmoothTransformation))
            self._thumbs.addWidget(label)
        if not self._items:
            self._name.setText("none — drop or paste an image on the canvas")
        else:
            names = ", ".join(ref.source or ref.content_id[:8] for ref, _ in self._items)
            self._name.setText(names)
            self._name.setToolTip("\n".join(
                f"{ref.source}: {ref.conversion}" for ref, _ in self._items))
        self.changed.emit()
