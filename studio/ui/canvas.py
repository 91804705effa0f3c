"""The canvas: the selected variant (image or video), live step previews, image drops.

* A finished variant shows its result; a video plays with the player controls (Space
  play/pause, Left/Right frame step through the window's actions).
* A queued or running variant shows the engine's latest step preview with the progress, so
  the picture forms while it is generated.
* Dropping (or pasting) an image offers it as an input: the canvas emits :attr:`inputOffered`
  with the file's path or bytes; decoding happens off the GUI thread in the controller, and a
  damaged file comes back as a message in the canvas's banner (:meth:`show_error`).
* In image-to-image mode with an init image, the Mask tool (:attr:`mask_editor`, see
  :mod:`studio.ui.mask_tool`) shows the init image and paints the inpainting mask over it.
* The timeline's storyboard plays here (:meth:`show_storyboard`): the film frames of
  :func:`~studio.store.storyboard.plan_storyboard`, the ones the MP4 export encodes, at the
  film's frame rate, with the same player controls.

Selecting a variant leaves the mask tool and the storyboard.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QMimeData, Qt, Signal
from PySide6.QtGui import QDragEnterEvent, QDropEvent, QGuiApplication, QImage
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from studio.core.document import PENDING, ChangeEvent, Document, Status
from studio.core.request import MediaRef
from studio.store.storyboard import StoryboardPlan
from studio.ui.background import to_qimage
from studio.ui.controller import StudioController, describe
from studio.ui.image_view import FramePlayer, ImageView, PlayerControls
from studio.ui.mask_tool import MaskEditor
from studio.ui.media_cache import MediaCache
from studio.ui.queue_panel import format_eta
from studio.ui.variants import variant_label

BANNER_STYLE = ("background: #5a1f1c; color: #ffd9d6; padding: 6px; border-radius: 3px;")
NOTE_STYLE = ("background: #1f3a5a; color: #d6e8ff; padding: 6px; border-radius: 3px;")


def image_bytes(image: QImage) -> bytes:
    """A QImage as PNG bytes (how pasted pictures enter the same decode path as files)."""
    data = QByteArray()
    buffer = QBuffer(data)
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    image.save(buffer, "PNG")
    buffer.close()
    return bytes(data.data())


def offered_images(mime: QMimeData) -> list[tuple[bytes | Path, str]]:
    """The images in a drop or the clipboard: local files first, else image data."""
    out: list[tuple[bytes | Path, str]] = []
    for url in mime.urls() if mime.hasUrls() else []:
        if url.isLocalFile():
            path = Path(url.toLocalFile())
            out.append((path, path.name))
    if not out and mime.hasImage():
        image = mime.imageData()
        if isinstance(image, QImage) and not image.isNull():
            out.append((image_bytes(image), "pasted image.png"))
    return out


VARIANT, MASK, STORYBOARD = "variant", "mask", "storyboard"


class Canvas(QWidget):
    """Shows one variant, the mask tool or the storyboard (see the module docstring).

    Signals:
        inputOffered(object, str): an image was dropped or pasted: (path or bytes, name).
        modeChanged(str): what the canvas shows changed: "variant", "mask" or "storyboard".
    """

    inputOffered = Signal(object, str)
    modeChanged = Signal(str)

    def __init__(self, document: Document, media: MediaCache, controller: StudioController,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._doc = document
        self._media = media
        self._controller = controller
        self._vid: str | None = None
        self._frames: np.ndarray | None = None
        self._media_id: str | None = None
        self._mode = VARIANT
        self._film: StoryboardPlan | None = None
        self._mask_source: str | None = None
        self.view = ImageView()
        self.mask_editor = MaskEditor(document, self.view)
        self.player = FramePlayer(self)
        self.controls = PlayerControls(self.player)
        self.caption = QLabel("")
        self.caption.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        # a long name or prompt is cut at the panel's edge, never widens the window
        self.caption.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.banner = QLabel("")
        self.banner.setWordWrap(True)
        self.banner_close = QToolButton(text="✕")
        banner_row = QHBoxLayout()
        banner_row.setContentsMargins(0, 0, 0, 0)
        banner_row.addWidget(self.banner, 1)
        banner_row.addWidget(self.banner_close)
        self._banner_box = QWidget()
        self._banner_error = False  # the banner shows an error (not a note)
        self._banner_box.setLayout(banner_row)
        self._banner_box.hide()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self._banner_box)
        layout.addWidget(self.mask_editor)
        layout.addWidget(self.view, 1)
        layout.addWidget(self.controls)
        layout.addWidget(self.caption)
        self.setAcceptDrops(True)
        self.banner_close.clicked.connect(self.clear_banner)
        self.player.positionChanged.connect(self._show_frame)
        self.mask_editor.activeChanged.connect(self._on_mask_active)
        controller.previewReady.connect(self._on_preview)
        controller.progressChanged.connect(self._on_progress)
        self._unsubscribe = document.subscribe(self._on_document)
        self.show_variant(None)

    def detach(self) -> None:
        """Stops following the document."""
        self._unsubscribe()

    # -- what is shown ----------------------------------------------------------------------
    @property
    def mode(self) -> str:
        """What is shown: "variant", "mask" (the mask tool) or "storyboard"."""
        return self._mode

    def _set_mode(self, mode: str) -> None:
        if mode == self._mode:
            return
        self._mode = mode
        if mode != MASK and self.mask_editor.is_active():
            self.mask_editor.set_active(False)  # (its activeChanged sees the new mode)
        if mode != STORYBOARD:
            self._film = None
        self.modeChanged.emit(mode)

    @property
    def variant_id(self) -> str | None:
        """The variant shown (None while the mask tool or the storyboard is shown)."""
        return self._vid if self._mode == VARIANT else None

    @property
    def frames(self) -> np.ndarray | None:
        """The result frames shown (F, H, W, 3), or None."""
        return self._frames if self._mode == VARIANT else None

    def current_frame(self) -> np.ndarray | None:
        """The frame on screen (H, W, 3): of the result, or of the storyboard; else None."""
        if self._mode == STORYBOARD and self._film is not None:
            return self._film.frame(min(self.player.position, self._film.num_frames - 1))
        if self._mode != VARIANT or self._frames is None or not len(self._frames):
            return None
        return np.asarray(self._frames[min(self.player.position, len(self._frames) - 1)])

    def show_variant(self, variant_id: str | None) -> None:
        """Shows a variant (None: nothing); leaves the mask tool and the storyboard."""
        if variant_id is not None and not self._doc.has_variant(variant_id):
            variant_id = None
        self._set_mode(VARIANT)
        self._vid = variant_id
        self._frames = None
        self._media_id = None
        self.player.set_source(0, 16.0)
        self.controls.refresh()
        if variant_id is None:
            self.view.set_image(None)
            self.view.set_message("Generate something, or select a variant.")
            self.caption.setText("")
            return
        v = self._doc.variant(variant_id)
        try:
            summary = describe(v.request)
        except ValueError:
            summary = ""
        self.caption.setText(f"{variant_label(v)} — {summary}")
        if v.status in PENDING:
            preview = self._controller.preview(variant_id)
            self.view.set_image(to_qimage(preview) if preview is not None else None)
            self._on_progress(variant_id)
        elif v.status == Status.DONE and v.artifacts:
            mid = v.artifacts[0].media_id
            self._media_id = mid
            self.view.set_message("Loading…")
            self._media.request_frames(mid, lambda frames, m=mid: self._on_frames(m, frames))
        else:
            self.view.set_image(None)
            self.view.set_message(f"{v.status}: {v.error or ''}".strip(": "))

    def _on_frames(self, media_id: str, frames: np.ndarray | None) -> None:
        if media_id != self._media_id or self._mode != VARIANT:
            return
        if frames is None:
            self.view.set_image(None)
            self.view.set_message(self._media.error(media_id) or "The result cannot be read.")
            return
        self._frames = frames
        fps = 16.0
        try:
            fps = float(self._doc.variant(self._vid).request.get("fps") or 16.0)
        except (ValueError, KeyError):
            pass
        self.view.set_message("")
        self.player.set_source(len(frames), fps)
        self.controls.refresh()
        self._show_frame(0)

    def _show_frame(self, position: int) -> None:
        if self._mode == MASK:
            return
        frame = self.current_frame()
        if frame is not None:
            self.view.set_image(to_qimage(frame))
        if self._mode == STORYBOARD and self._film is not None:
            film = self._film
            k = min(position, film.num_frames - 1)
            shot, _ = film.locate(k)
            self.caption.setText(f"Storyboard — shot {shot + 1}/{len(film.shots)} · frame "
                                 f"{k + 1}/{film.num_frames} · {film.width}x{film.height}, "
                                 f"{film.fps:g} fps")

    def _on_preview(self, variant_id: str) -> None:
        if variant_id == self._vid and self._mode == VARIANT and \
                self._doc.has_variant(variant_id) and \
                self._doc.variant(variant_id).status in PENDING:  # never over a result
            preview = self._controller.preview(variant_id)
            if preview is not None:
                self.view.set_image(to_qimage(preview))

    def _on_progress(self, variant_id: str) -> None:
        if variant_id != self._vid or not self._doc.has_variant(variant_id) or \
                self._mode != VARIANT:
            return
        v = self._doc.variant(variant_id)
        if v.status not in PENDING:
            return
        progress = self._controller.progress(variant_id)
        if v.status == Status.QUEUED:
            queue = self._doc.queue()
            text = f"Queued (#{queue.index(variant_id) + 1})" if variant_id in queue else "Queued"
        elif progress is not None:
            text = (f"Generating: step {progress.step}/{progress.total}, "
                    f"{format_eta(progress.eta_s)}")
        else:
            text = "Starting…"
        self.view.set_message(text)

    def _on_document(self, events: Sequence[ChangeEvent]) -> None:
        vid = self._vid
        if vid is None:
            return
        if self._mode != VARIANT:  # shown again when the mask tool or storyboard is left
            if not self._doc.has_variant(vid):
                self._vid = None
            return
        if not self._doc.has_variant(vid):
            self.show_variant(None)
            return
        if not any(vid in e.ids for e in events):
            return
        v = self._doc.variant(vid)
        result = v.artifacts[0].media_id if v.status == Status.DONE and v.artifacts else None
        if v.status in PENDING and self._media_id is None:
            self._on_progress(vid)
            self.caption.setText(f"{variant_label(v)} — {describe(v.request)}")
        elif result is None or result != self._media_id:
            self.show_variant(vid)
        else:
            self.caption.setText(f"{variant_label(v)} — {describe(v.request)}")

    # -- the mask tool ----------------------------------------------------------------------
    def set_mask_source(self, ref: MediaRef | None) -> None:
        """The init image the Mask tool paints on (None: not in image-to-image mode, or no
        init image). Its size comes from the project's media; its pixels load off the GUI
        thread. An init image the project does not hold leaves the tool unavailable."""
        key = ref.content_id if ref is not None else None
        if key == self._mask_source:
            return
        self._mask_source = key
        media_id = self._media.find_by_pixels(key) if key is not None else None
        if media_id is None:
            self.mask_editor.set_source(None, None)
            return
        h, w = self._media.info(media_id)["meta"]["shape"][:2]
        self.mask_editor.set_source(key, (int(w), int(h)))

        def loaded(frames: np.ndarray | None) -> None:
            if frames is not None:
                self.mask_editor.set_image(key, to_qimage(np.asarray(frames[0])))

        self._media.request_frames(media_id, loaded)

    def _on_mask_active(self, on: bool) -> None:
        if on:
            self._set_mode(MASK)
            self.player.set_source(0, 16.0)
            self.controls.refresh()
            mask = self.mask_editor.mask()
            self.caption.setText("Mask on the init image: painted areas are repainted, the "
                                 "rest keeps the init image" if mask is not None else "")
        elif self._mode == MASK:
            self.show_variant(self._vid)

    # -- the storyboard ---------------------------------------------------------------------
    @property
    def storyboard(self) -> StoryboardPlan | None:
        """The storyboard shown, if any."""
        return self._film if self._mode == STORYBOARD else None

    def show_storyboard(self, film: StoryboardPlan, position: int = 0) -> None:
        """Shows the storyboard's film (paused at ``position``); play it with :attr:`player`
        at the film's frame rate."""
        self._set_mode(STORYBOARD)
        self._film = film
        self.view.set_message("")
        self.player.set_source(film.num_frames, film.fps)
        self.controls.refresh()
        self.player.seek(position)
        self._show_frame(self.player.position)

    def leave_storyboard(self) -> None:
        """Goes back to the selected variant."""
        if self._mode == STORYBOARD:
            self.show_variant(self._vid)

    # -- messages ---------------------------------------------------------------------------
    def show_error(self, text: str, about: str = "") -> None:
        """Shows an error in the banner above the picture (until closed, replaced, or
        :meth:`clear_error` once the user has moved on). ``about`` names what it is about
        (e.g. ``"draft"``), for :meth:`clear_error` to clear it when that is fixed."""
        self.banner.setStyleSheet(BANNER_STYLE)
        self.banner.setText(text)
        self._banner_box.show()
        self._banner_error = about or True

    def show_note(self, text: str) -> None:
        """Shows a note in the banner."""
        self.banner.setStyleSheet(NOTE_STYLE)
        self.banner.setText(text)
        self._banner_box.show()
        self._banner_error = False

    def clear_error(self, about: str = "") -> None:
        """Hides the banner when it shows an error shown with the same ``about`` (a note
        stays): called when something the user did next worked, or when what the error
        was about is fixed, so that it does not linger. An error about something that
        still stands (``"save"``: changes not in the file yet) goes only with its own."""
        if self._banner_error and self._banner_error == (about or True):
            self.clear_banner()

    def banner_text(self) -> str:
        """The banner's text ("" when hidden)."""
        return self.banner.text() if self._banner_box.isVisibleTo(self) else ""

    def clear_banner(self) -> None:
        """Hides the banner."""
        self.banner.setText("")
        self._banner_box.hide()
        self._banner_error = False

    # -- drops and pastes -------------------------------------------------------------------
    def dragEnterEvent(self, event: QDragEnterEvent) -> None:  # noqa: N802
        """Accepts files and image data."""
        mime = event.mimeData()
        if mime.hasUrls() or mime.hasImage():
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:  # noqa: N802
        """Offers the dropped image(s) as inputs."""
        if self.offer(event.mimeData()):
            event.acceptProposedAction()

    def offer(self, mime: QMimeData) -> bool:
        """Offers the images of a drop or paste; False (with a message) when there are none."""
        images = offered_images(mime)
        if not images:
            self.show_error("Nothing to use here: drop an image file or paste a picture.")
            return False
        for source, name in images:
            self.inputOffered.emit(source, name)
        return True

    def paste(self) -> bool:
        """Offers the clipboard's image as an input."""
        return self.offer(QGuiApplication.clipboard().mimeData())
