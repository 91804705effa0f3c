"""The Mask tool of the canvas: a brush and an eraser painting the inpainting mask.

Offered in image-to-image mode once an init image is set (:meth:`MaskEditor.set_source`).
Turning it on (:attr:`MaskEditor.mask_button`) shows the init image with the mask over it in
translucent red; the left button paints (brush) or erases (eraser) with a round brush of the
size shown, in the init image's pixels; the middle button pans and the wheel zooms as usual.
"Clear" empties the mask; "Show mask" hides or shows the overlay.

Each gesture (press, drag, release) is one step of the document's undo history
(:class:`~studio.core.mask.MaskEdit`), as is a clear, so Ctrl+Z takes back one stroke. There
is one mask per init image (keyed by its pixels' content id), so switching inputs and back
keeps what was painted. :attr:`MaskEditor.maskChanged` fires after every edit, undo or redo;
:class:`MaskLink` then hands the mask to the settings panel as the request's ``mask`` (a
:class:`~studio.core.request.MediaRef` by pixels content id, like the init image) and stores
it in the project's media, so Generate runs masked image-to-image.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QImage
from PySide6.QtWidgets import QCheckBox, QHBoxLayout, QSpinBox, QToolButton, QWidget

from studio.core.document import Document
from studio.core.mask import Box, InpaintMask, MaskEdit, MaskStroke, clear_edit
from studio.core.media import pixels_content_id
from studio.core.request import MediaRef
from studio.store.media import MediaStore
from studio.ui.image_view import ImageView, ViewTool

log = logging.getLogger(__name__)

MASK_SOURCE = "mask painted in the studio"
MASK_CONVERSION = "8-bit mask, white = repaint"

OVERLAY_RGBA = (255, 48, 48, 120)
"""Colour of repainted pixels in the overlay (translucent red)."""

_LUT = np.zeros((256, 4), np.uint8)
_LUT[128:] = OVERLAY_RGBA


class _Brush(ViewTool):
    """The view tool: forwards a gesture to the editor."""

    def __init__(self, editor: MaskEditor) -> None:
        self._editor = editor

    def press(self, x: float, y: float) -> None:
        self._editor.begin_stroke(x, y)

    def move(self, x: float, y: float) -> None:
        self._editor.extend_stroke(x, y)

    def release(self) -> None:
        self._editor.end_stroke()

    def radius(self) -> float:
        return self._editor.brush_size() / 2


class MaskEditor(QWidget):
    """The Mask tool bar and the masks it paints (see the module docstring).

    Args:
        document: whose undo history records the strokes.
        view: the view the tool paints in (the canvas's).

    Signals:
        activeChanged(bool): the tool was turned on or off.
        maskChanged(): the current mask changed (a stroke ended, a clear, an undo or redo).
    """

    activeChanged = Signal(bool)
    maskChanged = Signal()

    def __init__(self, document: Document, view: ImageView,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._doc = document
        self._view = view
        self._masks: dict[str, InpaintMask] = {}
        self._key: str | None = None
        self._unsubscribe_mask: Callable[[], None] = lambda: None
        self._stroke: MaskStroke | None = None
        self._rgba: np.ndarray | None = None
        self._overlay: QImage | None = None
        self._image: QImage | None = None
        self._tool = _Brush(self)
        self.mask_button = QToolButton(text="Mask", checkable=True,
                                       toolTip="Paint the area to repaint on the init image")
        self.brush_button = QToolButton(text="Brush", checkable=True, checked=True,
                                        toolTip="Paint: marked areas are repainted")
        self.eraser_button = QToolButton(text="Eraser", checkable=True,
                                         toolTip="Erase: unmarked areas keep the init image")
        self.size_spin = QSpinBox(minimum=1, maximum=2048, value=32, suffix=" px",
                                  toolTip="Brush diameter in init-image pixels")
        self.clear_button = QToolButton(text="Clear", toolTip="Clear the whole mask")
        self.overlay_box = QCheckBox("Show mask", checked=True)
        for b in (self.mask_button, self.brush_button, self.eraser_button, self.clear_button):
            b.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(4, 0, 4, 0)
        for w in (self.mask_button, self.brush_button, self.eraser_button, self.size_spin,
                  self.clear_button, self.overlay_box):
            layout.addWidget(w)
        layout.addStretch(1)
        self.mask_button.toggled.connect(self._on_toggled)
        self.brush_button.clicked.connect(lambda: self.set_erasing(False))
        self.eraser_button.clicked.connect(lambda: self.set_erasing(True))
        self.clear_button.clicked.connect(self.clear)
        self.overlay_box.toggled.connect(lambda _: self._show_overlay())
        self._update_widgets()

    # -- the source -------------------------------------------------------------------------
    def set_source(self, key: str | None, size: tuple[int, int] | None) -> None:
        """The init image the mask belongs to: its pixels' content id and (width, height);
        None when there is none (not i2i, or no init image): the tool is then unavailable."""
        if key is None or size is None:
            key = None
        if key == self._key:
            return
        self.end_stroke()
        self._unsubscribe_mask()
        self._unsubscribe_mask = lambda: None
        self._key = key
        self._image = None
        if key is not None:
            mask = self._masks.get(key)
            if mask is None:
                width, height = size
                mask = self._masks[key] = InpaintMask(height, width)
            self._unsubscribe_mask = mask.subscribe(self._on_mask_changed)
            self._rgba = _LUT[mask.pixels]
            self._overlay = None
            if self.is_active():
                self._view.set_image(None)
                self._show_overlay()
        else:
            self._rgba = self._overlay = None
            self.set_active(False)
        self._update_widgets()
        self.maskChanged.emit()

    def set_image(self, key: str, image: QImage | None) -> None:
        """The init image's pixels to paint over, once loaded (ignored for an old key)."""
        if key == self._key:
            self._image = image
            if self.is_active():
                self._view.set_image(image)

    @property
    def key(self) -> str | None:
        """The content id of the init image the current mask belongs to."""
        return self._key

    def image(self) -> QImage | None:
        """The init image painted over (None until loaded)."""
        return self._image

    def is_available(self) -> bool:
        """Whether there is an init image to mask."""
        return self._key is not None

    def mask(self) -> InpaintMask | None:
        """The mask of the current init image (None without one)."""
        return self._masks.get(self._key) if self._key is not None else None

    def mask_for(self, key: str, size: tuple[int, int]) -> InpaintMask:
        """The mask of an init image (made empty if there is none yet)."""
        mask = self._masks.get(key)
        if mask is None:
            mask = self._masks[key] = InpaintMask(size[1], size[0])
        return mask

    # -- on and off -------------------------------------------------------------------------
    def is_active(self) -> bool:
        """Whether the tool is on (the canvas shows the init image and the mask)."""
        return self.mask_button.isChecked()

    def set_active(self, on: bool) -> None:
        """Turns the tool on (only when available) or off."""
        self.mask_button.setChecked(bool(on) and self.is_available())

    def _on_toggled(self, on: bool) -> None:
        if on and not self.is_available():
            self.mask_button.setChecked(False)
            return
        self.end_stroke()
        if on:
            self._view.set_image(self._image)
            self._view.set_message("" if self._image is not None else "Loading the init image…")
            self._view.set_tool(self._tool)
            self._show_overlay()
        else:
            self._view.set_tool(None)
            self._view.set_overlay(None)
        self._update_widgets()
        self.activeChanged.emit(on)

    def _update_widgets(self) -> None:
        available = self.is_available()
        on = self.is_active()
        self.mask_button.setEnabled(available)
        self.mask_button.setToolTip(
            "Paint the area to repaint on the init image" if available else
            "Set an init image in image-to-image mode to paint a mask")
        for w in (self.brush_button, self.eraser_button, self.size_spin, self.overlay_box):
            w.setEnabled(on)
        mask = self.mask()
        self.clear_button.setEnabled(on and mask is not None and not mask.is_empty())
        self.setVisible(available)

    # -- tools ------------------------------------------------------------------------------
    def brush_size(self) -> int:
        """The brush diameter in init-image pixels."""
        return self.size_spin.value()

    def set_brush_size(self, diameter: int) -> None:
        """Sets the brush diameter in init-image pixels."""
        self.size_spin.setValue(int(diameter))

    def is_erasing(self) -> bool:
        """Whether the eraser (not the brush) is selected."""
        return self.eraser_button.isChecked()

    def set_erasing(self, erase: bool) -> None:
        """Selects the eraser (True) or the brush (False)."""
        self.eraser_button.setChecked(erase)
        self.brush_button.setChecked(not erase)

    def begin_stroke(self, x: float, y: float) -> None:
        """Puts the brush (or eraser) down at (x, y) in init-image pixels."""
        mask = self.mask()
        if mask is None:
            return
        self.end_stroke()
        self._stroke = MaskStroke(mask, self.brush_size() / 2, erase=self.is_erasing())
        self._stroke.begin(x, y)

    def extend_stroke(self, x: float, y: float) -> None:
        """Drags the brush to (x, y)."""
        if self._stroke is not None:
            self._stroke.extend(x, y)

    def end_stroke(self) -> None:
        """Lifts the brush: the gesture becomes one undo step."""
        stroke, self._stroke = self._stroke, None
        if stroke is None:
            return
        edit = stroke.finish()
        if edit is not None:  # its do() repaints what is there: the listeners hear the end
            self._doc.history.push(edit)

    def clear(self) -> None:
        """Clears the mask (one undo step)."""
        mask = self.mask()
        if mask is None:
            return
        self.end_stroke()
        edit = clear_edit(mask)
        if edit is not None:
            self._doc.history.push(edit)

    def load(self, pixels: np.ndarray, label: str = "Load mask") -> bool:
        """Replaces the current mask by ``pixels`` (uint8 (H, W), the mask's size) as one undo
        step; False when the size does not match or there is no mask."""
        mask = self.mask()
        if mask is None or pixels.shape != mask.pixels.shape:
            return False
        after = np.where(pixels >= 128, 255, 0).astype(np.uint8)
        if not np.array_equal(after, mask.pixels):
            self._doc.history.push(MaskEdit(mask, mask.full_box, mask.pixels.copy(), after,
                                            label))
        return True

    # -- the overlay ------------------------------------------------------------------------
    def overlay_image(self) -> QImage | None:
        """The overlay (the mask in translucent red, the init image's size)."""
        if self._rgba is None:
            return None
        if self._overlay is None:
            h, w = self._rgba.shape[:2]
            # a view of the buffer (no copy); a new wrapper after each change, so nothing
            # keeps a cached copy of old pixels
            self._overlay = QImage(self._rgba.data, w, h, 4 * w, QImage.Format.Format_RGBA8888)
        return self._overlay

    def _show_overlay(self) -> None:
        if self.is_active():
            self._view.set_overlay(self.overlay_image() if self.overlay_box.isChecked()
                                   else None)

    def _on_mask_changed(self, box: Box) -> None:
        mask = self.mask()
        if mask is None or self._rgba is None:
            return
        x0, y0, x1, y1 = box
        self._rgba[y0:y1, x0:x1] = _LUT[mask.pixels[y0:y1, x0:x1]]
        self._overlay = None
        self._show_overlay()
        if self._stroke is None:  # an undo, redo or clear (a stroke reports when it ends)
            self._update_widgets()
            self.maskChanged.emit()


class MaskLink(QObject):
    """Keeps the draft request's ``mask`` in step with the canvas's Mask tool.

    * The tool follows the settings panel: in image-to-image mode its source is the init
      image (:meth:`on_draft_changed`).
    * After every mask change the draft gets the mask as a :class:`MediaRef` by its pixels'
      content id (None while the mask is empty: repaint everything), exactly like the init
      image, and the pixels are stored in the project's media off the GUI thread.
    * :meth:`store` (at Generate) makes sure the mask is stored before its request is queued.
    * :meth:`load` puts a stored mask (a branched request's) back into the tool.

    Args:
        canvas: the canvas (its :attr:`~studio.ui.canvas.Canvas.mask_editor`).
        params: the settings panel.
        store: the project's media store (GUI thread).
        cache: the media cache (reads stored masks).
        background: the thread pool for writing the PNG.
        notify: tells the user something (text, is_error).
    """

    def __init__(self, canvas, params, store: MediaStore, cache, background,
                 notify: Callable[[str, bool], None], parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._canvas = canvas
        self.editor: MaskEditor = canvas.mask_editor
        self._params = params
        self._store = store
        self._cache = cache
        self._bg = background
        self._notify = notify
        self._saving: set[str] = set()
        params.draftChanged.connect(self.on_draft_changed)
        self.editor.maskChanged.connect(self.sync)

    def on_draft_changed(self) -> None:
        """Points the Mask tool at the draft's init image (image-to-image mode only)."""
        init = self._params.init_slot.refs()
        self._canvas.set_mask_source(init[0] if self._params.mode() == "i2i" and init
                                     else None)

    def ref(self) -> MediaRef | None:
        """The painted mask as a request input (None when there is none or it is empty)."""
        mask = self.editor.mask()
        if mask is None or mask.is_empty():
            return None
        return MediaRef(pixels_content_id(mask.pixels), MASK_SOURCE, MASK_CONVERSION)

    def sync(self) -> None:
        """Hands the mask to the draft and stores it in the background."""
        ref = self.ref()
        mask = self.editor.mask()
        if ref is None or mask is None:
            self._params.set_mask(None)
            return
        self._params.set_mask(ref, f"Mask: {mask.coverage():.0%} of the image is repainted "
                                   f"(the rest keeps the init image)")
        key = ref.content_id
        if key in self._saving or self._store.find_by_pixels(key):
            return
        self._saving.add(key)
        store = self._store

        def done(staged) -> None:
            self._saving.discard(key)
            try:
                store.commit(staged)
            except OSError:
                log.exception("storing the mask failed")  # Generate stores it again

        def failed(exc: BaseException) -> None:
            self._saving.discard(key)
            log.error("storing the mask failed", exc_info=exc)

        self._bg.submit(store.stage_image, mask.pixels.copy(), {"source": MASK_SOURCE},
                        on_done=done, on_error=failed)

    def store(self) -> None:
        """Makes sure the draft carries the painted mask and the project holds its pixels
        (written here, synchronously, if the background write has not landed yet)."""
        self.sync()
        ref, mask = self.ref(), self.editor.mask()
        if ref is not None and mask is not None and self._params.mode() == "i2i" and \
                self._store.find_by_pixels(ref.content_id) is None:
            self._store.put_image(mask.pixels.copy())

    def clear(self) -> None:
        """Empties the Mask tool's mask of the current init image (one undo step when it was
        painted), for a branched request that has none: without this the mask painted for
        another request on the same init image would come back into the draft at Generate."""
        mask = self.editor.mask()
        if mask is not None and not mask.is_empty():
            self.editor.clear()
        self.sync()

    def load(self, ref: MediaRef, label: str) -> None:
        """Puts a stored mask in the Mask tool (one undo step); tells the user when it
        cannot be read or does not fit the init image."""
        media_id = self._store.find_by_pixels(ref.content_id)
        key = self.editor.key

        def loaded(frames: np.ndarray | None) -> None:
            if frames is None or self.editor.key != key or not self.editor.load(
                    np.asarray(frames[0])[..., 0], label):
                self._notify("The mask of that request could not be loaded; paint it again.",
                             True)
                self.sync()

        if media_id is None or key is None:
            loaded(None)
        else:
            self._cache.request_frames(media_id, loaded)
