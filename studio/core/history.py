"""Undo history: the :class:`Command` protocol and the linear :class:`UndoStack`.

Pure Python. The stack works on any "document" that offers ``batch()`` (a context manager that
delivers the events of everything inside as one notification) and ``_emit(kind, ids=())``;
:class:`studio.core.document.Document` is the one in use. Concrete commands live in
:mod:`studio.core.commands`.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from studio.core.document import Document

HISTORY_CHANGED = "history_changed"
"""Change event kind sent when the undo history changes (push, undo, redo, clean, clear)."""

HISTORY_RELEASED = "history_released"
"""Change event kind sent when the history forgets steps (the redo tail dropped by a push, the
oldest steps past :attr:`UndoStack.limit`, or :meth:`UndoStack.clear`): media those steps held
(:meth:`UndoStack.held_media`) may now be unreferenced, so it is a cue to collect garbage."""

DEFAULT_UNDO_LIMIT = 200
"""Undo steps a document keeps by default; older ones are forgotten."""


class Command:
    """An undoable edit. Subclasses implement :meth:`do` and :meth:`undo`.

    ``do`` is called on push and on every redo, ``undo`` on every undo; both must check
    their input before changing anything. A command with a non-None ``merge_key`` absorbs the
    next pushed command of the same class and key through :meth:`merge`.
    """

    label = "Edit"
    merge_key: Hashable | None = None

    def do(self, doc: Document) -> None:
        raise NotImplementedError

    def undo(self, doc: Document) -> None:
        raise NotImplementedError

    def merge(self, other: Command) -> bool:
        """Takes ``other``'s end state (``other`` was already done); True when merged."""
        return False

    def held_media(self) -> set[str]:
        """Media ids this command keeps alive for a future undo or redo."""
        return set()


class _Group(Command):
    def __init__(self, label: str) -> None:
        self.label = label or "Edit"
        self.commands: list[Command] = []

    def do(self, doc: Document) -> None:
        for cmd in self.commands:
            cmd.do(doc)

    def undo(self, doc: Document) -> None:
        for cmd in reversed(self.commands):
            cmd.undo(doc)

    def held_media(self) -> set[str]:
        return set().union(*(c.held_media() for c in self.commands))


def _merges(top: Command, cmd: Command) -> bool:
    return (
        top.merge_key is not None
        and type(top) is type(cmd)
        and top.merge_key == cmd.merge_key
        and top.merge(cmd)
    )


class UndoStack:
    """Linear undo history of a document (``doc.history``).

    Pushing after an undo drops the redo tail. A push merges into the top step when both have
    the same ``merge_key``, unless the history was sealed since (:meth:`seal`, any undo, redo
    or group end) or the top step is the clean state. Undo and redo of one step (a group
    included) reach listeners as one event list.

    The history is bounded: past ``limit`` steps the oldest are forgotten. Whenever steps are
    forgotten, :data:`HISTORY_RELEASED` is sent (with :data:`HISTORY_CHANGED`).

    Args:
        document: the document the commands edit.
        limit: the most undo steps kept (at least 1).
    """

    def __init__(self, document: Document, limit: int = DEFAULT_UNDO_LIMIT) -> None:
        if not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit: expected a whole number >= 1, got {limit!r}")
        self._doc = document
        self.limit = limit
        self._steps: list[Command] = []
        self._index = 0
        self._clean: int | None = 0
        self._open: list[_Group] = []
        self._sealed = False

    @property
    def can_undo(self) -> bool:
        return self._index > 0 and not self._open

    @property
    def can_redo(self) -> bool:
        return self._index < len(self._steps) and not self._open

    @property
    def undo_label(self) -> str:
        return self._steps[self._index - 1].label if self._index else ""

    @property
    def redo_label(self) -> str:
        return self._steps[self._index].label if self._index < len(self._steps) else ""

    @property
    def index(self) -> int:
        """Number of steps currently done."""
        return self._index

    def __len__(self) -> int:
        return len(self._steps)

    @property
    def is_clean(self) -> bool:
        """Whether the document is at the step marked by :meth:`set_clean`."""
        return not self._open and self._index == self._clean

    def set_clean(self) -> None:
        """Marks the current step as the clean state."""
        self._clean = self._index
        self._doc._emit(HISTORY_CHANGED)

    def seal(self) -> None:
        """Stops the next push from merging into the current top step (end of a drag)."""
        self._sealed = True

    def _truncate(self) -> None:
        if self._index < len(self._steps):
            del self._steps[self._index :]
            self._doc._emit(HISTORY_RELEASED)
        if self._clean is not None and self._clean > self._index:
            self._clean = None

    def _append(self, step: Command) -> None:
        """Records a new top step, forgetting the oldest ones past :attr:`limit`."""
        self._steps.append(step)
        self._index += 1
        excess = len(self._steps) - self.limit
        if excess > 0:
            del self._steps[:excess]
            self._index -= excess
            if self._clean is not None:
                self._clean = self._clean - excess if self._clean >= excess else None
            self._doc._emit(HISTORY_RELEASED)

    def push(self, command: Command) -> None:
        """Does ``command`` and records it as an undo step (or inside the open group).

        Raises:
            TypeError: not a Command.
            whatever ``command.do`` raises (then nothing is recorded).
        """
        if not isinstance(command, Command):
            raise TypeError(f"command: expected a Command, got {type(command).__name__}")
        with self._doc.batch():
            command.do(self._doc)
            if self._open:
                cmds = self._open[-1].commands
                if not (cmds and _merges(cmds[-1], command)):
                    cmds.append(command)
                return
            self._truncate()
            top = self._steps[-1] if self._steps else None
            mergeable = top is not None and not self._sealed and self._index != self._clean
            if not (mergeable and _merges(top, command)):
                self._append(command)
            self._sealed = False
            self._doc._emit(HISTORY_CHANGED)

    def undo(self) -> bool:
        """Undoes one step; False when there is none.

        Raises:
            RuntimeError: a group is open.
        """
        if self._open:
            raise RuntimeError("undo: a group is open; call end_group() first")
        if not self._index:
            return False
        with self._doc.batch():
            self._steps[self._index - 1].undo(self._doc)
            self._index -= 1
            self._sealed = True
            self._doc._emit(HISTORY_CHANGED)
        return True

    def redo(self) -> bool:
        """Redoes one step; False when there is none.

        Raises:
            RuntimeError: a group is open.
        """
        if self._open:
            raise RuntimeError("redo: a group is open; call end_group() first")
        if self._index >= len(self._steps):
            return False
        with self._doc.batch():
            self._steps[self._index].do(self._doc)
            self._index += 1
            self._sealed = True
            self._doc._emit(HISTORY_CHANGED)
        return True

    def begin_group(self, label: str = "") -> None:
        """Starts a gesture: commands pushed until the matching :meth:`end_group` are one step.

        Groups nest; commands run as they are pushed (and are saved as they run).
        """
        if not self._open:
            self._truncate()
        self._open.append(_Group(label))

    def end_group(self) -> None:
        """Closes the innermost group; an empty group leaves no step.

        Raises:
            RuntimeError: no group is open.
        """
        if not self._open:
            raise RuntimeError("end_group: no group is open")
        group = self._open.pop()
        if not group.commands:
            return
        if self._open:
            self._open[-1].commands.append(group)
            return
        with self._doc.batch():
            self._append(group)
            self._sealed = True
            self._doc._emit(HISTORY_CHANGED)

    @contextmanager
    def group(self, label: str = "") -> Iterator[None]:
        """``with history.group("Drag"):`` begin/end_group around a block (ended on error too).

        The block's changes reach the document's listeners as one notification
        (:meth:`Document.batch`), so a project saves the whole step in one transaction: a
        crash keeps all of it or none."""
        with self._doc.batch():
            self.begin_group(label)
            try:
                yield
            finally:
                self.end_group()

    def clear(self) -> None:
        """Forgets every step (the document is unchanged); the current state becomes clean.

        Raises:
            RuntimeError: a group is open.
        """
        if self._open:
            raise RuntimeError("clear: a group is open")
        had_steps = bool(self._steps)
        self._steps, self._index, self._clean, self._sealed = [], 0, 0, False
        with self._doc.batch():
            if had_steps:
                self._doc._emit(HISTORY_RELEASED)
            self._doc._emit(HISTORY_CHANGED)

    def held_media(self) -> set[str]:
        """Media ids that some undo or redo step could bring back (keep them on disk)."""
        steps = self._steps + list(self._open)
        return set().union(*(c.held_media() for c in steps))
