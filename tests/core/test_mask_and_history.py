"""The inpainting mask's brush and undo steps; the bounded undo history and its release event."""

from __future__ import annotations

import numpy as np
import pytest

from studio.core.commands import DeleteVariant, RenameVariant
from studio.core.document import Document
from studio.core.history import HISTORY_CHANGED, HISTORY_RELEASED
from studio.core.mask import InpaintMask, MaskStroke, clear_edit


def test_brush_paints_a_capsule_and_eraser_undoes_nothing_else():
    mask = InpaintMask(20, 30)
    changes = []
    mask.subscribe(changes.append)
    assert mask.paint_segment(5, 10, 25, 10, radius=3) == (2, 7, 29, 14)
    ys, xs = np.nonzero(mask.pixels)
    assert ys.min() == 7 and ys.max() == 12 and xs.min() == 2 and xs.max() == 27
    assert mask.pixels[10, 5:25].min() == 255 and changes
    assert mask.paint_segment(-50, -50, -40, -40, radius=2) is None  # off the mask
    mask.paint_segment(15, 10, 15, 10, radius=1.5, value=0)  # an eraser dab
    assert mask.pixels[10, 15] == 0 and mask.pixels[10, 20] == 255
    assert 0 < mask.coverage() < 0.5
    with pytest.raises(ValueError):
        InpaintMask(0, 3)


def test_a_gesture_is_one_undo_step():
    doc = Document()
    mask = InpaintMask(16, 16)
    stroke = MaskStroke(mask, radius=2)
    stroke.begin(3, 3)
    for x in range(4, 13):
        stroke.extend(x, 3 + x // 3)
    painted = mask.pixels.copy()
    edit = stroke.finish()
    assert edit is not None and edit.label == "Mask stroke"
    doc.history.push(edit)
    np.testing.assert_array_equal(mask.pixels, painted)
    eraser = MaskStroke(mask, radius=1.5, erase=True)
    eraser.begin(8, 5)
    doc.history.push(eraser.finish())
    assert doc.history.undo_label == "Erase mask" and not np.array_equal(mask.pixels, painted)
    doc.history.undo()
    np.testing.assert_array_equal(mask.pixels, painted)
    doc.history.undo()
    assert mask.is_empty() and len(doc.history) == 2
    doc.history.redo()
    np.testing.assert_array_equal(mask.pixels, painted)
    doc.history.push(clear_edit(mask))
    assert mask.is_empty() and clear_edit(mask) is None
    doc.history.undo()
    np.testing.assert_array_equal(mask.pixels, painted)
    assert MaskStroke(mask, 2).finish() is None  # no dab, no step


def add_variants(doc: Document, n: int) -> list[str]:
    from studio.core.commands import AddVariant

    ids = []
    for i in range(n):
        cmd = AddVariant(f'{{"prompt": "{i}"}}', f"r{i}")
        doc.history.push(cmd)
        ids.append(cmd.variant_id)
    return ids


def test_history_is_bounded_and_says_when_it_lets_go():
    doc = Document()
    events: list[set[str]] = []
    doc.subscribe(lambda evs: events.append({e.kind for e in evs}))
    assert doc.history.limit == 200
    doc.history.limit = 3
    [a, b] = add_variants(doc, 2)
    doc.history.push(DeleteVariant(a))
    assert not any(HISTORY_RELEASED in e for e in events)
    events.clear()
    doc.history.push(RenameVariant(b, "x"))  # the fourth step: the first is forgotten
    assert len(doc.history) == 3 and doc.history.index == 3
    assert {HISTORY_RELEASED, HISTORY_CHANGED} <= events[-1]
    assert doc.history.undo() and doc.history.undo() and doc.history.undo()
    # the add of a was forgotten: undoing everything left keeps a, and b goes
    assert not doc.history.undo() and doc.has_variant(a) and not doc.has_variant(b)
    # a push after undo drops the redo tail: released too
    events.clear()
    doc.history.push(RenameVariant(a, "y"))
    assert HISTORY_RELEASED in set().union(*events)
    events.clear()
    doc.history.clear()
    assert HISTORY_RELEASED in events[-1] and len(doc.history) == 0
    events.clear()
    doc.history.clear()  # nothing left to let go of
    assert HISTORY_RELEASED not in events[-1]
