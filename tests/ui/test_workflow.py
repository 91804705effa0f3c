"""The studio end to end: generate an image and a video, branch, compare, build a timeline,
export it, close, reopen — on the real engine (embedded model) and a real project."""

from __future__ import annotations

import json

import av
import numpy as np
import pytest
from PySide6.QtCore import QPointF, Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtTest import QAbstractItemModelTester

from studio.core.commands import RenameVariant
from studio.core.document import Status
from studio.store.export import read_frames, read_metadata
from studio.store.project import Project
from tests.ui.conftest import (
    fast_image_settings,
    fill_prompt,
    run,
    slow_video_settings,
    until,
    wait_hash,
)


def _testers(window) -> list[QAbstractItemModelTester]:
    mode = QAbstractItemModelTester.FailureReportingMode.Warning
    return [QAbstractItemModelTester(m, mode, window)
            for m in (window.variant_model, window.queue_model, window.timeline_model)]


def test_generate_branch_compare_timeline_export_and_reopen(tmp_path, loop, make_window,
                                                             model_failures, qtbot):
    folder = tmp_path / "project"
    project = Project.create(folder)
    w = make_window(project)
    testers = _testers(w)
    doc = project.document
    wait_hash(loop, w)
    previews: list[str] = []
    w.controller.previewReady.connect(previews.append)

    # -- text to image: pending at once, previews, then the result in the store ------------
    fill_prompt(w, "a red circle on grass", seed=7)
    [image] = w.generate()
    assert doc.variant(image).status == Status.QUEUED
    assert w.variant_model.index_for(image).isValid()
    assert w.variants.current() == image and w.canvas.variant_id == image
    assert w.queue_model.row_of(image) == 0
    run(loop, until(lambda: doc.variant(image).status == Status.DONE, 90, "t2i done"))
    assert previews.count(image) == 20
    art = doc.variant(image).artifacts[0]
    assert art.kind == "image"
    assert project.media.get_image(art.media_id).shape == (64, 64, 3)
    run(loop, until(lambda: w.canvas.frames is not None, 10, "canvas frames"))
    view = w.canvas.view
    assert view.image().size().toTuple() == (64, 64)
    fit = view.scale()
    view.zoom_by(2.0, QPointF(20, 20))  # what the wheel does, around the cursor
    assert view.scale() == pytest.approx(2 * fit)
    view.pan_by(15, -5)
    w.actual_size_action.trigger()
    assert view.scale() == 1.0
    w.fit_action.trigger()
    assert view.scale() == pytest.approx(fit) and view.view_state() == (None, (0.5, 0.5))
    assert "model_hash" not in str(doc.request_diff(image))
    assert doc.variant(image).request["model_hash"]

    # -- text to video: plays, steps, scrubs ------------------------------------------------
    assert w.params.set_mode("t2v")
    w.params.frames_spin.setValue(9)
    [video] = w.generate()
    run(loop, until(lambda: doc.variant(video).status == Status.DONE, 90, "t2v done"))
    frames = project.media.get_video(doc.variant(video).artifacts[0].media_id)
    assert frames.shape == (9, 64, 64, 3)
    run(loop, until(lambda: w.canvas.frames is not None, 10, "video frames"))
    assert w.canvas.player.frame_count == 9
    w.canvas.view.setFocus()
    qtbot.keyClick(w.canvas.view, Qt.Key.Key_Right)
    assert w.canvas.player.position == 1
    np.testing.assert_array_equal(w.canvas.current_frame(), frames[1])
    w.canvas.controls.slider.setValue(5)
    assert w.canvas.player.position == 5
    qtbot.keyClick(w.canvas.view, Qt.Key.Key_Space)
    assert w.canvas.player.playing
    run(loop, until(lambda: w.canvas.player.position != 5, 5, "playback"))
    qtbot.keyClick(w.canvas.view, Qt.Key.Key_Space)
    assert not w.canvas.player.playing
    paused_at = w.canvas.player.position
    qtbot.keyClick(w.canvas.view, Qt.Key.Key_Left)
    assert w.canvas.player.position == (paused_at - 1) % 9 and not w.canvas.player.playing

    # -- branch from the image: settings prefilled, a child with a diff tooltip -------------
    w.variants.select([image])
    w.branch_action.trigger()
    assert w.params.mode() == "t2i" and w.params.seed() == 7 and w.params.parent_id == image
    w.params.prompt_edit.setPlainText("a blue circle on grass")
    [child] = w.generate()
    assert doc.variant(child).parent_id == image
    assert w.variant_model.parent(w.variant_model.index_for(child)) == \
        w.variant_model.index_for(image)
    tip = w.variant_model.index_for(child).data(Qt.ItemDataRole.ToolTipRole)
    assert "prompt: a red circle on grass → a blue circle on grass" in tip
    run(loop, until(lambda: doc.variant(child).status == Status.DONE, 90, "child done"))

    # -- compare the two images ---------------------------------------------------------------
    w.variants.select([image, child])
    assert w.compare_action.isEnabled()
    w.compare_action.trigger()
    assert w.tabs.currentWidget() is w.compare
    run(loop, until(w.compare.is_loaded, 10, "compare frames"))
    assert w.compare.differing_fields() == ["prompt"]
    w.compare.views[0].zoom_by(2.0)
    assert w.compare.views[1].view_state() == w.compare.views[0].view_state()
    assert w.compare.views[1].scale() == w.compare.views[0].scale()
    w.compare.set_mode("Wipe")
    assert w.compare.wipe_view.image() is not None
    w.compare.set_mode("Difference")
    assert w.compare.stats["max"] > 0 and w.compare.diff_view.image() is not None
    heat = w.compare._difference()  # made once per frame pair, then reused (playback loops)
    assert w.compare._difference() is heat and len(w.compare._heat) == 1
    assert heat[1] == w.compare.stats
    # it follows the document: a rename shows; a compared variant deleted ends a comparison
    # of two (it used to stay on screen, and a late frame load of it crashed)
    doc.history.push(RenameVariant(child, "blue one"))
    assert "blue one" in w.compare.title.text() and w.compare.labels[1].text() == "blue one"
    w.delete_variants([child])
    assert w.compare.variant_ids == [] and "deleted or undone" in w.compare.title.text()
    assert w.compare.diff_view.image() is None
    w.undo_action.trigger()
    assert doc.has_variant(child)

    # -- timeline: an image shot and a trimmed video shot, exported as one MP4 --------------
    w.variants.select([image, video])
    shots = w.add_selected_to_timeline()
    assert len(shots) == 2 and w.timeline_model.rowCount() == 2
    w.timeline.select(shots[1])
    w.timeline.in_spin.setValue(1)
    w.timeline.out_spin.setValue(7)
    assert (doc.shot(shots[1]).in_frame, doc.shot(shots[1]).out_frame) == (1, 7)
    w.timeline.select(shots[0])
    w.timeline.duration_spin.setValue(1.5)
    assert doc.shot(shots[0]).duration_s == 1.5
    out = tmp_path / "storyboard.mp4"
    result = run(loop, w.timeline.export_mp4(out))
    assert result is not None and result.num_frames == 12 + 6  # 1.5 s at 8 fps + 6 frames
    with av.open(str(out)) as container:
        decoded = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(decoded) == 18 and decoded[0].shape == (64, 64, 3)

    # -- single exports carry the request ---------------------------------------------------
    png = run(loop, w.export_variant(image, tmp_path / "image.png"))
    meta = read_metadata(png)
    assert meta["request"]["prompt"] == "a red circle on grass"
    assert meta["request"]["model_hash"] and meta["environment"]["device"]
    gif = run(loop, w.export_variant(video, tmp_path / "video.gif"))
    assert read_metadata(gif)["request"]["num_frames"] == 9
    assert read_frames(gif).shape == (9, 64, 64, 3)
    sheet = run(loop, w.export_contact_sheet([image, child, video], tmp_path / "sheet.png"))
    assert sheet.exists()
    # exports to a bad place are said plainly: no OS error text, no temporary file names
    from studio.ui.exporting import ExportError

    (tmp_path / "afile").write_text("x")
    with pytest.raises(ExportError, match="afile is a file, not a folder"):
        run(loop, w.export_variant(image, tmp_path / "afile" / "x.png"))
    (tmp_path / "dir.png").mkdir()
    with pytest.raises(ExportError, match="is a folder; give a file name"):
        run(loop, w.export_contact_sheet([image], tmp_path / "dir.png"))
    assert run(loop, w.timeline.export_mp4(tmp_path / "dir.png")) is None
    assert "is a folder; give a file name" in w.last_message[0]
    # nor over a stored result of the project (it would change another variant's result)
    stored = project.media.root.joinpath(doc.variant(child).artifacts[0].media_id[:2])
    stored_file = next(stored.glob(doc.variant(child).artifacts[0].media_id + ".*"))
    before = stored_file.read_bytes()
    with pytest.raises(ExportError, match=r"^export file .*: is one of the project's own "
                                          r"files in .* choose a place outside .*media$"):
        run(loop, w.export_variant(image, stored_file))
    with pytest.raises(ExportError, match="is one of the project's own files"):
        run(loop, w.export_contact_sheet([image], project.folder / "project.sqlite"))
    assert stored_file.read_bytes() == before
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]
    w.variants.select([child])
    w.copy_settings_action.trigger()
    copied = json.loads(QGuiApplication.clipboard().text())
    assert copied == json.loads(doc.variant(child).request_json)
    [again] = w.reproduce()
    assert doc.variant(again).request_json == doc.variant(child).request_json
    assert doc.variant(again).parent_id == child
    run(loop, until(lambda: doc.variant(again).status == Status.DONE, 90, "reproduction"))
    np.testing.assert_array_equal(  # the CPU run is bit-exact
        project.media.get_image(doc.variant(again).artifacts[0].media_id),
        project.media.get_image(doc.variant(child).artifacts[0].media_id))
    w.rename(image, "hero")
    w.variants.select([child])
    w.star_action.trigger()
    w.addDockWidget(Qt.DockWidgetArea.LeftDockWidgetArea, w.docks["queueDock"])
    assert model_failures == []
    del testers

    # -- close and reopen: everything is there ----------------------------------------------
    w.close()
    run(loop, w.shutdown())
    project.close()
    project2 = Project.open(folder)
    doc2 = project2.document
    w2 = make_window(project2)
    assert {v.id: v.status for v in doc2.variants()} == {
        image: Status.DONE, child: Status.DONE, video: Status.DONE, again: Status.DONE}
    assert doc2.variant(image).name == "hero" and doc2.variant(child).starred
    assert doc2.variant(child).parent_id == image
    for v in doc2.variants():
        assert project2.media.verify(v.artifacts[0].media_id)
    assert [s.id for s in doc2.shots()] == shots
    assert (doc2.shot(shots[1]).in_frame, doc2.shot(shots[1]).out_frame) == (1, 7)
    assert w2.variant_model.rowCount() == 2  # two roots: the image (with its child), the video
    assert w2.variant_model.rowCount(w2.variant_model.index_for(image)) == 1
    assert w2.timeline_model.rowCount() == 2
    assert w2.dockWidgetArea(w2.docks["queueDock"]) == Qt.DockWidgetArea.LeftDockWidgetArea
    w2.close()
    run(loop, w2.shutdown())
    project2.close()


def test_closing_while_generating_then_reopening(tmp_path, loop, make_window):
    folder = tmp_path / "project"
    project = Project.create(folder)
    w = make_window(project)
    fill_prompt(w, "a long video")
    slow_video_settings(w)
    [slow] = w.generate()
    fast_image_settings(w)
    [fast] = w.generate()
    run(loop, until(lambda: w.controller.progress(slow), 90, "the slow job running"))
    w.close()
    run(loop, w.shutdown())
    project.close()

    project = Project.open(folder)
    doc = project.document
    assert doc.variant(slow).status == Status.INTERRUPTED and "Retry" in doc.variant(slow).error
    assert doc.variant(fast).status == Status.QUEUED and doc.queue() == (fast,)
    w = make_window(project)  # the queued variant is submitted again on open
    run(loop, until(lambda: doc.variant(fast).status == Status.DONE, 90, "the queued job"))
    w.queue.select(slow)
    assert w.queue.retry_button.isEnabled() and not w.queue.cancel_button.isEnabled()
    w.close()
    run(loop, w.shutdown())
    project.close()


def test_an_engine_crash_fails_the_job_and_the_studio_stays_up(tmp_path, loop, make_window):
    project = Project.create(tmp_path / "project")
    w = make_window(project, process=True)  # the studio's default: the engine in a child
    doc = project.document
    fill_prompt(w, "a long video")
    slow_video_settings(w)
    [slow] = w.generate()
    fast_image_settings(w)
    [fast] = w.generate()
    run(loop, until(lambda: w.controller.progress(slow), 180, "the child engine running"))
    worker = w.controller.engine.worker
    first_pid = worker.pid
    worker.kill()
    run(loop, until(lambda: doc.variant(slow).status == Status.FAILED, 60, "worker_died"))
    assert "stopped unexpectedly" in doc.variant(slow).error
    run(loop, until(lambda: doc.variant(fast).status == Status.DONE, 180, "the next job"))
    assert worker.pid != first_pid and w.isVisible()
    w.close()
    run(loop, w.shutdown())
    project.close()


def test_what_the_model_ignores_of_the_prompt_is_said_when_the_result_arrives(
        tmp_path, loop, make_window):
    project = Project.create(tmp_path / "project")
    w = make_window(project)
    notices: list[tuple[str, bool]] = []
    w.controller.notice.connect(lambda text, error: notices.append((text, error)))
    fill_prompt(w, "a rouge circle on grass", seed=3)
    fast_image_settings(w)
    [vid] = w.generate()
    doc = project.document
    run(loop, until(lambda: doc.variant(vid).status == Status.DONE, 90, "t2i done"))
    run(loop, until(lambda: notices, 10, "the note"))
    assert notices == [("Note: prompt: this model does not know \u201crouge\u201d; read as an "
                        "unknown word", False)]
    w.close()
    run(loop, w.shutdown())
    project.close()


def test_a_result_the_project_cannot_save_fails_and_nothing_is_poisoned(tmp_path, loop,
                                                                          make_window,
                                                                          monkeypatch):
    """The disk fills as a result arrives: the variant fails with the reason (the result is
    not shown as done with a medium the file lacks), the user is told, and later edits save."""
    import sqlite3

    project = Project.create(tmp_path / "project")
    w = make_window(project)
    doc = project.document
    real = project._save_variant

    def full_disk(variant_id: str) -> None:
        if doc.has_variant(variant_id) and doc.variant(variant_id).status == Status.DONE:
            raise sqlite3.OperationalError("database or disk is full")
        real(variant_id)

    monkeypatch.setattr(project, "_save_variant", full_disk)
    fill_prompt(w, "a red circle on grass")
    fast_image_settings(w)
    [vid] = w.generate()
    run(loop, until(lambda: doc.variant(vid).status == Status.FAILED, 90, "the failure"))
    v = doc.variant(vid)
    assert "could not be saved" in v.error and "disk is full" in v.error and v.artifacts == ()
    text, error = w.last_message
    assert error and "could not be saved" in text
    monkeypatch.undo()
    w.rename(vid, "kept")
    assert project.unsaved_changes == 0
    saved = project._load().variant(vid)
    assert (saved.status, saved.name, saved.artifacts) == (Status.FAILED, "kept", ())
    w.close()
    run(loop, w.shutdown())
    project.close()
