"""Work off the GUI thread, results back on it.

:class:`Background` runs plain functions on a small thread pool and delivers each result (or
error) to a callback on the GUI thread through a queued Qt signal, so it works whether or not
an asyncio loop is running (item models ask for thumbnails from ``data()``); :meth:`call`
awaits the same work from a coroutine. Functions run there must not touch the project's
SQLite connection (it belongs to the GUI thread) or create QPixmaps; QImages are fine.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QImage

log = logging.getLogger(__name__)

Done = Callable[[Any], None]
Error = Callable[[BaseException], None]


class Background(QObject):
    """Thread pools whose results come back on the GUI thread.

    Three lanes:

    * the quick lane (``workers`` threads) for work the user waits on within a second or so
      (saving a result, thumbnails, frames to show, input images);
    * the slow lane (``slow_workers`` threads) for long jobs the user waits on (MP4 and
      storyboard exports, the media sweep), so that a long job never queues a result or a
      thumbnail behind it;
    * ``detached``: one daemon thread, jobs in turn, for long work the studio may abandon
      when it closes (hashing a model's weights: minutes for a 30 GB checkpoint; its only
      write is its cache file, replaced atomically). It queues nothing of the other lanes
      behind it, and closing the window does not wait for it (pool threads are joined at
      interpreter exit; a daemon thread is not).

    Args:
        workers: threads in the quick lane.
        slow_workers: threads in the slow lane.
    """

    _finished = Signal(object)

    def __init__(self, workers: int = 2, parent: QObject | None = None,
                 slow_workers: int = 1) -> None:
        super().__init__(parent)
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, "studio-ui")
        self._slow = concurrent.futures.ThreadPoolExecutor(slow_workers, "studio-ui-slow")
        # Always queued: a result is delivered on a later turn of the event loop, never inside
        # submit() (a future that is already done runs its callback at once).
        self._finished.connect(self._deliver, Qt.ConnectionType.QueuedConnection)
        self._closed = False
        self._detached_jobs: queue.SimpleQueue | None = None

    def submit(
        self, fn: Callable[..., Any], *args: Any, on_done: Done | None = None,
        on_error: Error | None = None, slow: bool = False, detached: bool = False,
    ) -> concurrent.futures.Future:
        """Runs ``fn(*args)`` on the quick lane (the slow lane when ``slow``; the detached
        daemon thread when ``detached``: only for work that can stop anywhere without leaving
        anything half written); ``on_done(result)`` or ``on_error(exc)`` follow on the GUI
        thread (errors without ``on_error`` are logged)."""
        if detached:
            future = self._detached(fn, args)
        else:
            future = (self._slow if slow else self._pool).submit(fn, *args)

        def finished(f: concurrent.futures.Future) -> None:
            if self._closed:
                return
            try:
                self._finished.emit((f, on_done, on_error))
            except RuntimeError:  # the QObject is gone (window closed)
                pass

        future.add_done_callback(finished)
        return future

    def _detached(self, fn: Callable[..., Any], args: tuple) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        if self._detached_jobs is None:  # one thread, jobs in turn (hashes read the disk)
            self._detached_jobs = queue.SimpleQueue()
            threading.Thread(target=self._run_detached, args=(self._detached_jobs,),
                             name="studio-ui-detached", daemon=True).start()
        self._detached_jobs.put((future, fn, args))
        return future

    @staticmethod
    def _run_detached(jobs: queue.SimpleQueue) -> None:
        while True:
            future, fn, args = jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args)
            except BaseException as exc:  # noqa: BLE001 - delivered to on_error
                future.set_exception(exc)
            else:
                future.set_result(result)

    async def call(self, fn: Callable[..., Any], *args: Any, slow: bool = False) -> Any:
        """``await``-able :meth:`submit` (needs the running asyncio loop)."""
        pool = self._slow if slow else self._pool
        return await asyncio.wrap_future(pool.submit(fn, *args))

    def _deliver(self, item: tuple) -> None:
        future, on_done, on_error = item
        if future.cancelled():
            return
        exc = future.exception()
        if exc is not None:
            if on_error is not None:
                on_error(exc)
            else:
                log.error("background task failed", exc_info=exc)
        elif on_done is not None:
            on_done(future.result())

    def shutdown(self) -> None:
        """Drops queued work; running work finishes but its result is not delivered."""
        self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._slow.shutdown(wait=False, cancel_futures=True)


# -- pixels <-> QImage ---------------------------------------------------------------------
def to_qimage(pixels: np.ndarray) -> QImage:
    """A QImage owning a copy of uint8 pixels (H, W), (H, W, 3) or (H, W, 4).

    Cheap for previews and thumbnails; call it on a worker thread for large frames.
    """
    arr = np.asarray(pixels)
    if arr.dtype != np.uint8:
        raise ValueError(f"pixels: expected uint8, got {arr.dtype}")
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[..., 0]
    arr = np.ascontiguousarray(arr)
    h, w = arr.shape[:2]
    if arr.ndim == 2:
        fmt, bpl = QImage.Format.Format_Grayscale8, w
    elif arr.shape[2] == 3:
        fmt, bpl = QImage.Format.Format_RGB888, 3 * w
    elif arr.shape[2] == 4:
        fmt, bpl = QImage.Format.Format_RGBA8888, 4 * w
    else:
        raise ValueError(f"pixels: expected 1, 3 or 4 channels, got {arr.shape}")
    return QImage(arr.data, w, h, bpl, fmt).copy()


def from_qimage(image: QImage) -> np.ndarray:
    """uint8 RGB (H, W, 3) pixels of a QImage (a copy)."""
    rgb = image.convertToFormat(QImage.Format.Format_RGB888)
    w, h, bpl = rgb.width(), rgb.height(), rgb.bytesPerLine()
    buf = np.frombuffer(rgb.constBits(), np.uint8, count=bpl * h).reshape(h, bpl)
    return buf[:, : 3 * w].reshape(h, w, 3).copy()


def thumbnail_pixels(pixels: np.ndarray, size: int) -> np.ndarray:
    """``pixels`` (H, W[, 3]) scaled so the long side is at most ``size`` (never upscaled)."""
    from PIL import Image

    image = Image.fromarray(np.ascontiguousarray(pixels))
    image.thumbnail((size, size), Image.Resampling.LANCZOS)
    return np.asarray(image)


_ANCHORS = np.array(
    [[0, 0, 4], [40, 11, 84], [101, 21, 110], [159, 42, 99], [212, 72, 66], [245, 125, 21],
     [250, 193, 39], [252, 255, 164]], dtype=np.float64)
HEAT_LUT = np.stack(
    [np.interp(np.linspace(0, 1, 256), np.linspace(0, 1, len(_ANCHORS)), _ANCHORS[:, c])
     for c in range(3)], axis=1).round().astype(np.uint8)
"""A 256-entry black-purple-orange-yellow colour map (inferno-like) for difference maps."""


def difference_heatmap(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, dict[str, float]]:
    """Per-pixel difference of two RGB frames as a heat map, and its statistics.

    ``b`` is resized to ``a``'s size (bilinear) when they differ. The map shows the mean
    absolute channel difference, scaled so the largest difference is the brightest colour.

    Returns:
        (uint8 (H, W, 3) heat map, {"mean": mean |a-b| in 0-255 units, "max": the largest}).
    """
    from PIL import Image

    a = np.asarray(a)[..., :3]
    b = np.asarray(b)[..., :3]
    if a.shape != b.shape:
        b = np.asarray(Image.fromarray(np.ascontiguousarray(b)).resize(
            (a.shape[1], a.shape[0]), Image.Resampling.BILINEAR))
    diff = np.abs(a.astype(np.int16) - b.astype(np.int16)).mean(axis=2)
    top = float(diff.max())
    scaled = (diff * (255.0 / top)).round().astype(np.uint8) if top > 0 else np.zeros(
        diff.shape, np.uint8)
    return HEAT_LUT[scaled], {"mean": float(diff.mean()), "max": top}
