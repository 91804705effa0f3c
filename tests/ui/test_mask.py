"""The Mask tool: brush and eraser strokes on the init image, one undo step per gesture, and
Generate running masked image-to-image with the mask stored in the project."""

from __future__ import annotations

import numpy as np
from PIL import Image
from PySide6.QtCore import QEvent, QPointF, Qt
from PySide6.QtGui import QMouseEvent
from PySide6.QtWidgets import QApplication

from studio.core.document import Status
from studio.core.media import fit_image, pixels_content_id
from studio.store.project import Project
from tests.ui.conftest import fill_prompt, run, until


def mouse(view, kind: QEvent.Type, x: float, y: float, buttons=Qt.MouseButton.LeftButton):
    """Sends a mouse event at image pixel (x, y) of ``view``."""
    rect, s = view.image_rect(), view.scale()
    pos = QPointF(rect.left() + x * s, rect.top() + y * s)
    button = Qt.MouseButton.NoButton if kind == QEvent.Type.MouseMove else \
        Qt.MouseButton.LeftButton
    event = QMouseEvent(kind, pos, view.mapToGlobal(pos), button, buttons,
                        Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(view, event)


def stroke(view, points) -> None:
    """One gesture: press at the first point, drag through the others, release."""
    (x, y), rest = points[0], points[1:]
    mouse(view, QEvent.Type.MouseButtonPress, x, y)
    for x, y in rest:
        mouse(view, QEvent.Type.MouseMove, x, y)
    mouse(view, QEvent.Type.MouseButtonRelease, x, y, Qt.MouseButton.NoButton)


def test_mask_strokes_undo_and_masked_generation(tmp_path, loop, make_window):
    project = Project.create(tmp_path / "project")
    w = make_window(project)
    doc = project.document
    editor = w.canvas.mask_editor
    view = w.canvas.view
    assert not editor.is_available() and not editor.isVisibleTo(w.canvas)  # t2i: no mask

    # an 80x48 init image (cover-fitted to the 64x64 output by the engine)
    rng = np.random.default_rng(3)
    init = (rng.random((48, 80, 3)) * 255).astype(np.uint8)
    path = tmp_path / "init.png"
    Image.fromarray(init).save(path)
    w.import_input(path, "init.png", "init_image")
    run(loop, until(w.params.init_slot.refs, 20, "the init image"))
    assert w.params.mode() == "i2i" and editor.is_available() and editor.isVisibleTo(w.canvas)
    fill_prompt(w, "a red square on grass")
    w.params.set_size(64, 64)
    w.params.steps_spin.setValue(4)
    w.params.strength_spin.setValue(0.9)

    editor.mask_button.click()
    assert editor.is_active() and w.canvas.mode == "mask" and view.tool() is not None
    run(loop, until(editor.image, 20, "the init image on the canvas"))
    assert (view.image().width(), view.image().height()) == (80, 48)
    mask = editor.mask()
    assert mask.pixels.shape == (48, 80) and mask.is_empty()

    # a square, painted as one zigzag gesture with an 8 px brush: one undo step
    editor.set_brush_size(8)
    zigzag = []
    for i, y in enumerate((12, 18, 24, 30, 36)):
        xs = (28, 52) if i % 2 == 0 else (52, 28)
        zigzag += [(xs[0], y), (xs[1], y)]
    steps_before = len(doc.history)
    stroke(view, zigzag)
    square = mask.pixels.copy()
    assert square[12:36, 28:52].min() == 255 and square[:6].max() == 0 and \
        square[:, :22].max() == 0
    assert len(doc.history) == steps_before + 1 and w.undo_action.text() == "Undo Mask stroke"
    ref = w.params.mask_ref()
    assert ref is not None and ref.content_id == pixels_content_id(square)
    assert w.params.draft().mask == ref and view.overlay() is not None

    # a second stroke, then the eraser; undo takes back one gesture each
    stroke(view, [(4, 40), (10, 42)])
    assert mask.pixels[40, 5] == 255
    editor.set_erasing(True)
    stroke(view, [(40, 24)])
    assert mask.pixels[24, 40] == 0
    assert w.undo_action.text() == "Undo Erase mask"
    w.undo_action.trigger()
    assert mask.pixels[24, 40] == 255
    w.undo_action.trigger()
    np.testing.assert_array_equal(mask.pixels, square)
    assert w.params.mask_ref() == ref  # the draft follows undo
    w.redo_action.trigger()
    assert mask.pixels[40, 5] == 255
    w.undo_action.trigger()
    editor.set_erasing(False)

    # the overlay can be hidden; clear is one step too
    editor.overlay_box.setChecked(False)
    assert view.overlay() is None
    editor.overlay_box.setChecked(True)
    assert view.overlay() is not None
    editor.clear_button.click()
    assert mask.is_empty() and w.params.mask_ref() is None and w.params.draft().mask is None
    w.undo_action.trigger()
    np.testing.assert_array_equal(mask.pixels, square)

    # Generate: masked image-to-image; outside the mask the init image, inside new pixels
    [vid] = w.generate()
    request = doc.variant(vid).request
    assert request["mask"]["content_id"] == ref.content_id
    stored = project.media.find_by_pixels(ref.content_id)
    np.testing.assert_array_equal(project.media.get_image(stored), square)
    run(loop, until(lambda: doc.variant(vid).status in (Status.DONE, Status.FAILED), 90,
                    "the masked i2i"))
    assert doc.variant(vid).status == Status.DONE, doc.variant(vid).error
    out = project.media.get_image(doc.variant(vid).artifacts[0].media_id)
    fitted_init, fitted_mask = fit_image(init, 64, 64), fit_image(square, 64, 64)
    keep = fitted_mask < 128
    assert out.shape == (64, 64, 3) and keep.any() and (~keep).any()
    np.testing.assert_array_equal(out[keep], fitted_init[keep])
    diff = np.abs(out.astype(int) - fitted_init.astype(int))
    assert diff[~keep].mean() > 5

    # selecting the result leaves the mask tool; the mask is kept for the init image
    w.variants.select([vid])
    run(loop, until(lambda: w.canvas.variant_id == vid, 10, "the result on the canvas"))
    assert not editor.is_active() and view.tool() is None and view.overlay() is None
    np.testing.assert_array_equal(editor.mask().pixels, square)

    # branching from the result brings its mask back into the tool (one undo step)
    editor.clear()
    assert editor.mask().is_empty()
    w.branch_action.trigger()
    run(loop, until(lambda: not editor.mask().is_empty(), 10, "the branched mask"))
    np.testing.assert_array_equal(editor.mask().pixels, square)
    assert w.params.mask_ref() == ref

    # a result made without a mask from the same init image: its branch repaints everything,
    # though the tool still held the other request's mask for that image
    editor.clear()
    [plain] = w.generate()
    assert doc.variant(plain).request["mask"] is None
    run(loop, until(lambda: doc.variant(plain).status in (Status.DONE, Status.FAILED), 90,
                    "the unmasked i2i"))
    w.variants.select([vid])
    run(loop, until(lambda: w.canvas.variant_id == vid, 10, "the masked result"))
    w.branch_action.trigger()
    run(loop, until(lambda: not editor.mask().is_empty(), 10, "the branched mask"))
    w.variants.select([plain])
    run(loop, until(lambda: w.canvas.variant_id == plain, 10, "the unmasked result"))
    w.branch_action.trigger()
    assert editor.mask().is_empty() and w.params.draft().mask is None
    w.mask_link.store()  # what Generate does first: the old mask must not come back
    assert w.params.draft().mask is None and w.params.parent_id == plain

    # leaving image-to-image mode drops the mask from the draft
    w.params.set_mode("t2i")
    assert not editor.is_available() and w.params.draft().mask is None
