"""The inpainting mask a user paints on an init image, and its undoable edits.

Pure Python + numpy. A :class:`InpaintMask` is uint8 pixels (H, W), the init image's size:
255 = repaint, 0 = keep (the engine's convention: ``>= 128`` is repainted); the studio only
ever writes 0 or 255. The studio paints
it with a round brush (:meth:`InpaintMask.paint_segment`); one gesture (press, drags,
release) becomes one :class:`MaskEdit` on the document's undo history, holding the pixels of
the touched rectangle before and after, so undo and redo restore them exactly. Clearing is a
:class:`MaskEdit` over the whole mask.

The mask is not part of the document (it is a draft input, like the init image): commands
edit the mask object they were made for and leave the document alone. Listeners
(:meth:`InpaintMask.subscribe`) hear the rectangle of every change, so a view can redraw just
that part.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from studio.core.history import Command

Box = tuple[int, int, int, int]
"""A pixel rectangle ``(x0, y0, x1, y1)``, end-exclusive."""

REPAINT, KEEP = 255, 0


class InpaintMask:
    """A uint8 (height, width) mask, 255 = repaint (see the module docstring).

    Raises:
        ValueError: a side below 1.
    """

    def __init__(self, height: int, width: int) -> None:
        if int(height) < 1 or int(width) < 1:
            raise ValueError(f"size: expected at least 1x1, got {width}x{height}")
        self.pixels = np.zeros((int(height), int(width)), np.uint8)
        self._listeners: list[Callable[[Box], None]] = []

    @property
    def height(self) -> int:
        """Rows."""
        return self.pixels.shape[0]

    @property
    def width(self) -> int:
        """Columns."""
        return self.pixels.shape[1]

    @property
    def full_box(self) -> Box:
        """The rectangle of the whole mask."""
        return (0, 0, self.width, self.height)

    def is_empty(self) -> bool:
        """Whether nothing is marked for repainting."""
        return not self.pixels.any()

    def coverage(self) -> float:
        """The fraction of pixels marked for repainting (0-1)."""
        return float(np.count_nonzero(self.pixels >= 128)) / self.pixels.size

    # -- observers --------------------------------------------------------------------------
    def subscribe(self, listener: Callable[[Box], None]) -> Callable[[], None]:
        """Calls ``listener(box)`` after every change; returns an unsubscribe function."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def _changed(self, box: Box) -> None:
        for listener in list(self._listeners):
            listener(box)

    # -- editing ----------------------------------------------------------------------------
    def paint_segment(
        self, x0: float, y0: float, x1: float, y1: float, radius: float, value: int = REPAINT
    ) -> Box | None:
        """Paints a round brush of ``radius`` pixels dragged from (x0, y0) to (x1, y1).

        Coordinates are in image pixels (pixel ``(i, j)`` covers ``[j, j+1) x [i, i+1)``); a
        pixel is painted when its centre lies within ``radius`` of the segment (a capsule; a
        single dab when both ends are equal). Parts outside the mask are clipped.

        Returns:
            The rectangle that may have changed, or None when the brush missed the mask.
        """
        r = max(float(radius), 0.5)
        bx0 = max(math.floor(min(x0, x1) - r), 0)
        by0 = max(math.floor(min(y0, y1) - r), 0)
        bx1 = min(math.ceil(max(x0, x1) + r) + 1, self.width)
        by1 = min(math.ceil(max(y0, y1) + r) + 1, self.height)
        if bx0 >= bx1 or by0 >= by1:
            return None
        ys = np.arange(by0, by1, dtype=np.float32)[:, None] + 0.5
        xs = np.arange(bx0, bx1, dtype=np.float32)[None, :] + 0.5
        dx, dy = x1 - x0, y1 - y0
        length2 = dx * dx + dy * dy
        if length2 > 0:
            t = np.clip(((xs - x0) * dx + (ys - y0) * dy) / length2, 0.0, 1.0)
        else:
            t = np.zeros((1, 1), np.float32)
        inside = (xs - x0 - t * dx) ** 2 + (ys - y0 - t * dy) ** 2 <= r * r
        if not inside.any():
            return None
        self.pixels[by0:by1, bx0:bx1][inside] = value
        box = (bx0, by0, bx1, by1)
        self._changed(box)
        return box

    def region(self, box: Box) -> np.ndarray:
        """A copy of the pixels inside ``box``."""
        x0, y0, x1, y1 = box
        return self.pixels[y0:y1, x0:x1].copy()

    def put(self, box: Box, patch: np.ndarray) -> None:
        """Writes ``patch`` (the shape of ``box``) into the mask and tells the listeners."""
        x0, y0, x1, y1 = box
        self.pixels[y0:y1, x0:x1] = patch
        self._changed(box)


def union_box(a: Box | None, b: Box | None) -> Box | None:
    """The smallest rectangle holding both (None counts as empty)."""
    if a is None:
        return b
    if b is None:
        return a
    return (min(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3]))


class MaskEdit(Command):
    """One undo step of a mask: the pixels of ``box`` before and after (a stroke or a clear).

    The edit is already on the mask when pushed (the user saw it while painting): ``do``
    writes ``after`` (a no-op the first time), ``undo`` writes ``before``. Masks are binary
    (0 or 255), so the patches are kept as packed bits: an undo history of a few hundred
    strokes on a large mask stays small.

    Raises:
        ValueError: a patch does not have the shape of ``box``.
    """

    label = "Mask stroke"

    def __init__(self, mask: InpaintMask, box: Box, before: np.ndarray, after: np.ndarray,
                 label: str = "") -> None:
        shape = (box[3] - box[1], box[2] - box[0])
        for name, patch in (("before", before), ("after", after)):
            if patch.shape != shape:
                raise ValueError(f"{name}: expected shape {shape}, got {patch.shape}")
        self.mask = mask
        self.box = box
        self._shape = shape
        self._before = np.packbits(before >= 128)
        self._after = np.packbits(after >= 128)
        if label:
            self.label = label

    def _unpack(self, bits: np.ndarray) -> np.ndarray:
        count = self._shape[0] * self._shape[1]
        return (np.unpackbits(bits, count=count) * REPAINT).reshape(self._shape)

    @property
    def before(self) -> np.ndarray:
        """The pixels of ``box`` before the edit (uint8, 0 or 255)."""
        return self._unpack(self._before)

    @property
    def after(self) -> np.ndarray:
        """The pixels of ``box`` after the edit (uint8, 0 or 255)."""
        return self._unpack(self._after)

    def do(self, doc: object) -> None:
        """Writes the edited pixels."""
        self.mask.put(self.box, self.after)

    def undo(self, doc: object) -> None:
        """Writes the pixels as they were before the edit."""
        self.mask.put(self.box, self.before)


class MaskStroke:
    """One gesture of the brush or the eraser on a mask, turned into a :class:`MaskEdit`.

    ``begin`` at the press, ``extend`` for every drag position, ``finish`` at the release: the
    mask changes as the brush moves, and ``finish`` returns the undo step (None when the
    gesture changed nothing).
    """

    def __init__(self, mask: InpaintMask, radius: float, erase: bool = False) -> None:
        self.mask = mask
        self.radius = radius
        self.value = KEEP if erase else REPAINT
        self._before = mask.pixels.copy()
        self._box: Box | None = None
        self._last: tuple[float, float] | None = None

    def begin(self, x: float, y: float) -> None:
        """Puts the brush down at (x, y) (image pixels)."""
        self._last = (x, y)
        self._box = union_box(self._box, self.mask.paint_segment(x, y, x, y, self.radius,
                                                                 self.value))

    def extend(self, x: float, y: float) -> None:
        """Drags the brush to (x, y)."""
        if self._last is None:
            self.begin(x, y)
            return
        (x0, y0), self._last = self._last, (x, y)
        self._box = union_box(self._box, self.mask.paint_segment(x0, y0, x, y, self.radius,
                                                                 self.value))

    def finish(self) -> MaskEdit | None:
        """Lifts the brush; the undo step of the gesture, or None when nothing changed."""
        box = self._box
        if box is None:
            return None
        x0, y0, x1, y1 = box
        before = self._before[y0:y1, x0:x1].copy()
        after = self.mask.region(box)
        if np.array_equal(before, after):
            return None
        label = "Erase mask" if self.value == KEEP else "Mask stroke"
        return MaskEdit(self.mask, box, before, after, label)


def clear_edit(mask: InpaintMask) -> MaskEdit | None:
    """The undo step that clears the whole mask (None when it is empty already)."""
    if mask.is_empty():
        return None
    return MaskEdit(mask, mask.full_box, mask.pixels.copy(),
                    np.zeros_like(mask.pixels), "Clear mask")
