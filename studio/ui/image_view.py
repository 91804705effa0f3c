"""Viewing pixels: a zoomable, pannable image view, a frame player and its controls.

* :class:`ImageView` paints one QImage (optionally a second one for a wipe) under a zoom and a
  pan: the wheel zooms around the cursor, a drag pans, :meth:`fit` and :meth:`actual_size`
  reset. Its view state is (zoom or None for "fit", centre as a fraction of the image), so
  views of pictures of different sizes can be kept in step (:meth:`view_state`,
  :meth:`set_view_state`, :attr:`viewChanged`).
* :class:`FramePlayer` is the clock of a video: position, play/pause, loop, frame step. One
  player can drive several views (the compare view's synchronized playback).
* :class:`PlayerControls` are the buttons and the scrub slider of a player.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, QPointF, QRectF, QSize, Qt, QTimer, Signal
from PySide6.QtGui import (
    QColor,
    QImage,
    QMouseEvent,
    QPainter,
    QPaintEvent,
    QPen,
    QResizeEvent,
    QWheelEvent,
)
from PySide6.QtWidgets import (
    QCheckBox,
    QHBoxLayout,
    QLabel,
    QSlider,
    QToolButton,
    QWidget,
)

MIN_ZOOM, MAX_ZOOM = 0.02, 64.0
BACKGROUND = QColor(32, 32, 34)


class ImageView(QWidget):
    """Shows a QImage with zoom and pan; optionally a second image right of a wipe line.

    Signals:
        viewChanged(): the user zoomed or panned (not emitted by :meth:`set_view_state`).
    """

    viewChanged = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._image: QImage | None = None
        self._second: QImage | None = None
        self._split = 0.5
        self._zoom: float | None = None
        self._center = (0.5, 0.5)
        self._message = ""
        self._drag: QPointF | None = None
        self.setFocusPolicy(Qt.FocusPolicy.ClickFocus)
        self.setMinimumSize(96, 96)
        self.setAttribute(Qt.WidgetAttribute.WA_OpaquePaintEvent)

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt override)
        """A comfortable default size."""
        return QSize(512, 512)

    # -- content ----------------------------------------------------------------------------
    def set_image(self, image: QImage | None, second: QImage | None = None) -> None:
        """Shows ``image`` (None: nothing) and, for a wipe, ``second`` right of the split."""
        self._image = image if image is not None and not image.isNull() else None
        self._second = second if second is not None and not second.isNull() else None
        self.update()

    def image(self) -> QImage | None:
        """The image shown (None when empty)."""
        return self._image

    def set_split(self, fraction: float) -> None:
        """Where the wipe line is, as a fraction of the image width (0-1)."""
        self._split = min(max(fraction, 0.0), 1.0)
        self.update()

    def set_message(self, text: str) -> None:
        """A line of text drawn over the view (e.g. "Queued", a progress or an error)."""
        self._message = text
        self.update()

    def message(self) -> str:
        """The text drawn over the view."""
        return self._message

    # -- view state -------------------------------------------------------------------------
    def scale(self) -> float:
        """Screen pixels per image pixel."""
        if self._zoom is not None:
            return self._zoom
        if self._image is None:
            return 1.0
        iw, ih = self._image.width(), self._image.height()
        return max(MIN_ZOOM, min(self.width() / iw, self.height() / ih))

    def view_state(self) -> tuple[float | None, tuple[float, float]]:
        """(zoom or None for fit, centre as fractions of the image size)."""
        return self._zoom, self._center

    def set_view_state(self, zoom: float | None, center: tuple[float, float]) -> None:
        """Applies a view state (from another view) without emitting :attr:`viewChanged`."""
        self._zoom = None if zoom is None else min(max(zoom, MIN_ZOOM), MAX_ZOOM)
        self._center = (0.5, 0.5) if zoom is None else center
        self.update()

    def fit(self) -> None:
        """Fits the whole image in the view."""
        self._zoom, self._center = None, (0.5, 0.5)
        self.update()
        self.viewChanged.emit()

    def actual_size(self) -> None:
        """One image pixel per screen pixel, centred on the current centre."""
        self._zoom = 1.0
        self.update()
        self.viewChanged.emit()

    def zoom_by(self, factor: float, anchor: QPointF | None = None) -> None:
        """Zooms by ``factor`` keeping the image point under ``anchor`` (widget coords) still."""
        if self._image is None:
            return
        iw, ih = self._image.width(), self._image.height()
        old = self.scale()
        new = min(max(old * factor, MIN_ZOOM), MAX_ZOOM)
        mid = QPointF(self.width() / 2, self.height() / 2)
        anchor = anchor if anchor is not None else mid
        cx, cy = self._center[0] * iw, self._center[1] * ih
        px = cx + (anchor.x() - mid.x()) / old
        py = cy + (anchor.y() - mid.y()) / old
        cx, cy = px - (anchor.x() - mid.x()) / new, py - (anchor.y() - mid.y()) / new
        self._zoom = new
        self._center = (cx / iw, cy / ih)
        self.update()
        self.viewChanged.emit()

    def pan_by(self, dx: float, dy: float) -> None:
        """Moves the picture by (dx, dy) screen pixels."""
        if self._image is None:
            return
        if self._zoom is None:
            self._zoom = self.scale()
        s = self.scale()
        self._center = (self._center[0] - dx / s / self._image.width(),
                        self._center[1] - dy / s / self._image.height())
        self.update()
        self.viewChanged.emit()

    def image_rect(self) -> QRectF:
        """Where the image lies in widget coordinates."""
        if self._image is None:
            return QRectF()
        s = self.scale()
        iw, ih = self._image.width() * s, self._image.height() * s
        x = self.width() / 2 - self._center[0] * iw
        y = self.height() / 2 - self._center[1] * ih
        return QRectF(x, y, iw, ih)

    # -- events -----------------------------------------------------------------------------
    def paintEvent(self, event: QPaintEvent) -> None:  # noqa: N802
        """Draws the image(s), the wipe line and the message."""
        p = QPainter(self)
        p.fillRect(self.rect(), BACKGROUND)
        if self._image is not None:
            rect = self.image_rect()
            p.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform, self.scale() < 1.0)
            p.drawImage(rect, self._image)
            if self._second is not None:
                x = rect.left() + rect.width() * self._split
                p.save()
                p.setClipRect(QRectF(x, rect.top(), rect.right() - x, rect.height()))
                p.drawImage(rect, self._second)
                p.restore()
                p.setPen(QPen(QColor(255, 255, 255), 2))
                p.drawLine(QPointF(x, rect.top()), QPointF(x, rect.bottom()))
        if self._message:
            p.setPen(QColor(235, 235, 235))
            box = self.rect().adjusted(8, 8, -8, -8)
            p.drawText(box, int(Qt.AlignmentFlag.AlignBottom | Qt.AlignmentFlag.AlignLeft
                                | Qt.TextFlag.TextWordWrap), self._message)
        p.end()

    def wheelEvent(self, event: QWheelEvent) -> None:  # noqa: N802
        """Zooms around the cursor."""
        steps = event.angleDelta().y() / 120.0
        if steps:
            self.zoom_by(1.25 ** steps, event.position())
        event.accept()

    def mousePressEvent(self, event: QMouseEvent) -> None:  # noqa: N802
        """Starts a pan (left or middle button)."""
        if event.button() in (Qt.MouseButton.LeftButton, Qt.MouseButton.MiddleButton):
            self._drag = event.position()
            self.setCursor(Qt.CursorShape.ClosedHandCursor)
        super().mousePressEvent(event)

    def mouseMoveEvent(self, event: QMouseEvent) -> None:  # noqa: N802
        """Pans while dragging."""
        if self._drag is not None:
            delta = event.position() - self._drag
            self._drag = event.position()
            self.pan_by(delta.x(), delta.y())
        super().mouseMoveEvent(event)

    def mouseReleaseEvent(self, event: QMouseEvent) -> None:  # noqa: N802
        """Ends a pan."""
        self._drag = None
        self.unsetCursor()
        super().mouseReleaseEvent(event)

    def mouseDoubleClickEvent(self, event: QMouseEvent) -> None:  # noqa: N802
        """Double click toggles fit / 100%."""
        if self._zoom is None:
            self.actual_size()
        else:
            self.fit()

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802
        """Repaints at the new size (fit follows the size)."""
        super().resizeEvent(event)
        self.update()


class FramePlayer(QObject):
    """The clock of a video: a frame position in [0, frame_count), play/pause and loop.

    Signals:
        positionChanged(int): the frame to show.
        playingChanged(bool): playback started or stopped.
    """

    positionChanged = Signal(int)
    playingChanged = Signal(bool)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._count = 0
        self._fps = 16.0
        self._position = 0
        self.loop = True
        self._timer = QTimer(self)
        self._timer.timeout.connect(self._tick)

    @property
    def frame_count(self) -> int:
        """Frames of the longest source (0 or 1: nothing to play)."""
        return self._count

    @property
    def fps(self) -> float:
        """Playback rate in frames per second."""
        return self._fps

    @property
    def position(self) -> int:
        """The current frame."""
        return self._position

    @property
    def playing(self) -> bool:
        """Whether playback runs."""
        return self._timer.isActive()

    def set_source(self, frame_count: int, fps: float) -> None:
        """A new source: stops, goes to frame 0 (emits positionChanged)."""
        self.pause()
        self._count = max(0, int(frame_count))
        self._fps = fps if fps and fps > 0 else 16.0
        self._timer.setInterval(max(5, round(1000 / self._fps)))
        self._position = 0
        self.positionChanged.emit(0)

    def play(self) -> None:
        """Starts playback (from the start if at the end without loop)."""
        if self._count <= 1 or self.playing:
            return
        if self._position >= self._count - 1 and not self.loop:
            self.seek(0)
        self._timer.start()
        self.playingChanged.emit(True)

    def pause(self) -> None:
        """Stops playback."""
        if self._timer.isActive():
            self._timer.stop()
            self.playingChanged.emit(False)

    def toggle(self) -> None:
        """Play if paused, pause if playing."""
        if self.playing:
            self.pause()
        else:
            self.play()

    def step(self, delta: int) -> None:
        """Pauses and moves ``delta`` frames (wrapping when looping)."""
        self.pause()
        if self._count <= 1:
            return
        target = self._position + delta
        if self.loop:
            target %= self._count
        self.seek(target)

    def seek(self, position: int) -> None:
        """Goes to a frame (clamped)."""
        position = min(max(int(position), 0), max(self._count - 1, 0))
        if position != self._position:
            self._position = position
            self.positionChanged.emit(position)

    def _tick(self) -> None:
        if self._position + 1 < self._count:
            self.seek(self._position + 1)
        elif self.loop:
            self.seek(0)
        else:
            self.pause()


class PlayerControls(QWidget):
    """Play/pause, frame step, scrub slider, loop and a frame counter for a player."""

    def __init__(self, player: FramePlayer, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.player = player
        self.play_button = QToolButton(text="▶", toolTip="Play / pause (Space)")
        self.back_button = QToolButton(text="◀|", toolTip="Previous frame (Left)")
        self.forward_button = QToolButton(text="|▶", toolTip="Next frame (Right)")
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.loop_box = QCheckBox("Loop", checked=player.loop)
        self.label = QLabel("")
        for w in (self.play_button, self.back_button, self.forward_button):
            w.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(4, 0, 4, 0)
        for w in (self.back_button, self.play_button, self.forward_button, self.slider,
                  self.label, self.loop_box):
            layout.addWidget(w)
        self.play_button.clicked.connect(player.toggle)
        self.back_button.clicked.connect(lambda: player.step(-1))
        self.forward_button.clicked.connect(lambda: player.step(1))
        self.slider.valueChanged.connect(player.seek)
        self.loop_box.toggled.connect(lambda on: setattr(player, "loop", on))
        player.positionChanged.connect(self._on_position)
        player.playingChanged.connect(
            lambda on: self.play_button.setText("❚❚" if on else "▶"))
        self.refresh()

    def refresh(self) -> None:
        """Follows the player's source: hidden for stills."""
        count = self.player.frame_count
        self.slider.blockSignals(True)
        self.slider.setRange(0, max(count - 1, 0))
        self.slider.setValue(self.player.position)
        self.slider.blockSignals(False)
        self._on_position(self.player.position)
        self.setVisible(count > 1)

    def _on_position(self, position: int) -> None:
        self.slider.blockSignals(True)
        self.slider.setValue(position)
        self.slider.blockSignals(False)
        self.label.setText(f"{position + 1}/{self.player.frame_count}")
