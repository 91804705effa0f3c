"""The concrete undoable edits of a :class:`~studio.core.document.Document`.

Each is a :class:`~studio.core.history.Command` pushed with ``doc.history.push(command)``:
variants (:class:`AddVariant`, :class:`DeleteVariant`, :class:`RenameVariant`,
:class:`StarVariant`) and the timeline (:class:`AddShot`, :class:`RemoveShot`,
:class:`MoveShot`, :class:`TrimShot`, :class:`SetShotDuration`). They change the document
through its low-level mutators, which emit the change events.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Iterable
from typing import Any

from studio.core.document import (
    PENDING,
    SHOTS_ADDED,
    SHOTS_MOVED,
    SHOTS_REMOVED,
    Artifact,
    Document,
    Shot,
    Status,
    Variant,
    _check_duration,
    _check_id,
    _check_nonneg_int,
    _check_trim,
    _Removed,
    new_id,
)
from studio.core.history import Command

__all__ = [
    "AddShot",
    "AddVariant",
    "DeleteVariant",
    "MoveShot",
    "RemoveShot",
    "RenameVariant",
    "SetShotDuration",
    "StarVariant",
    "TrimShot",
]


class AddVariant(Command):
    """Adds a variant (queued by default, appended to the queue); ``variant_id`` tells its id.

    Undo removes it (the controller cancels its job); redo brings back the node as it was at
    undo time (a pending one comes back queued).

    Raises:
        ValueError: bad field values (see :class:`Variant`), at construction.
        UnknownIdError: ``parent_id`` unknown, when done.
    """

    label = "Add variant"

    def __init__(
        self,
        request_json: str,
        request_id: str,
        *,
        parent_id: str | None = None,
        name: str = "",
        variant_id: str | None = None,
        status: Status | str = Status.QUEUED,
        artifacts: Iterable[Artifact] = (),
        created_at: float | None = None,
    ) -> None:
        v = Variant(
            id=variant_id or new_id(),
            parent_id=parent_id,
            request_json=request_json,
            request_id=request_id,
            status=status,
            name=name,
            artifacts=tuple(artifacts),
            created_at=time.time() if created_at is None else created_at,
        )
        self.variant_id = v.id
        queue = ((1 << 62, v.id),) if v.status in PENDING else ()
        self._snapshot = _Removed((v,), (), queue)

    def do(self, doc: Document) -> None:
        doc._restore_subtree(self._snapshot)

    def undo(self, doc: Document) -> None:
        self._snapshot = doc._remove_subtree(self.variant_id)

    def held_media(self) -> set[str]:
        return self._snapshot.media()


class DeleteVariant(Command):
    """Deletes a variant with its subtree, the shots showing them and their queued jobs.

    Undo puts all of it back where it was (pending variants come back queued).

    Raises:
        UnknownIdError: unknown variant, when done.
    """

    label = "Delete variant"

    def __init__(self, variant_id: str) -> None:
        _check_id(variant_id, "variant_id")
        self.variant_id = variant_id
        self._removed: _Removed | None = None

    def do(self, doc: Document) -> None:
        self._removed = doc._remove_subtree(self.variant_id)

    def undo(self, doc: Document) -> None:
        assert self._removed is not None
        doc._restore_subtree(self._removed)

    def held_media(self) -> set[str]:
        return self._removed.media() if self._removed else set()


class _SetField(Command):
    """Sets one field of a variant or shot, remembering the value before the first do."""

    _field = ""
    _shot = False

    def __init__(self, target_id: str, value: Any) -> None:
        self.target_id = target_id
        self.value = value
        self._old: Any = None

    @property
    def merge_key(self) -> Hashable | None:  # type: ignore[override]
        return None

    def _get(self, doc: Document) -> Any:
        obj = doc.shot(self.target_id) if self._shot else doc.variant(self.target_id)
        return getattr(obj, self._field)

    def _set(self, doc: Document, value: Any) -> None:
        if self._shot:
            doc._update_shot(self.target_id, **{self._field: value})
        else:
            doc._update_variant(self.target_id, **{self._field: value})

    def do(self, doc: Document) -> None:
        self._old = self._get(doc)
        self._set(doc, self.value)

    def undo(self, doc: Document) -> None:
        self._set(doc, self._old)

    def merge(self, other: Command) -> bool:
        assert isinstance(other, _SetField)
        self.value = other.value
        return True


#: the longest variant name, in characters (a name is a label, not a note)
MAX_NAME_CHARS = 200


def clean_variant_name(text: str) -> str:
    """A name as typed or pasted, made a label: line breaks and tabs become spaces, runs of
    spaces one, the ends trimmed, and cut to :data:`MAX_NAME_CHARS` (ending in "…")."""
    name = " ".join(str(text).split())
    if len(name) > MAX_NAME_CHARS:
        name = name[:MAX_NAME_CHARS - 1].rstrip() + "…"
    return name


class RenameVariant(_SetField):
    """Renames a variant; consecutive renames of the same variant merge into one step."""

    label = "Rename variant"
    _field = "name"

    def __init__(self, variant_id: str, name: str) -> None:
        _check_id(variant_id, "variant_id")
        if not isinstance(name, str):
            raise ValueError(f"name: expected a string, got {type(name).__name__}")
        if len(name) > MAX_NAME_CHARS:
            raise ValueError(f"name: {len(name)} characters; at most {MAX_NAME_CHARS}")
        if any(c in name for c in "\n\r\t"):
            raise ValueError("name: one line without tabs (clean_variant_name makes one)")
        super().__init__(variant_id, name)

    @property
    def merge_key(self) -> Hashable:  # type: ignore[override]
        return ("rename", self.target_id)


class StarVariant(_SetField):
    """Stars (or un-stars) a variant."""

    label = "Star variant"
    _field = "starred"

    def __init__(self, variant_id: str, starred: bool = True) -> None:
        _check_id(variant_id, "variant_id")
        if not isinstance(starred, bool):
            raise ValueError(f"starred: expected a bool, got {starred!r}")
        super().__init__(variant_id, starred)


class AddShot(Command):
    """Adds a shot showing ``variant_id`` at ``index`` (None: the end); ``shot_id`` tells its id.

    Raises:
        ValueError: bad trim or duration, at construction; ``index`` out of range when done.
        UnknownIdError: unknown variant, when done.
    """

    label = "Add shot"

    def __init__(
        self,
        variant_id: str,
        *,
        index: int | None = None,
        in_frame: int = 0,
        out_frame: int | None = None,
        duration_s: float | None = None,
        shot_id: str | None = None,
    ) -> None:
        self.shot = Shot(shot_id or new_id(), variant_id, in_frame, out_frame, duration_s)
        self.shot_id = self.shot.id
        if index is not None:
            _check_nonneg_int(index, "index")
        self.index = index

    def do(self, doc: Document) -> None:
        doc.variant(self.shot.variant_id)
        if any(s.id == self.shot_id for s in doc._shots):
            raise ValueError(f"shot_id: shot {self.shot_id} already exists")
        index = len(doc._shots) if self.index is None else self.index
        if index > len(doc._shots):
            raise ValueError(f"index: expected 0..{len(doc._shots)}, got {index}")
        doc._shots.insert(index, self.shot)
        self.index = index
        doc._emit(SHOTS_ADDED, (self.shot_id,))

    def undo(self, doc: Document) -> None:
        i = doc.shot_index(self.shot_id)
        self.shot = doc._shots.pop(i)
        doc._emit(SHOTS_REMOVED, (self.shot_id,))


class RemoveShot(Command):
    """Removes a shot from the timeline; undo puts it back at its place."""

    label = "Remove shot"

    def __init__(self, shot_id: str) -> None:
        _check_id(shot_id, "shot_id")
        self.shot_id = shot_id
        self._removed: tuple[int, Shot] | None = None

    def do(self, doc: Document) -> None:
        i = doc.shot_index(self.shot_id)
        self._removed = (i, doc._shots.pop(i))
        doc._emit(SHOTS_REMOVED, (self.shot_id,))

    def undo(self, doc: Document) -> None:
        assert self._removed is not None
        i, shot = self._removed
        doc._shots.insert(min(i, len(doc._shots)), shot)
        doc._emit(SHOTS_ADDED, (self.shot_id,))


class MoveShot(Command):
    """Moves a shot to ``index`` (its position after the move).

    Raises:
        ValueError: ``index`` out of range (when done).
        UnknownIdError: unknown shot (when done).
    """

    label = "Move shot"

    def __init__(self, shot_id: str, index: int) -> None:
        _check_id(shot_id, "shot_id")
        _check_nonneg_int(index, "index")
        self.shot_id, self.index = shot_id, index
        self._old = 0

    def _move(self, doc: Document, to: int) -> None:
        i = doc.shot_index(self.shot_id)
        if to >= len(doc._shots):
            raise ValueError(f"index: expected 0..{len(doc._shots) - 1}, got {to}")
        doc._shots.insert(to, doc._shots.pop(i))
        doc._emit(SHOTS_MOVED, (self.shot_id,))

    def do(self, doc: Document) -> None:
        old = doc.shot_index(self.shot_id)
        self._move(doc, self.index)
        self._old = old

    def undo(self, doc: Document) -> None:
        self._move(doc, self._old)


class TrimShot(Command):
    """Sets a shot's in/out frames; consecutive trims of the same shot merge (a drag).

    Raises:
        ValueError: bad frames (names ``in_frame``/``out_frame``), at construction.
    """

    label = "Trim shot"

    def __init__(self, shot_id: str, in_frame: int, out_frame: int | None) -> None:
        _check_id(shot_id, "shot_id")
        _check_trim(in_frame, out_frame)
        self.shot_id = shot_id
        self.trim = (in_frame, out_frame)
        self._old = (0, None)

    @property
    def merge_key(self) -> Hashable:  # type: ignore[override]
        return ("trim", self.shot_id)

    def do(self, doc: Document) -> None:
        s = doc.shot(self.shot_id)
        self._old = (s.in_frame, s.out_frame)
        doc._update_shot(self.shot_id, in_frame=self.trim[0], out_frame=self.trim[1])

    def undo(self, doc: Document) -> None:
        doc._update_shot(self.shot_id, in_frame=self._old[0], out_frame=self._old[1])

    def merge(self, other: Command) -> bool:
        assert isinstance(other, TrimShot)
        self.trim = other.trim
        return True


class SetShotDuration(_SetField):
    """Sets an image shot's length in seconds (None: the default); merges like a drag."""

    label = "Set shot duration"
    _field = "duration_s"
    _shot = True

    def __init__(self, shot_id: str, duration_s: float | None) -> None:
        _check_id(shot_id, "shot_id")
        _check_duration(duration_s)
        super().__init__(shot_id, duration_s)

    @property
    def merge_key(self) -> Hashable:  # type: ignore[override]
        return ("duration", self.target_id)
