"""Input images: drops, pastes and results used as inputs; damaged files change nothing."""

from __future__ import annotations

import numpy as np
from PIL import Image
from PySide6.QtCore import QMimeData, QPoint, QPointF, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent, QGuiApplication
from PySide6.QtWidgets import QApplication

from studio.core.document import Status
from studio.store.project import Project
from studio.ui.background import to_qimage
from tests.conftest import CASES
from tests.ui.conftest import fill_prompt, project_snapshot, run, until

TRUNCATED = CASES / "001-truncated-init-image" / "truncated.png"


def drop_files(widget, *paths) -> None:
    """Drags local files onto ``widget`` and drops them (drag enter, then drop)."""
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    args = (Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
            Qt.KeyboardModifier.NoModifier)
    enter = QDragEnterEvent(QPoint(10, 10), *args)
    assert QApplication.sendEvent(widget, enter) and enter.isAccepted()
    drop = QDropEvent(QPointF(10, 10), *args)
    assert QApplication.sendEvent(widget, drop) and drop.isAccepted()


def test_damaged_drop_shows_a_message_and_leaves_the_project_unchanged(
        tmp_path, loop, make_window):
    folder = tmp_path / "project"
    project = Project.create(folder)
    w = make_window(project)
    fill_prompt(w, "a red circle")
    [first] = w.generate()
    run(loop, until(lambda: project.document.variant(first).status == Status.DONE, 90))
    before = project_snapshot(folder)
    mode = w.params.mode()

    drop_files(w.canvas, TRUNCATED)
    banner = run(loop, until(w.canvas.banner_text, 20, "the error banner"))
    assert "truncated.png" in banner and "damaged or incomplete" in banner
    assert w.last_message[1] is True
    assert project_snapshot(folder) == before
    assert w.params.init_slot.refs() == () and w.params.mode() == mode

    # The studio keeps working: a good image dropped next becomes the init image.
    good = tmp_path / "good.png"
    pixels = np.zeros((48, 80, 3), np.uint8)
    pixels[:, :40] = (200, 30, 30)
    Image.fromarray(pixels).save(good)
    drop_files(w.canvas, good)
    run(loop, until(w.params.init_slot.refs, 20, "the init image"))
    assert w.params.mode() == "i2i"
    assert (w.params.width_spin.value(), w.params.height_spin.value()) == (80, 48)
    assert w.canvas.banner_text() == ""
    [i2i] = w.generate()
    run(loop, until(lambda: project.document.variant(i2i).status == Status.DONE, 90, "i2i"))
    request = project.document.variant(i2i).request
    assert request["init_image"]["source"] == "good.png"
    assert project.media.get_image(project.document.variant(i2i).artifacts[0].media_id).shape \
        == (48, 80, 3)


def test_paste_and_result_as_first_frame(tmp_path, loop, make_window):
    project = Project.create(tmp_path / "project")
    w = make_window(project)
    doc = project.document
    fill_prompt(w, "a blue square")
    [image] = w.generate()
    run(loop, until(lambda: doc.variant(image).status == Status.DONE, 90))

    # a node's output as the first frame of an image-to-video
    w.variants.select([image])
    w.use_first_action.trigger()
    run(loop, until(w.params.first_frame_slot.refs, 20, "the first frame"))
    assert w.params.mode() == "i2v"
    ref = w.params.first_frame_slot.refs()[0]
    assert ref.content_id == project.media.info(doc.variant(image).artifacts[0].media_id)[
        "pixels_id"]
    w.params.frames_spin.setValue(5)
    [video] = w.generate()
    run(loop, until(lambda: doc.variant(video).status == Status.DONE, 90, "i2v"))
    assert doc.variant(video).request["first_frame"]["content_id"] == ref.content_id

    # a pasted picture becomes the first frame (the mode's input)
    picture = np.full((64, 64, 3), 90, np.uint8)
    QGuiApplication.clipboard().setImage(to_qimage(picture))
    w.paste_action.trigger()
    run(loop, until(lambda: w.params.first_frame_slot.refs()
                    and w.params.first_frame_slot.refs()[0].source == "pasted image.png",
                    20, "the pasted image"))


def test_a_reference_past_the_models_limit_replaces_or_is_refused(tmp_path, make_window):
    """The embedded model takes one reference: a second one replaces it, and the note says
    so (before, both were kept, "… is the reference" was said, and Generate went grey with
    no reason on screen). A model taking several refuses one more, changing nothing."""
    from dataclasses import replace

    import pytest

    from studio.core.media import pixels_content_id
    from studio.core.request import MediaRef

    w = make_window(Project.create(tmp_path / "project"))
    params = w.params
    red, blue = np.zeros((32, 32, 3), np.uint8), np.full((32, 32, 3), 200, np.uint8)
    first = MediaRef(pixels_content_id(red), "red.png")
    second = MediaRef(pixels_content_id(blue), "blue.png")
    assert params.capabilities().max_references == 1
    assert params.set_input("references", first, red) == ""
    note = params.set_input("references", second, blue)
    assert "replaces the one before" in note and params.references_slot.refs() == (second,)
    assert params.mode() == "r2v"
    fill_prompt(w, "a small object slides to the left on grass")
    assert params.is_valid(), params.problems()
    several = replace(params.capabilities(), max_references=2)
    params.capabilities = lambda: several  # a model such as Wan VACE
    params.set_input("references", first, red)
    with pytest.raises(ValueError, match="takes at most 2; clear the references first"):
        params.set_input("references", MediaRef(pixels_content_id(red[:16]), "small.png"),
                         red[:16])
    assert params.references_slot.refs() == (second, first)
