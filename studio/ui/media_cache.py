"""Result media for the views: frames and thumbnails, decoded off the GUI thread.

The project's database is asked where a file is (on the GUI thread); the file is read and
decoded on a :class:`~studio.ui.background.Background` thread. Videos are memory-mapped, so
"loading" a long video costs nothing until a frame is shown. Caches are small LRUs.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QImage

from studio.store.media import MediaStore
from studio.ui.background import Background, thumbnail_pixels, to_qimage

log = logging.getLogger(__name__)

THUMBNAIL_SIZE = 96


def read_frames(path: Path, kind: str, shape: list[int]) -> np.ndarray:
    """Reads a stored medium as uint8 (F, H, W, 3) (thread-safe; videos memory-mapped)."""
    if kind == "video":
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    else:
        from PIL import Image

        with Image.open(path) as img:
            arr = np.asarray(img, dtype=np.uint8).reshape(shape)[None]
    if arr.ndim == 3:  # (F, H, W) gray
        arr = np.repeat(np.asarray(arr)[..., None], 3, axis=3)
    elif arr.shape[-1] == 1:
        arr = np.repeat(np.asarray(arr), 3, axis=3)
    elif arr.shape[-1] == 4:
        arr = np.ascontiguousarray(arr[..., :3])
    return arr


def _thumbnail(path: Path, kind: str, shape: list[int], size: int) -> QImage:
    frames = read_frames(path, kind, shape)
    return to_qimage(thumbnail_pixels(np.asarray(frames[0]), size))


class MediaCache(QObject):
    """Frames and thumbnails of stored media, loaded on demand.

    Signals:
        framesReady(media_id): :meth:`frames` now has the frames (or an error).
        thumbnailReady(media_id): :meth:`thumbnail` now has the picture.
    """

    framesReady = Signal(str)
    thumbnailReady = Signal(str)

    def __init__(
        self, media: MediaStore, background: Background, *, max_items: int = 24,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self._media = media
        self._bg = background
        self._frames: OrderedDict[str, np.ndarray] = OrderedDict()
        self._thumbs: OrderedDict[str, QImage] = OrderedDict()
        self._errors: dict[str, str] = {}
        self._loading: set[tuple[str, str]] = set()
        self._waiters: dict[str, list[Callable[[np.ndarray | None], None]]] = {}
        self._max = max_items

    def _source(self, media_id: str) -> tuple[Path, str, list[int]]:
        info = self._media.info(media_id)
        return self._media.path(media_id), info["kind"], info["meta"]["shape"]

    def info(self, media_id: str) -> dict[str, Any]:
        """kind, ext, pixels_id and meta of a medium (GUI thread)."""
        return self._media.info(media_id)

    def find_by_pixels(self, pixels_id: str) -> str | None:
        """The stored medium whose pixels have this content id, or None (GUI thread)."""
        return self._media.find_by_pixels(pixels_id)

    def error(self, media_id: str) -> str:
        """Why a medium could not be read ("" when it could, or has not been tried)."""
        return self._errors.get(media_id, "")

    # -- frames -----------------------------------------------------------------------------
    def frames(self, media_id: str) -> np.ndarray | None:
        """The frames (F, H, W, 3) if loaded; otherwise starts loading and returns None."""
        if media_id in self._frames:
            self._frames.move_to_end(media_id)
            return self._frames[media_id]
        self._load_frames(media_id)
        return None

    def request_frames(self, media_id: str, callback: Callable[[np.ndarray | None], None]) -> None:
        """Calls ``callback(frames or None)`` on the GUI thread once the frames are loaded."""
        cached = self.frames(media_id)
        if cached is not None or media_id in self._errors:
            callback(cached)
            return
        self._waiters.setdefault(media_id, []).append(callback)

    async def load_frames(self, media_id: str) -> np.ndarray:
        """The frames, loaded off the GUI thread if needed.

        Raises:
            KeyError: unknown medium. OSError: the file is missing or unreadable.
        """
        if media_id in self._frames:
            return self._frames[media_id]
        frames = await self._bg.call(read_frames, *self._source(media_id))
        self._remember(self._frames, media_id, frames)
        return frames

    def _load_frames(self, media_id: str) -> None:
        key = ("frames", media_id)
        if key in self._loading:
            return
        try:
            source = self._source(media_id)
        except (KeyError, ValueError) as exc:
            self._failed(media_id, str(exc))
            return
        self._loading.add(key)

        def done(frames: np.ndarray) -> None:
            self._loading.discard(key)
            self._remember(self._frames, media_id, frames)
            self._errors.pop(media_id, None)
            self._notify(media_id, frames)

        def error(exc: BaseException) -> None:
            self._loading.discard(key)
            self._failed(media_id, f"cannot read the result file ({exc})")

        self._bg.submit(read_frames, *source, on_done=done, on_error=error)

    def _failed(self, media_id: str, message: str) -> None:
        log.error("media %s: %s", media_id, message)
        self._errors[media_id] = message
        self._notify(media_id, None)

    def _notify(self, media_id: str, frames: np.ndarray | None) -> None:
        for callback in self._waiters.pop(media_id, []):
            callback(frames)
        self.framesReady.emit(media_id)

    # -- thumbnails -------------------------------------------------------------------------
    def thumbnail(self, media_id: str) -> QImage | None:
        """The thumbnail if made; otherwise starts making it and returns None."""
        if media_id in self._thumbs:
            return self._thumbs[media_id]
        key = ("thumb", media_id)
        if key in self._loading or media_id in self._errors:
            return None
        try:
            source = self._source(media_id)
        except (KeyError, ValueError) as exc:
            self._errors[media_id] = str(exc)
            return None
        self._loading.add(key)

        def done(image: QImage) -> None:
            self._loading.discard(key)
            self._remember(self._thumbs, media_id, image, limit=512)
            self.thumbnailReady.emit(media_id)

        def error(exc: BaseException) -> None:
            self._loading.discard(key)
            self._errors[media_id] = str(exc)
            log.error("thumbnail of %s failed: %s", media_id, exc)

        self._bg.submit(_thumbnail, *source, THUMBNAIL_SIZE, on_done=done, on_error=error)
        return None

    def _remember(self, cache: OrderedDict, key: str, value: Any, limit: int = 0) -> None:
        cache[key] = value
        cache.move_to_end(key)
        while len(cache) > (limit or self._max):
            cache.popitem(last=False)
