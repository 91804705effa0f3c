"""Keeping a flat Qt item model in step with a list of ids, with proper row signals.

A model over a list that changes underneath (the queue, the timeline) must announce each
change with ``beginRemoveRows``/``beginInsertRows`` *before* its storage changes, or views
and :class:`QAbstractItemModelTester` see inconsistent states. :func:`sync_rows` computes
the edit script from the old list to the new one (:class:`difflib.SequenceMatcher`) and
applies it step by step, from the end so earlier indices stay valid. A moved row is a removal
plus an insertion.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from difflib import SequenceMatcher

from PySide6.QtCore import QAbstractItemModel, QModelIndex


def sync_rows(
    model: QAbstractItemModel,
    old: Sequence[Hashable],
    new: Sequence[Hashable],
    store: Callable[[list], None],
    parent: QModelIndex | None = None,
) -> bool:
    """Turns the model's rows from ``old`` into ``new``.

    Args:
        model: the model (its begin/end row methods are called).
        old: the ids the model shows now.
        new: the ids it should show.
        store: sets the model's storage to the given list (called between begin and end).
        parent: the parent index of the rows (root by default).
    Returns:
        Whether anything changed.
    """
    parent = parent if parent is not None else QModelIndex()
    if list(old) == list(new):
        return False
    current = list(old)
    ops = SequenceMatcher(a=current, b=list(new), autojunk=False).get_opcodes()
    for tag, i1, i2, j1, j2 in reversed(ops):
        if tag in ("delete", "replace"):
            model.beginRemoveRows(parent, i1, i2 - 1)
            del current[i1:i2]
            store(list(current))
            model.endRemoveRows()
        if tag in ("insert", "replace"):
            model.beginInsertRows(parent, i1, i1 + (j2 - j1) - 1)
            current[i1:i1] = new[j1:j2]
            store(list(current))
            model.endInsertRows()
    return True
