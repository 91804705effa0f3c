"""The document the user authors: a variant tree, a timeline of shots and the job queue.

Pure Python: no Qt, no torch, no sqlite. Three kinds of change reach a :class:`Document`:

* **Edits by the user** go through :class:`~studio.core.history.Command` objects pushed on
  the document's :class:`~studio.core.history.UndoStack` (``doc.history``), the commands of
  :mod:`studio.core.commands`: :class:`AddVariant`, :class:`DeleteVariant`,
  :class:`RenameVariant`, :class:`StarVariant`, :class:`AddShot`, :class:`RemoveShot`,
  :class:`MoveShot`, :class:`TrimShot`, :class:`SetShotDuration`. Each can be undone and redone;
  consecutive commands with the same ``merge_key`` merge into one undo step (typing a name,
  dragging a trim handle), and ``begin_group``/``end_group`` make a multi-command gesture one
  step.
* **Results from the engine** (status changes, artifacts) are plain methods
  (:meth:`Document.set_status`, :meth:`Document.finish`, :meth:`Document.fail`,
  :meth:`Document.retry`): they are facts, not undo steps.
* **Queue order** (:meth:`Document.move_job`) is execution state, also not an undo step.

Observers subscribe with :meth:`Document.subscribe`; each top-level operation (one push, undo,
redo or result call, or an explicit :meth:`Document.batch`) delivers its :class:`ChangeEvent`
list in one call, after the change. The project store applies one such list in one SQLite
transaction, so an undo step is all on disk or not at all.

Queue invariant: ``queue()`` holds exactly the variants whose status is ``queued`` or
``running``, in run order. Restoring a variant through undo (undo of a delete, redo of an add)
brings a ``queued``/``running`` snapshot back as ``queued`` at its old queue position: removing
a pending variant means its job is cancelled by the controller, so bringing it back means
running it again. Other statuses come back unchanged.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from studio.core.history import HISTORY_CHANGED, Command, UndoStack

log = logging.getLogger(__name__)

ARTIFACT_KINDS = ("image", "video")
DEFAULT_IMAGE_DURATION_S = 2.0
"""Length of an image shot whose ``duration_s`` is None, in seconds."""

_HEX_ID = re.compile(r"[0-9a-f]{32}")


class Status(StrEnum):
    """Execution status of a variant."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"


PENDING = frozenset({Status.QUEUED, Status.RUNNING})
RETRYABLE = frozenset({Status.FAILED, Status.CANCELLED, Status.INTERRUPTED})
_TRANSITIONS: dict[Status, frozenset[Status]] = {
    Status.QUEUED: frozenset({Status.RUNNING, Status.DONE, Status.FAILED, Status.CANCELLED}),
    Status.RUNNING: frozenset({Status.DONE, Status.FAILED, Status.CANCELLED, Status.INTERRUPTED}),
    Status.DONE: frozenset(),
    Status.FAILED: frozenset({Status.QUEUED}),
    Status.CANCELLED: frozenset({Status.QUEUED}),
    Status.INTERRUPTED: frozenset({Status.QUEUED}),
}

# Change event kinds (ChangeEvent.kind). ids are variant ids or shot ids; empty otherwise.
VARIANTS_ADDED = "variants_added"  # parents before children
VARIANTS_REMOVED = "variants_removed"  # children before parents
VARIANTS_CHANGED = "variants_changed"
SHOTS_ADDED = "shots_added"
SHOTS_REMOVED = "shots_removed"
SHOTS_CHANGED = "shots_changed"
SHOTS_MOVED = "shots_moved"
QUEUE_CHANGED = "queue_changed"


class UnknownIdError(KeyError, ValueError):
    """An id names no variant or shot of the document (a KeyError and a ValueError)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def new_id() -> str:
    """A fresh id: uuid4 as 32 lowercase hex digits."""
    return uuid.uuid4().hex


def _check_id(value: Any, name: str) -> None:
    if not isinstance(value, str) or not _HEX_ID.fullmatch(value):
        raise ValueError(f"{name}: expected 32 lowercase hex digits, got {value!r}")


def _check_nonneg_int(value: Any, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name}: expected an integer >= 0, got {value!r}")


def _parse_json_object(text: Any, name: str) -> dict[str, Any]:
    if not isinstance(text, str):
        raise ValueError(f"{name}: expected JSON text, got {type(text).__name__}")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{name}: not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{name}: expected a JSON object")
    return value


def json_strings(text: str) -> set[str]:
    """Every string value (not key) anywhere in a JSON text: how media ids are found in requests.

    Raises:
        ValueError: ``text`` is not valid JSON.
    """
    try:
        root = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"request_json: not valid JSON ({exc})") from None
    out: set[str] = set()
    stack = [root]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            out.add(value)
        elif isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return out


# ---------------------------------------------------------------------------------------------
# Values


@dataclass(frozen=True, slots=True)
class Artifact:
    """One result file of a variant: a media content id and its kind ("image" or "video").

    Raises:
        ValueError: empty ``media_id`` or unknown ``kind``.
    """

    media_id: str
    kind: str

    def __post_init__(self) -> None:
        if not isinstance(self.media_id, str) or not self.media_id:
            raise ValueError(f"media_id: expected a non-empty content id, got {self.media_id!r}")
        if self.kind not in ARTIFACT_KINDS:
            raise ValueError(f"kind: expected one of {ARTIFACT_KINDS}, got {self.kind!r}")


@dataclass(frozen=True, slots=True)
class Variant:
    """A node of the variant tree: one generation request and what became of it.

    Attributes:
        id: uuid4 hex (32 digits).
        parent_id: the variant this one was derived from, or None for a root.
        request_json: canonical JSON of the generation request (a JSON object; opaque here).
        request_id: content id of the request (opaque here).
        status: a :class:`Status` (strings are converted).
        name, starred: user labels.
        error: a message a person can read, for failed/cancelled/interrupted variants.
        artifacts: result media, in order.
        created_at: creation time, seconds since the Unix epoch; siblings sort by it.

    Raises:
        ValueError: a field has a bad value; the message names the field.
    """

    id: str
    parent_id: str | None
    request_json: str
    request_id: str
    status: Status = Status.QUEUED
    name: str = ""
    starred: bool = False
    error: str | None = None
    artifacts: tuple[Artifact, ...] = ()
    created_at: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        _check_id(self.id, "id")
        if self.parent_id is not None:
            _check_id(self.parent_id, "parent_id")
            if self.parent_id == self.id:
                raise ValueError("parent_id: a variant cannot be its own parent")
        _parse_json_object(self.request_json, "request_json")
        if not isinstance(self.request_id, str) or not self.request_id:
            raise ValueError(f"request_id: expected a non-empty string, got {self.request_id!r}")
        try:
            object.__setattr__(self, "status", Status(self.status))
        except ValueError:
            raise ValueError(f"status: unknown status {self.status!r}") from None
        if not isinstance(self.name, str):
            raise ValueError(f"name: expected a string, got {type(self.name).__name__}")
        if not isinstance(self.starred, bool):
            raise ValueError(f"starred: expected a bool, got {self.starred!r}")
        if self.error is not None and not isinstance(self.error, str):
            raise ValueError(f"error: expected a string or None, got {self.error!r}")
        artifacts = tuple(self.artifacts)
        if not all(isinstance(a, Artifact) for a in artifacts):
            raise ValueError("artifacts: expected Artifact values")
        object.__setattr__(self, "artifacts", artifacts)
        if (
            isinstance(self.created_at, bool)
            or not isinstance(self.created_at, int | float)
            or not math.isfinite(self.created_at)
        ):
            raise ValueError(f"created_at: expected finite seconds, got {self.created_at!r}")

    @property
    def request(self) -> dict[str, Any]:
        """The request JSON parsed (a new dict each call)."""
        return json.loads(self.request_json)


@dataclass(frozen=True, slots=True)
class Shot:
    """A timeline entry showing one variant.

    Attributes:
        id: uuid4 hex.
        variant_id: the variant shown.
        in_frame: first frame used (videos), >= 0.
        out_frame: frame after the last one used (exclusive), or None for "to the end".
        duration_s: on-screen length in seconds for image shots (> 0), or None for the
            natural length (:data:`DEFAULT_IMAGE_DURATION_S` for images, the trim for videos).

    Raises:
        ValueError: a field has a bad value; the message names the field.
    """

    id: str
    variant_id: str
    in_frame: int = 0
    out_frame: int | None = None
    duration_s: float | None = None

    def __post_init__(self) -> None:
        _check_id(self.id, "id")
        _check_id(self.variant_id, "variant_id")
        _check_trim(self.in_frame, self.out_frame)
        _check_duration(self.duration_s)


def _check_trim(in_frame: Any, out_frame: Any) -> None:
    _check_nonneg_int(in_frame, "in_frame")
    if out_frame is not None:
        _check_nonneg_int(out_frame, "out_frame")
        if out_frame <= in_frame:
            raise ValueError(f"out_frame: must be > in_frame ({in_frame}), got {out_frame}")


def _check_duration(duration_s: Any) -> None:
    if duration_s is None:
        return
    if (
        isinstance(duration_s, bool)
        or not isinstance(duration_s, int | float)
        or not math.isfinite(duration_s)
        or duration_s <= 0
    ):
        raise ValueError(f"duration_s: expected seconds > 0 or None, got {duration_s!r}")


@dataclass(frozen=True, slots=True)
class ChangeEvent:
    """What changed: ``kind`` (one of the ``*_ADDED``/``*_CHANGED``/... constants) and ids."""

    kind: str
    ids: tuple[str, ...] = ()


Listener = Callable[[Sequence[ChangeEvent]], None]


def diff_requests(parent_json: str, child_json: str) -> list[tuple[str, Any, Any]]:
    """What changed from a parent's request to a child's: ``[(field, old, new), ...]``.

    Nested objects are compared field by field with dotted names ("optimization.profile");
    lists are compared whole. A field missing on one side reads as None there. Values of
    different JSON types differ even when Python calls them equal (1 vs 1.0 vs true). Sorted
    by field name.

    Raises:
        ValueError: either text is not a JSON object (the message names ``parent_json`` or
            ``child_json``).
    """
    old = _flatten(_parse_json_object(parent_json, "parent_json"))
    new = _flatten(_parse_json_object(child_json, "child_json"))
    out = []
    for key in sorted(old.keys() | new.keys()):
        a, b = old.get(key), new.get(key)
        if type(a) is not type(b) or a != b:
            out.append((key, a, b))
    return out


def _flatten(obj: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


# ---------------------------------------------------------------------------------------------
# The document


@dataclass(frozen=True)
class _Removed:
    """A removed subtree with everything needed to put it back where it was."""

    variants: tuple[Variant, ...]  # pre-order: parents first
    shots: tuple[tuple[int, Shot], ...]  # (timeline index, shot), ascending index
    queue: tuple[tuple[int, str], ...]  # (queue index, variant id), ascending index

    def media(self) -> set[str]:
        out: set[str] = set()
        for v in self.variants:
            out.update(a.media_id for a in v.artifacts)
            out.update(json_strings(v.request_json))
        return out


class Document:
    """The variant tree, the timeline and the job queue, with its undo history.

    Read with the query methods; change through ``doc.history.push(command)`` (undoable) or
    the result methods (not undoable). Not thread-safe: use it from one thread.
    """

    def __init__(self) -> None:
        self._variants: dict[str, Variant] = {}
        self._children: dict[str | None, list[str]] = {None: []}
        self._shots: list[Shot] = []
        self._queue: list[str] = []
        self._listeners: list[Listener] = []
        self._pending: list[ChangeEvent] = []
        self._depth = 0
        self.history = UndoStack(self)

    @classmethod
    def restore(
        cls, variants: Iterable[Variant], shots: Iterable[Shot] = (), queue: Iterable[str] = ()
    ) -> Document:
        """A document holding saved state, with empty history and no events sent.

        The queue is repaired to the invariant: ids that are unknown or not pending are
        dropped (logged), pending variants missing from it are appended by creation time.

        Raises:
            ValueError: duplicate ids, a parent that is missing or a cycle (``parent_id``), or
                a shot naming an unknown variant (``variant_id``).
        """
        doc = cls()
        waiting: dict[str, Variant] = {}
        for v in variants:
            if v.id in waiting:
                raise ValueError(f"id: duplicate variant id {v.id}")
            waiting[v.id] = v
        while waiting:
            ready = [v for v in waiting.values() if v.parent_id is None or v.parent_id in doc]
            if not ready:
                bad = next(iter(waiting.values()))
                raise ValueError(f"parent_id: variant {bad.id} has a missing parent or a cycle")
            for v in ready:
                doc._insert(v)
                del waiting[v.id]
        for shot in shots:
            if shot.variant_id not in doc:
                raise ValueError(f"variant_id: shot {shot.id} names unknown variant")
            if any(s.id == shot.id for s in doc._shots):
                raise ValueError(f"id: duplicate shot id {shot.id}")
            doc._shots.append(shot)
        seen: set[str] = set()
        for vid in queue:
            if vid in doc and doc._variants[vid].status in PENDING and vid not in seen:
                doc._queue.append(vid)
                seen.add(vid)
            else:
                log.warning("restore: dropped queue entry %s (unknown or not pending)", vid)
        missing = [v for v in doc._variants.values() if v.status in PENDING and v.id not in seen]
        for v in sorted(missing, key=lambda v: (v.created_at, v.id)):
            log.warning("restore: pending variant %s was not queued; appended", v.id)
            doc._queue.append(v.id)
        return doc

    # -- queries ----------------------------------------------------------------------------
    def __contains__(self, variant_id: object) -> bool:
        return variant_id in self._variants

    def __len__(self) -> int:
        return len(self._variants)

    def variant(self, variant_id: str) -> Variant:
        """The variant with this id. Raises UnknownIdError (a KeyError) when there is none."""
        try:
            return self._variants[variant_id]
        except KeyError:
            raise UnknownIdError(f"variant_id: no variant {variant_id!r}") from None

    def has_variant(self, variant_id: str) -> bool:
        """Whether the tree holds this variant."""
        return variant_id in self._variants

    def roots(self) -> tuple[str, ...]:
        """Ids of the root variants, oldest first."""
        return tuple(self._children[None])

    def children(self, variant_id: str | None) -> tuple[str, ...]:
        """Ids of the children of a variant (None: the roots), oldest first."""
        if variant_id is not None:
            self.variant(variant_id)
        return tuple(self._children[variant_id])

    def subtree(self, variant_id: str) -> list[str]:
        """The variant and its descendants, parents before children (pre-order)."""
        self.variant(variant_id)
        out, stack = [], [variant_id]
        while stack:
            vid = stack.pop()
            out.append(vid)
            stack.extend(reversed(self._children[vid]))
        return out

    def variants(self) -> list[Variant]:
        """Every variant, depth-first, parents before children, siblings oldest first."""
        return [self._variants[v] for r in self._children[None] for v in self.subtree(r)]

    def request_diff(self, variant_id: str) -> list[tuple[str, Any, Any]]:
        """:func:`diff_requests` of a variant against its parent; [] for a root."""
        v = self.variant(variant_id)
        if v.parent_id is None:
            return []
        return diff_requests(self._variants[v.parent_id].request_json, v.request_json)

    def shots(self) -> tuple[Shot, ...]:
        """The timeline, in order."""
        return tuple(self._shots)

    def shot(self, shot_id: str) -> Shot:
        """The shot with this id. Raises UnknownIdError when there is none."""
        return self._shots[self.shot_index(shot_id)]

    def shot_index(self, shot_id: str) -> int:
        """Position of a shot on the timeline. Raises UnknownIdError when there is none."""
        for i, s in enumerate(self._shots):
            if s.id == shot_id:
                return i
        raise UnknownIdError(f"shot_id: no shot {shot_id!r}")

    def queue(self) -> tuple[str, ...]:
        """Variant ids of pending jobs (queued or running), in run order."""
        return tuple(self._queue)

    def media_in_use(self) -> set[str]:
        """Media ids referenced by live variants: artifacts and every string in requests."""
        out: set[str] = set()
        for v in self._variants.values():
            out.update(a.media_id for a in v.artifacts)
            out.update(json_strings(v.request_json))
        return out

    # -- observers --------------------------------------------------------------------------
    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Calls ``listener(events)`` after each top-level change; returns an unsubscribe."""
        self._listeners.append(listener)
        return lambda: self.unsubscribe(listener)

    def unsubscribe(self, listener: Listener) -> None:
        """Stops notifying ``listener`` (no error if it was not subscribed)."""
        if listener in self._listeners:
            self._listeners.remove(listener)

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Delivers the events of everything inside as one notification (nestable)."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0 and self._pending:
                self._flush()

    def _emit(self, kind: str, ids: Iterable[str] = ()) -> None:
        self._pending.append(ChangeEvent(kind, tuple(ids)))
        if self._depth == 0:
            self._flush()

    def _flush(self) -> None:
        events, self._pending = tuple(self._pending), []
        error: BaseException | None = None
        for listener in list(self._listeners):
            try:
                listener(events)
            except Exception as exc:  # every listener hears every change
                log.exception("document listener %r failed", listener)
                error = error or exc
        if error is not None:
            raise error

    # -- results from the engine (not undoable) ---------------------------------------------
    def set_status(
        self, variant_id: str, status: Status | str, *, error: str | None = None
    ) -> None:
        """Moves a variant to a new status; the same status again is a no-op.

        Allowed: queued -> running/done/failed/cancelled; running -> done/failed/cancelled/
        interrupted; failed/cancelled/interrupted -> queued (see :meth:`retry`). Leaving the
        pending states removes the variant from the queue. ``error`` is kept for failed,
        cancelled and interrupted, cleared otherwise.

        Raises:
            UnknownIdError: no such variant.
            ValueError: unknown status or a transition not allowed (names ``status``).
        """
        v = self.variant(variant_id)
        try:
            new = Status(status)
        except ValueError:
            raise ValueError(f"status: unknown status {status!r}") from None
        if new == v.status:
            return
        if new not in _TRANSITIONS[v.status]:
            raise ValueError(f"status: {variant_id} cannot go from {v.status} to {new}")
        keep_error = new in RETRYABLE
        changes: dict[str, Any] = {"status": new, "error": error if keep_error else None}
        if new == Status.QUEUED:
            changes["artifacts"] = ()
        with self.batch():
            self._variants[variant_id] = replace(v, **changes)
            self._emit(VARIANTS_CHANGED, (variant_id,))
            if new == Status.QUEUED:
                self._queue.append(variant_id)
                self._emit(QUEUE_CHANGED)
            elif new not in PENDING and variant_id in self._queue:
                self._queue.remove(variant_id)
                self._emit(QUEUE_CHANGED)

    def finish(self, variant_id: str, artifacts: Iterable[Artifact]) -> None:
        """Records a finished generation: its artifacts, and status ``done``, in one change.

        Raises:
            UnknownIdError: no such variant.
            ValueError: bad artifacts, or the variant is not pending (names ``status``).
            whatever a listener raises (e.g. the project's save): the variant is then left
                as it was, pending.
        """
        arts = tuple(artifacts)
        if not all(isinstance(a, Artifact) for a in arts):
            raise ValueError("artifacts: expected Artifact values")
        v = self.variant(variant_id)
        if v.status not in PENDING:
            raise ValueError(f"status: {variant_id} is {v.status}, cannot finish")
        queue = list(self._queue)
        try:
            with self.batch():
                self._variants[variant_id] = replace(v, artifacts=arts)
                self.set_status(variant_id, Status.DONE)
        except Exception:
            # a listener failed (the project could not save it, e.g. the disk is full, and
            # the media rows of ``arts`` were rolled back with it): the result is not
            # recorded, the variant stays pending, and listeners hear the change back
            self._variants[variant_id], self._queue = v, queue
            try:
                self._emit(VARIANTS_CHANGED, (variant_id,))
                self._emit(QUEUE_CHANGED)
            except Exception:
                log.exception("document listener failed again on %s", variant_id)
            raise

    def fail(self, variant_id: str, message: str) -> None:
        """Marks a pending variant failed with a message a person can read."""
        self.set_status(variant_id, Status.FAILED, error=message)

    def retry(self, variant_id: str) -> None:
        """Queues a failed, cancelled or interrupted variant again, at the end of the queue."""
        self.set_status(variant_id, Status.QUEUED)

    def move_job(self, variant_id: str, index: int) -> None:
        """Moves a pending job to ``index`` in the queue (0 = next to run).

        Raises:
            UnknownIdError: the variant is not in the queue.
            ValueError: ``index`` out of range.
        """
        if variant_id not in self._queue:
            raise UnknownIdError(f"variant_id: {variant_id!r} is not in the queue")
        if (
            isinstance(index, bool)
            or not isinstance(index, int)
            or not 0 <= index < len(self._queue)
        ):
            raise ValueError(f"index: expected 0..{len(self._queue) - 1}, got {index!r}")
        if self._queue.index(variant_id) == index:
            return
        self._queue.remove(variant_id)
        self._queue.insert(index, variant_id)
        self._emit(QUEUE_CHANGED)

    # -- low-level mutations, used by commands (they emit, but do not batch) ----------------
    def _insert(self, v: Variant) -> None:
        if v.id in self._variants:
            raise ValueError(f"id: variant {v.id} already exists")
        if v.parent_id is not None and v.parent_id not in self._variants:
            raise UnknownIdError(f"parent_id: no variant {v.parent_id!r}")
        siblings = self._children[v.parent_id]
        key = (v.created_at, v.id)
        pos = len(siblings)
        while pos > 0 and (self._variants[siblings[pos - 1]].created_at, siblings[pos - 1]) > key:
            pos -= 1
        siblings.insert(pos, v.id)
        self._children[v.id] = []
        self._variants[v.id] = v

    def _remove_subtree(self, variant_id: str) -> _Removed:
        ids = self.subtree(variant_id)
        gone = set(ids)
        shots = tuple((i, s) for i, s in enumerate(self._shots) if s.variant_id in gone)
        queue = tuple((i, q) for i, q in enumerate(self._queue) if q in gone)
        removed = _Removed(tuple(self._variants[v] for v in ids), shots, queue)
        if shots:
            for i, _ in reversed(shots):
                del self._shots[i]
            self._emit(SHOTS_REMOVED, (s.id for _, s in shots))
        for vid in reversed(ids):
            v = self._variants.pop(vid)
            del self._children[vid]
            self._children[v.parent_id].remove(vid)
        self._emit(VARIANTS_REMOVED, reversed(ids))
        if queue:
            self._queue = [q for q in self._queue if q not in gone]
            self._emit(QUEUE_CHANGED)
        return removed

    def _restore_subtree(self, removed: _Removed) -> None:
        root = removed.variants[0]
        for v in removed.variants:
            if v.id in self._variants:
                raise ValueError(f"id: variant {v.id} already exists")
        if root.parent_id is not None and root.parent_id not in self._variants:
            raise UnknownIdError(f"parent_id: no variant {root.parent_id!r}")
        for v in removed.variants:
            if v.status in PENDING:
                v = replace(v, status=Status.QUEUED, error=None, artifacts=())
            self._insert(v)
        self._emit(VARIANTS_ADDED, (v.id for v in removed.variants))
        if removed.shots:
            for i, s in removed.shots:
                self._shots.insert(min(i, len(self._shots)), s)
            self._emit(SHOTS_ADDED, (s.id for _, s in removed.shots))
        before = list(self._queue)
        for i, vid in removed.queue:
            self._queue.insert(min(i, len(self._queue)), vid)
        for v in removed.variants:
            if v.status in PENDING and v.id not in self._queue:
                self._queue.append(v.id)
        if self._queue != before:
            self._emit(QUEUE_CHANGED)

    def _update_variant(self, variant_id: str, **changes: Any) -> None:
        self._variants[variant_id] = replace(self.variant(variant_id), **changes)
        self._emit(VARIANTS_CHANGED, (variant_id,))

    def _update_shot(self, shot_id: str, **changes: Any) -> None:
        i = self.shot_index(shot_id)
        self._shots[i] = replace(self._shots[i], **changes)
        self._emit(SHOTS_CHANGED, (shot_id,))


# ---------------------------------------------------------------------------------------------
# Re-exports: the commands live in studio.core.commands, which imports this module, so they are
# looked up on first use instead of imported here (either module may be imported first).

_COMMANDS = frozenset(
    {
        "AddShot",
        "AddVariant",
        "DeleteVariant",
        "MoveShot",
        "RemoveShot",
        "RenameVariant",
        "SetShotDuration",
        "StarVariant",
        "TrimShot",
    }
)
__all__ = [
    "ARTIFACT_KINDS",
    "DEFAULT_IMAGE_DURATION_S",
    "HISTORY_CHANGED",
    "PENDING",
    "QUEUE_CHANGED",
    "RETRYABLE",
    "SHOTS_ADDED",
    "SHOTS_CHANGED",
    "SHOTS_MOVED",
    "SHOTS_REMOVED",
    "VARIANTS_ADDED",
    "VARIANTS_CHANGED",
    "VARIANTS_REMOVED",
    "Artifact",
    "ChangeEvent",
    "Command",
    "Document",
    "Listener",
    "Shot",
    "Status",
    "UndoStack",
    "UnknownIdError",
    "Variant",
    "diff_requests",
    "json_strings",
    "new_id",
    *sorted(_COMMANDS),
]


def __getattr__(name: str) -> Any:
    """The command classes of :mod:`studio.core.commands`, re-exported lazily."""
    if name in _COMMANDS:
        from studio.core import commands

        return getattr(commands, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _COMMANDS)
