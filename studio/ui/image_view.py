"""Viewing pixels: a zoomable, pannable image view, a frame player and its controls.

* :class:`ImageView` paints one QImage (optionally a second one for a wipe) under a zoom and a
  pan: the wheel zooms around the cursor, a drag pans, :meth:`fit` and :meth:`actual_size`
  reset. Its view state is (zoom or None for "fit", centre as a fraction of the image), so
  views of pictures of different sizes can be kept in step (:meth:`view_state`,
  :meth:`set_view_state`, :attr:`viewChanged`). An overlay image (the inpainting mask) can be
  drawn over the picture, and a :class:`ViewTool` (the mask brush) can take the left button:
  it gets image-pixel coordinates, and the middle button still pans.
* :class:`FramePlayer` is the clock of a video: position, play/pause, loop, frame step. One
  player can drive several views (the compare view's synchronized playback). Playback follows
  a clock (``time.monotonic`` by default; tests pass a fake one and call :meth:`tick`): the
  frame shown is the one due at the clock's time, so a slow repaint skips frames instead of
  slowing the film down.
* :class:`PlayerControls` are the buttons and the scrub slider of a player.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from PySide6.QtCore import QEvent, QObject, QPointF, QRectF, QSize, Qt, QTimer, Signal
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


class ViewTool:
    """Something the left mouse button does on an :class:`ImageView` instead of panning.

    Coordinates are image pixels (x right, y down; pixel (i, j) covers [j, j+1) x [i, i+1)).
    """

    def press(self, x: float, y: float) -> None:
        """The button went down at (x, y)."""

    def move(self, x: float, y: float) -> None:
        """The pointer moved to (x, y) with the button down."""

    def release(self) -> None:
        """The button went up (or the gesture was interrupted)."""

    def radius(self) -> float:
        """Radius in image pixels of the ring drawn around the pointer (0: none)."""
        return 0.0


def fit_rect(outer: QRectF, width: int, height: int) -> QRectF:
    """The largest rectangle of ``width`` : ``height`` inside ``outer``, centred (a
    letterbox); ``outer`` itself for an empty size."""
    if width <= 0 or height <= 0 or outer.isEmpty():
        return QRectF(outer)
    scale = min(outer.width() / width, outer.height() / height)
    w, h = width * scale, height * scale
    return QRectF(outer.center().x() - w / 2, outer.center().y() - h / 2, w, h)


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
        self._overlay: QImage | None = None
        self._tool: ViewTool | None = None
        self._tool_down = False
        self._hover: QPointF | None = None
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

    def set_overlay(self, overlay: QImage | None) -> None:
        """Draws ``overlay`` (e.g. a translucent mask, the image's size) over the image."""
        self._overlay = overlay if overlay is not None and not overlay.isNull() else None
        self.update()

    def overlay(self) -> QImage | None:
        """The overlay drawn (None when none)."""
        return self._overlay

    def set_tool(self, tool: ViewTool | None) -> None:
        """Gives the left button to ``tool`` (None: the left button pans again)."""
        if self._tool is not None and self._tool_down:
            self._tool.release()
        self._tool, self._tool_down = tool, False
        self.setMouseTracking(tool is not None)
        if tool is not None:
            self.setCursor(Qt.CursorShape.CrossCursor)
        else:
            self.unsetCursor()
            self._hover = None
        self.update()

    def tool(self) -> ViewTool | None:
        """The tool holding the left button, if any."""
        return self._tool

    def to_image(self, pos: QPointF) -> QPointF:
        """Widget coordinates to image pixels (meaningless without an image)."""
        rect = self.image_rect()
        s = self.scale()
        return QPointF((pos.x() - rect.left()) / s, (pos.y() - rect.top()) / s)

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
                # another aspect ratio is fitted inside, not stretched (the export letterboxes
                # the same way)
                p.drawImage(fit_rect(rect, self._second.width(), self._second.height()),
                            self._second)
                p.restore()
                p.setPen(QPen(QColor(255, 255, 255), 2))
                p.drawLine(QPointF(x, rect.top()), QPointF(x, rect.bottom()))
            if self._overlay is not None:
                p.drawImage(rect, self._overlay)
            radius = self._tool.radius() * self.scale() if self._tool is not None else 0.0
            if radius > 0 and self._hover is not None:
                p.setRenderHint(QPainter.RenderHint.Antialiasing, True)
                p.setBrush(Qt.BrushStyle.NoBrush)
                for color, width in ((QColor(0, 0, 0), 3), (QColor(255, 255, 255), 1)):
                    p.setPen(QPen(color, width))
                    p.drawEllipse(self._hover, radius, radius)
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
        """Starts a pan (left or middle button), or the tool's gesture (left, with a tool)."""
        button = event.button()
        if button == Qt.MouseButton.LeftButton and self._tool is not None:
            if self._image is not None:
                self._tool_down = True
                at = self.to_image(event.position())
                self._tool.press(at.x(), at.y())
        elif button in (Qt.MouseButton.LeftButton, Qt.MouseButton.MiddleButton):
            self._drag = event.position()
            self.setCursor(Qt.CursorShape.ClosedHandCursor)
        super().mousePressEvent(event)

    def mouseMoveEvent(self, event: QMouseEvent) -> None:  # noqa: N802
        """Pans while dragging; feeds the tool's gesture; moves the brush ring."""
        if self._tool is not None:
            self._hover = event.position()
            self.update()
        if self._tool_down and self._tool is not None:
            at = self.to_image(event.position())
            self._tool.move(at.x(), at.y())
        if self._drag is not None:
            delta = event.position() - self._drag
            self._drag = event.position()
            self.pan_by(delta.x(), delta.y())
        super().mouseMoveEvent(event)

    def mouseReleaseEvent(self, event: QMouseEvent) -> None:  # noqa: N802
        """Ends a pan or the tool's gesture."""
        if self._tool_down and event.button() == Qt.MouseButton.LeftButton:
            self._tool_down = False
            if self._tool is not None:
                self._tool.release()
        elif self._drag is not None:
            self._drag = None
            if self._tool is not None:
                self.setCursor(Qt.CursorShape.CrossCursor)
            else:
                self.unsetCursor()
        super().mouseReleaseEvent(event)

    def leaveEvent(self, event: QEvent) -> None:  # noqa: N802
        """Hides the brush ring."""
        self._hover = None
        self.update()
        super().leaveEvent(event)

    def mouseDoubleClickEvent(self, event: QMouseEvent) -> None:  # noqa: N802
        """Double click toggles fit / 100% (not while a tool holds the left button)."""
        if self._tool is not None and event.button() == Qt.MouseButton.LeftButton:
            return
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

    def __init__(self, parent: QObject | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(parent)
        self._count = 0
        self._fps = 16.0
        self._position = 0
        self.loop = True
        self.clock = clock
        self._anchor = (0.0, 0)  # (clock time, position) playback is counted from
        self._timer = QTimer(self)
        self._timer.setTimerType(Qt.TimerType.PreciseTimer)
        self._timer.timeout.connect(self.tick)

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
        # polled at twice the frame rate: a frame is shown at most half a frame late
        self._timer.setInterval(max(5, round(500 / self._fps)))
        self._position = 0
        self.positionChanged.emit(0)

    def play(self) -> None:
        """Starts playback (from the start if at the end without loop)."""
        if self._count <= 1 or self.playing:
            return
        if self._position >= self._count - 1 and not self.loop:
            self.seek(0)
        self._anchor = (self.clock(), self._position)
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
        """Goes to a frame (clamped); playback, if running, goes on from there."""
        self._go(position)
        self._anchor = (self.clock(), self._position)

    def _go(self, position: int) -> None:
        position = min(max(int(position), 0), max(self._count - 1, 0))
        if position != self._position:
            self._position = position
            self.positionChanged.emit(position)

    def tick(self) -> None:
        """Shows the frame due at the clock's time (the timer calls this while playing)."""
        if not self.playing or self._count <= 1:
            return
        start_time, start = self._anchor
        target = start + math.floor((self.clock() - start_time) * self._fps + 1e-6)
        if target < self._count:
            self._go(target)
        elif self.loop:
            self._go(target % self._count)
        else:
            self._go(self._count - 1)
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
