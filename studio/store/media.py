"""Content-addressed media files of a project: ``media/<id[:2]>/<id>.<ext>``.

The id of a file is the blake2b-128 hex digest (32 digits, as every content id of the studio)
of the file's bytes, so a file can always be checked against its name (:meth:`verify`).

Formats:

* images: PNG written by Pillow from uint8 pixels, shape (H, W), (H, W, 1), (H, W, 3) or
  (H, W, 4);
* videos: one raw ``.npy`` file of uint8 frames, shape (F, H, W) or (F, H, W, C) with C in
  1/3/4, written with ``numpy.save(allow_pickle=False)`` and read with ``allow_pickle=False``
  (memory-mapped on request). Chosen over a folder of PNGs because it is one file (one rename
  makes it appear atomically), needs no codec and can be memory-mapped; the MP4 export is a
  separate, later step.

Each media row also keeps ``pixels_id``, :func:`studio.core.media.pixels_content_id` of the
pixels, which is how a generation request names its input images; :meth:`find_by_pixels` maps
it back to the stored file.

Write protocol (crash-safe): the bytes go to a temporary file in ``media/incoming/`` (the id,
hence the final folder, is known only once the bytes are hashed; both folders are on one file
system, so the rename is atomic) while being hashed; flush, ``os.fsync``, ``os.replace`` to the final name, ``fsync`` of the folder;
only then is the row committed. ``stage_*`` + :meth:`MediaStore.commit` split the two halves so
the file part can run on a worker thread. A crash leaves at most an unreferenced file or temp file,
which :meth:`MediaStore.collect_garbage` removes; never a row without its file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from PIL import Image

from studio.core.media import pixels_content_id

log = logging.getLogger(__name__)

MEDIA_KINDS = ("image", "video")
_EXT = {"image": "png", "video": "npy"}
_MEDIA_ID = re.compile(r"[0-9a-f]{32}")
_TEMP_PREFIX = ".tmp-"
_TRASH = "trash"
_PIL_MODES = {1: "L", 3: "RGB", 4: "RGBA"}


def media_id_of(data: bytes) -> str:
    """Content id of file bytes: blake2b-128 hex (32 digits)."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _check_media_id(media_id: Any) -> str:
    if not isinstance(media_id, str) or not _MEDIA_ID.fullmatch(media_id):
        raise ValueError(f"media_id: expected 32 lowercase hex digits, got {media_id!r}")
    return media_id


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _HashingWriter:
    """A write-only file object that hashes what passes through it.

    It has no ``fileno`` on purpose: Pillow would then write to the descriptor directly and
    bypass the hash.
    """

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self._hash = hashlib.blake2b(digest_size=16)
        self._size = 0

    def write(self, data: bytes) -> int:
        view = memoryview(data).cast("B")
        self._hash.update(view)
        self._raw.write(view)
        self._size += len(view)
        return len(view)

    def flush(self) -> None:
        self._raw.flush()

    def tell(self) -> int:
        return self._size

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def _check_pixels(array: Any, name: str, video: bool) -> np.ndarray:
    if not isinstance(array, np.ndarray) or array.dtype != np.uint8:
        got = getattr(array, "dtype", type(array).__name__)
        raise ValueError(f"{name}: expected a uint8 numpy array, got {got}")
    base = 3 if video else 2
    ok = array.ndim == base or (array.ndim == base + 1 and array.shape[-1] in (1, 3, 4))
    if not ok or 0 in array.shape:
        want = "(F, H, W[, C])" if video else "(H, W[, C])"
        raise ValueError(f"{name}: expected shape {want} with C in 1/3/4, got {array.shape}")
    return np.ascontiguousarray(array)


@dataclass(frozen=True)
class StagedMedia:
    """A media file written to its final place but not recorded yet (see
    :meth:`MediaStore.stage_image`).

    Attributes:
        media_id: content id of the file's bytes.
        kind: ``image`` or ``video``.
        ext: file extension (``png`` or ``npy``).
        pixels_id: :func:`studio.core.media.pixels_content_id` of the pixels.
        meta: what the row's ``meta_json`` will hold (shape, dtype, bytes and any extras).
    """

    media_id: str
    kind: str
    ext: str
    pixels_id: str
    meta: dict[str, Any]


class MediaStore:
    """The ``media/`` folder of a project and its ``media`` table.

    Created by :class:`studio.store.Project`, which owns the connection and the
    ``transaction`` context manager; use it from the thread that opened the project.
    """

    def __init__(
        self,
        root: Path,
        conn: sqlite3.Connection,
        transaction: Callable[[], AbstractContextManager[Any]],
    ) -> None:
        self.root = Path(root)
        self._conn = conn
        self._transaction = transaction
        self.root.mkdir(parents=True, exist_ok=True)
        # staged and not yet committed (or released): garbage collection keeps these ids, so
        # a result being saved is never taken for an unreferenced medium of the same bytes
        self._staged: dict[str, int] = {}
        self._staged_lock = threading.Lock()

    # -- writing ----------------------------------------------------------------------------
    def put_image(self, pixels: np.ndarray) -> str:
        """Stores uint8 pixels (H, W[, C]) as PNG; returns the media id (existing ones dedupe).

        Raises:
            ValueError: not uint8 or a bad shape (names ``pixels``).
            OSError: the file could not be written (nothing is recorded then).
        """
        return self.commit(self.stage_image(pixels))

    def put_video(self, frames: np.ndarray) -> str:
        """Stores uint8 frames (F, H, W[, C]) as one ``.npy`` file; returns the media id.

        Raises:
            ValueError: not uint8 or a bad shape (names ``frames``).
            OSError: the file could not be written (nothing is recorded then).
        """
        return self.commit(self.stage_video(frames))

    def stage_image(
        self, pixels: np.ndarray, extra_meta: dict[str, Any] | None = None
    ) -> StagedMedia:
        """Writes the PNG file of :meth:`put_image` without recording it (no database access).

        Safe to call from any thread: the slow part of storing (encoding, hashing, fsync) can
        run off the UI thread, and :meth:`commit` then records the row on the thread that owns
        the connection. A staged file that is never committed is an orphan that
        :meth:`collect_garbage` removes after its grace period.

        Args:
            extra_meta: JSON-able values kept in the row's meta (e.g. fps, environment).
        """
        arr = _check_pixels(pixels, "pixels", video=False)
        plane = arr[..., 0] if arr.ndim == 3 and arr.shape[2] == 1 else arr
        mode = "L" if plane.ndim == 2 else _PIL_MODES[plane.shape[2]]
        image = Image.fromarray(plane, mode=mode)
        write = lambda f: image.save(f, format="PNG", optimize=False)  # noqa: E731
        return self._stage("image", write, arr, extra_meta)

    def stage_video(
        self, frames: np.ndarray, extra_meta: dict[str, Any] | None = None
    ) -> StagedMedia:
        """Writes the ``.npy`` file of :meth:`put_video` without recording it; see
        :meth:`stage_image`."""
        arr = _check_pixels(frames, "frames", video=True)
        write = lambda f: np.save(f, arr, allow_pickle=False)  # noqa: E731
        return self._stage("video", write, arr, extra_meta)

    def commit(self, staged: StagedMedia) -> str:
        """Records a staged file (one row; an existing id is kept as is); returns its id.

        Raises:
            OSError: the staged file is gone (e.g. collected as an orphan meanwhile).
        """
        path = self._path(staged.media_id, staged.ext)
        if not path.exists():
            self.release(staged)
            raise OSError(f"media: the staged file {path} is missing")
        self.release(staged)  # from here the row (or the caller's rollback) decides its fate
        with self._transaction():
            self._conn.execute(
                "INSERT INTO media (id, kind, ext, pixels_id, meta_json, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO NOTHING",
                (
                    staged.media_id,
                    staged.kind,
                    staged.ext,
                    staged.pixels_id,
                    json.dumps(staged.meta),
                    time.time(),
                ),
            )
        return staged.media_id

    def release(self, staged: StagedMedia) -> None:
        """Gives a staged file up without recording it: garbage collection may then take it
        (after its orphan grace) like any file without a row. :meth:`commit` releases too."""
        with self._staged_lock:
            left = self._staged.get(staged.media_id, 0) - 1
            if left > 0:
                self._staged[staged.media_id] = left
            else:
                self._staged.pop(staged.media_id, None)

    def staged_ids(self) -> frozenset[str]:
        """The ids staged and not yet committed or released (any thread)."""
        with self._staged_lock:
            return frozenset(self._staged)

    def _stage(
        self,
        kind: str,
        write: Callable[[Any], None],
        pixels: np.ndarray,
        extra_meta: dict[str, Any] | None,
    ) -> StagedMedia:
        ext = _EXT[kind]
        tmp_dir = self.root / "incoming"
        tmp_dir.mkdir(exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=_TEMP_PREFIX, suffix="." + ext, dir=tmp_dir)
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as raw:
                writer = _HashingWriter(raw)
                write(writer)
                raw.flush()
                os.fsync(raw.fileno())
            media_id = writer.hexdigest()
            final = self._path(media_id, ext)
            final.parent.mkdir(exist_ok=True)
            # incoming/ and the fan-out folders are both inside media/: one file system, so
            # the rename is atomic. Replacing an existing file rewrites identical bytes.
            with self._staged_lock:  # kept from collection before the file is in place
                self._staged[media_id] = self._staged.get(media_id, 0) + 1
            try:
                os.replace(tmp, final)
            except BaseException:
                self.release(StagedMedia(media_id, kind, ext, "", {}))
                raise
            _fsync_dir(final.parent)
            # media/ too, every time: two stagings may share a new fan-out folder, and the
            # one that did not create it must not see its row committed before the folder's
            # entry is durable
            _fsync_dir(self.root)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        meta = {**(extra_meta or {}), "shape": list(pixels.shape), "dtype": "uint8"}
        meta["bytes"] = writer.tell()
        return StagedMedia(media_id, kind, ext, pixels_content_id(pixels), meta)

    # -- reading ----------------------------------------------------------------------------
    def _row(self, media_id: str) -> sqlite3.Row | tuple:
        row = self._conn.execute(
            "SELECT kind, ext, pixels_id, meta_json FROM media WHERE id = ?",
            (_check_media_id(media_id),),
        ).fetchone()
        if row is None:
            raise KeyError(f"media_id: no media {media_id!r} in this project")
        return row

    def _path(self, media_id: str, ext: str) -> Path:
        """The file of a medium. Both parts come from the project's database, which a shared
        project's author controls: anything but a 32-digit hex id and a known extension
        would name a path outside ``media/`` ("../..") and is refused.

        Raises:
            ValueError: a malformed id or extension (names ``media_id``).
        """
        if not (isinstance(media_id, str) and _MEDIA_ID.fullmatch(media_id)) or \
                ext not in _EXT.values():
            raise ValueError(f"media_id: the project's database names a medium "
                             f"{str(media_id)[:40]!r} with extension {str(ext)[:20]!r}, which "
                             f"is not a media file of a project (damaged or crafted)")
        return self.root / media_id[:2] / f"{media_id}.{ext}"

    def __contains__(self, media_id: object) -> bool:
        if not isinstance(media_id, str) or not _MEDIA_ID.fullmatch(media_id):
            return False
        sql = "SELECT 1 FROM media WHERE id = ?"
        return self._conn.execute(sql, (media_id,)).fetchone() is not None

    def ids(self) -> set[str]:
        """Ids of every stored medium."""
        return {r[0] for r in self._conn.execute("SELECT id FROM media")}

    def path(self, media_id: str) -> Path:
        """Where the file of a medium lies. Raises KeyError if unknown, ValueError if malformed."""
        return self._path(media_id, self._row(media_id)[1])

    def kind(self, media_id: str) -> str:
        """ "image" or "video"."""
        return self._row(media_id)[0]

    def info(self, media_id: str) -> dict[str, Any]:
        """kind, ext, pixels_id and meta (shape, dtype, bytes) of a medium."""
        kind, ext, pixels_id, meta = self._row(media_id)
        return {"kind": kind, "ext": ext, "pixels_id": pixels_id, "meta": json.loads(meta)}

    def find_by_pixels(self, pixels_id: str) -> str | None:
        """The media id whose pixels have this :func:`pixels_content_id`, or None."""
        row = self._conn.execute(
            "SELECT id FROM media WHERE pixels_id = ? ORDER BY created_at LIMIT 1", (pixels_id,)
        ).fetchone()
        return None if row is None else row[0]

    def get_image(self, media_id: str) -> np.ndarray:
        """The stored pixels, uint8, in the shape they were stored with.

        Raises:
            KeyError: unknown id. OSError: the file is missing or unreadable.
        """
        kind, ext, _, meta = self._row(media_id)
        if kind != "image":
            raise ValueError(f"media_id: {media_id} is a {kind}, not an image")
        with Image.open(self._path(media_id, ext)) as img:
            arr = np.asarray(img, dtype=np.uint8)
        return arr.reshape(json.loads(meta)["shape"])

    def get_video(self, media_id: str, *, mmap: bool = False) -> np.ndarray:
        """The stored frames, uint8 (F, H, W[, C]); read-only memory map when ``mmap``.

        Raises:
            KeyError: unknown id. OSError: the file is missing or unreadable.
        """
        kind, ext, _, _ = self._row(media_id)
        if kind != "video":
            raise ValueError(f"media_id: {media_id} is a {kind}, not a video")
        mode = "r" if mmap else None
        return np.load(self._path(media_id, ext), mmap_mode=mode, allow_pickle=False)

    def verify(self, media_id: str) -> bool:
        """Whether the file exists and its bytes hash to its id."""
        path = self.path(media_id)
        h = hashlib.blake2b(digest_size=16)
        try:
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
        except FileNotFoundError:
            return False
        return h.hexdigest() == media_id

    # -- garbage collection -----------------------------------------------------------------
    def collect_garbage(self, keep: Iterable[str], *, orphan_grace_s: float = 3600.0) -> list[str]:
        """Deletes every medium whose id and pixels id are both outside ``keep``.

        :meth:`mark_garbage` then :meth:`sweep_garbage`; see those for the rules.

        Returns:
            The ids whose rows or orphan files were deleted.

        Raises:
            sqlite3.IntegrityError: a medium outside ``keep`` is still an artifact of a variant
                (the caller's ``keep`` was incomplete; nothing is deleted).
        """
        return self.sweep_garbage(self.mark_garbage(keep), orphan_grace_s=orphan_grace_s)

    def mark_garbage(self, keep: Iterable[str]) -> GarbagePlan:
        """The part of garbage collection that needs the database (the connection's thread).

        Deletes the rows of every medium whose id and pixels id are both outside ``keep`` (one
        transaction), then moves their files into ``media/trash/`` (a rename each: cheap, and
        a later import of the same bytes cannot collide with the deletion). The slow part, the
        deletions and the scan for orphans, is :meth:`sweep_garbage`, which may run on any
        thread. A crash in between leaves only files without rows, which a later sweep removes.

        Raises:
            sqlite3.IntegrityError: a medium outside ``keep`` is still an artifact of a variant
                (nothing is deleted).
        """
        keep = set(keep) | self.staged_ids()
        with self._transaction():
            rows = self._conn.execute("SELECT id, ext, pixels_id FROM media").fetchall()
            doomed = [(i, e) for i, e, p in rows if i not in keep and p not in keep]
            self._conn.executemany("DELETE FROM media WHERE id = ?", [(i,) for i, _ in doomed])
        trash = self.root / _TRASH
        if doomed:
            trash.mkdir(exist_ok=True)
        if doomed and trash.is_symlink():  # never move (or later delete) through a link
            log.warning("media: %s is a link; nothing is moved into it", trash)
            doomed = []
        for media_id, ext in doomed:
            with self._staged_lock:  # staged since the rows were read: its commit brings the
                if media_id in self._staged:  # row back, so the file stays
                    continue
                try:
                    source = self._path(media_id, ext)
                except ValueError:  # a crafted row: its row goes, no file is touched
                    log.warning("media: malformed row %r.%r dropped", media_id, ext)
                    continue
                try:
                    os.replace(source, trash / f"{media_id}.{ext}")
                except FileNotFoundError:
                    pass
        # staged files are not orphans either, however old (a save waiting on a slow thread)
        known = frozenset(i for i, _, _ in rows) - {i for i, _ in doomed} | self.staged_ids()
        return GarbagePlan(self.root, tuple(i for i, _ in doomed), known, time.time())

    @staticmethod
    def sweep_garbage(plan: GarbagePlan, *, orphan_grace_s: float = 3600.0) -> list[str]:
        """Deletes the files :meth:`mark_garbage` condemned and the orphans (any thread).

        Files under ``media/`` that have no row (a crash between write and commit) and leftover
        temp files are deleted once older than ``orphan_grace_s`` seconds (counted from the
        mark), so a file that is being written and committed right now is left alone.

        Returns:
            The condemned ids, then the orphan ids deleted.
        """
        root = plan.root
        trash = root / _TRASH
        # links are never followed: a shared project's media/trash (or a fan-out folder)
        # that links elsewhere must not get files outside the project deleted
        for path in sorted(_plain_entries(trash, files=True)):
            path.unlink(missing_ok=True)  # condemned now, or by a mark a crash interrupted
        removed = list(plan.doomed)
        for sub in sorted(p for p in _plain_entries(root, files=False) if p.name != _TRASH):
            for path in _plain_entries(sub, files=True):
                stem = path.name.split(".", 1)[0]
                temp = path.name.startswith(_TEMP_PREFIX)
                if not temp and (stem in plan.known or not _MEDIA_ID.fullmatch(stem)):
                    continue
                try:
                    old = plan.marked_at - path.stat().st_mtime >= orphan_grace_s
                except FileNotFoundError:
                    continue
                if old:
                    log.info("media: removing orphan file %s", path)
                    path.unlink(missing_ok=True)
                    if not temp:
                        removed.append(stem)
        if removed:
            log.info("media: collected %d media", len(removed))
        return removed



def _plain_entries(folder: Path, *, files: bool) -> list[Path]:
    """The regular files (``files``) or the folders directly in ``folder``, symlinks left out
    (and none at all when ``folder`` itself is a link or missing)."""
    if folder.is_symlink() or not folder.is_dir():
        return []
    with os.scandir(folder) as entries:
        return [Path(e.path) for e in entries if not e.is_symlink() and (
            e.is_file(follow_symlinks=False) if files else e.is_dir(follow_symlinks=False))]

@dataclass(frozen=True)
class GarbagePlan:
    """What :meth:`MediaStore.mark_garbage` decided, for :meth:`MediaStore.sweep_garbage`.

    Attributes:
        root: the ``media/`` folder.
        doomed: ids whose rows were deleted (their files wait in ``media/trash/``).
        known: ids that still have rows, or are staged and not yet committed (their files
            are never orphans).
        marked_at: when the mark ran (``time.time()``); orphan ages are counted to it.
    """

    root: Path
    doomed: tuple[str, ...]
    known: frozenset[str]
    marked_at: float
