"""Editing through the UI: undo/redo of rename, star and delete; validation in place;
keyboard generation; cancelling by undo and from the queue; failures keep the studio up."""

from __future__ import annotations

import re

import pytest
from PySide6.QtCore import Qt

from studio.core.document import Status
from studio.store.project import Project
from tests.ui.conftest import (
    fast_image_settings,
    fill_prompt,
    render_image,
    run,
    slow_video_settings,
    until,
)


def test_undo_redo_of_rename_star_and_delete_through_the_ui(tmp_path, loop, make_window, qtbot):
    project = Project.create(tmp_path / "project")
    w = make_window(project)
    doc = project.document
    fill_prompt(w, "two red circles", seed=11)
    w.params.batch_spin.setValue(2)
    a, b = w.generate()
    assert [doc.variant(v).request["seed"] for v in (a, b)] == [11, 12]
    assert w.undo_action.text() == "Undo Generate 2"
    run(loop, until(lambda: all(doc.variant(v).status == Status.DONE for v in (a, b)), 90))

    # rename through the tree's editor (the model's setData), undo and redo from the menu
    model = w.variant_model
    assert model.setData(model.index_for(a), "first")
    assert doc.variant(a).name == "first"
    assert model.index_for(a).data() == "first"
    w.undo_action.trigger()
    assert doc.variant(a).name == "" and model.index_for(a).data() != "first"
    w.redo_action.trigger()
    assert doc.variant(a).name == "first"

    # star with the action; Ctrl+Z / Ctrl+Shift+Z from the keyboard
    w.variants.select([b])
    w.variants.view.setFocus()
    w.star_action.trigger()
    assert doc.variant(b).starred
    assert model.index_for(b, 2).data(Qt.ItemDataRole.CheckStateRole) == Qt.CheckState.Checked
    qtbot.keyClick(w.variants.view, Qt.Key.Key_Z, Qt.KeyboardModifier.ControlModifier)
    assert not doc.variant(b).starred
    qtbot.keyClick(w.variants.view, Qt.Key.Key_Z,
                   Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier)
    assert doc.variant(b).starred
    # starring by the check box column is an undo step too
    assert model.setData(model.index_for(b, 2), Qt.CheckState.Unchecked.value,
                         Qt.ItemDataRole.CheckStateRole)
    assert not doc.variant(b).starred
    w.undo_action.trigger()
    assert doc.variant(b).starred

    # delete with the Delete key; undo brings the result back; redo deletes again
    w.variants.select([a])
    w.variants.view.setFocus()
    qtbot.keyClick(w.variants.view, Qt.Key.Key_Delete)
    assert not doc.has_variant(a) and not model.index_for(a).isValid()
    w.undo_action.trigger()
    assert doc.variant(a).status == Status.DONE and doc.variant(a).name == "first"
    assert model.index_for(a).isValid()
    w.redo_action.trigger()
    assert not doc.has_variant(a)
    w.undo_action.trigger()
    assert project.media.verify(doc.variant(a).artifacts[0].media_id)


def test_invalid_settings_are_flagged_next_to_the_field(tmp_path, loop, make_window, qtbot):
    project = Project.create(tmp_path / "project")
    w = make_window(project)
    p = w.params
    fill_prompt(w, "a circle")
    assert p.is_valid() and p.generate_button.isEnabled()
    p.width_spin.setValue(70)
    assert "multiple of 16" in p.error_text("width")
    assert not p.generate_button.isEnabled()
    p.prompt_edit.setFocus()
    qtbot.keyClick(p.prompt_edit, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    assert len(project.document) == 0  # Ctrl+Enter does nothing while invalid

    p.set_preset("Landscape 16:9")
    assert (p.width_spin.value(), p.height_spin.value()) == (80, 48)
    assert p.error_text("width") == "" and p.is_valid()
    p.prompt_edit.setPlainText("   ")
    assert "must not be empty" in p.error_text("prompt")
    p.prompt_edit.setPlainText("a circle")
    p.set_mode("t2v")
    p.frames_spin.setValue(8)
    # the embedded VAE's temporal compression sets the rule (4k+1 for 4x, 2k+1 for 2x)
    assert re.search(r"must be [24]k\+1", p.error_text("num_frames")), p.error_text("num_frames")
    p.frames_spin.setValue(9)
    assert p.is_valid()
    # unlocked, Generate draws a new seed: whatever the field holds does not block it
    p.seed_lock.setChecked(False)
    p.seed_edit.setText("abc")
    assert p.error_text("seed") == "" and p.generate_button.isEnabled()
    p.seed_lock.setChecked(True)
    assert p.error_text("seed") == "is not a whole number (0 to 9223372036854775807)"
    p.seed_edit.setText("-5")
    assert p.error_text("seed") == "must be in [0, 9223372036854775807]"
    for digits in ("²", "١٢"):  # Unicode digits that int() refuses or reads: not a seed
        p.seed_edit.setText(digits)
        assert p.error_text("seed") == "is not a whole number (0 to 9223372036854775807)"
        assert p.seed() == -1 and not p.generate_button.isEnabled()
    p.seed_edit.setText("")
    assert "is empty" in p.error_text("seed") and not p.generate_button.isEnabled()
    p.seed_edit.setText("42")
    assert p.error_text("seed") == "" and p.is_valid()

    # Ctrl+Enter in the prompt generates
    p.prompt_edit.setFocus()
    qtbot.keyClick(p.prompt_edit, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    assert len(project.document) == 1
    [vid] = [v.id for v in project.document.variants()]
    assert project.document.variant(vid).request["width"] == 80
    run(loop, until(lambda: project.document.variant(vid).status == Status.DONE, 90))


def test_undo_and_cancel_stop_running_jobs_and_failures_keep_the_studio_up(
        tmp_path, loop, make_window):
    project = Project.create(tmp_path / "project")
    w = make_window(project)
    doc = project.document
    c = w.controller
    fill_prompt(w, "a long video")
    slow_video_settings(w)
    [slow] = w.generate()
    run(loop, until(lambda: c.progress(slow), 90, "the slow job running"))
    assert doc.variant(slow).status == Status.RUNNING

    # undo of the running variant cancels its job
    w.undo_action.trigger()
    assert not doc.has_variant(slow)
    run(loop, until(lambda: c.engine.running is None and c._current is None, 60, "cancel"))

    # redo brings it back queued; it runs again; Cancel in the queue dock stops it
    w.redo_action.trigger()
    assert doc.variant(slow).status in (Status.QUEUED, Status.RUNNING)
    run(loop, until(lambda: c.progress(slow), 90, "the slow job running again"))
    w.queue.select(slow)
    assert w.queue.cancel_button.isEnabled()
    w.queue.cancel_button.click()
    run(loop, until(lambda: doc.variant(slow).status == Status.CANCELLED, 60, "cancelled"))
    assert w.queue.retry_button.isEnabled()

    # a job the engine refuses fails with its message; the next job still runs
    fast_image_settings(w)
    bad_request = w.params.draft().replace(model_hash="0" * 32)
    [bad] = c.generate([bad_request])
    [good] = w.generate()
    run(loop, until(lambda: doc.variant(good).status == Status.DONE, 90, "the next job"))
    assert doc.variant(bad).status == Status.FAILED
    assert "model_hash" in doc.variant(bad).error
    row = w.queue_model.row_of(bad)
    assert "model_hash" in w.queue_model.index(row, 3).data()
    assert w.isVisible()

    # retry from the queue dock puts the cancelled one back in the queue
    w.queue.select(slow)
    w.queue.retry_button.click()
    assert doc.variant(slow).status in (Status.QUEUED, Status.RUNNING)
    c.cancel(slow)
    run(loop, until(lambda: doc.variant(slow).status == Status.CANCELLED, 60, "cancelled"))


def test_undo_and_redo_while_the_result_is_written_runs_no_second_job(
        tmp_path, loop, make_window, monkeypatch):
    """Undo, then redo, of a Generate whose result is still being written: the variant comes
    back queued, and the save in flight finishes it. It used to be run again as a new job,
    whose previews painted over the result the save had put there."""
    import asyncio
    import threading

    project = Project.create(tmp_path / "project")
    w = make_window(project)
    doc = project.document
    c = w.controller
    fill_prompt(w, "a red circle on grass")
    fast_image_settings(w)
    writing, release = threading.Event(), threading.Event()
    stage_image = project.media.stage_image

    def slow_stage(*args, **kwargs):  # a slow disk: the save waits until the test says
        writing.set()
        release.wait(30)
        return stage_image(*args, **kwargs)

    monkeypatch.setattr(project.media, "stage_image", slow_stage)
    submitted = []
    submit = c._submit
    monkeypatch.setattr(c, "_submit", lambda job, *a: (submitted.append(job.variant_id),
                                                        submit(job, *a)))
    [vid] = w.generate()
    try:
        run(loop, until(writing.is_set, 90, "the result being written"))
        w.undo_action.trigger()
        assert not doc.has_variant(vid)
        w.redo_action.trigger()
        assert doc.variant(vid).status == Status.QUEUED
        run(loop, asyncio.sleep(0.3))  # the dispatcher's turn (a zero timer) comes and goes
        assert submitted == [vid] and c._current is None  # not run a second time
    finally:
        release.set()
    run(loop, until(lambda: doc.variant(vid).status == Status.DONE, 30, "the saved result"))
    assert submitted == [vid] and doc.variant(vid).artifacts

    # branching from it, then undoing it: Generate makes new roots, and says so
    w.variants.select([vid])
    w.branch_action.trigger()
    assert w.params.parent_id == vid
    w.undo_action.trigger()
    assert not doc.has_variant(vid)
    [root] = w.generate()
    assert doc.variant(root).parent_id is None and w.params.parent_id is None
    assert "new roots" in w.last_message[0]
    run(loop, until(lambda: doc.variant(root).status == Status.DONE, 90, "the root"))


def test_modes_a_model_cannot_run_are_disabled(qtbot):
    from pathlib import Path

    from studio.core.capabilities import MODES, ModelCapabilities
    from studio.engine.models.registry import ModelEntry
    from studio.ui.background import Background
    from studio.ui.params import ParamsPanel

    image_only = ModelCapabilities("stills", "flux", frozenset({"t2i", "i2i"}),
                                   default_width=512, default_height=512)
    video = ModelCapabilities("clips", "wan", frozenset(MODES), frame_multiple=4,
                              max_frames=81, default_frames=9, default_width=64,
                              default_height=64, max_references=3)
    background = Background()
    panel = ParamsPanel(background)
    background.setParent(panel)
    qtbot.addWidget(panel)
    panel.set_models([ModelEntry("clips", Path("clips"), "wan", capabilities=video),
                      ModelEntry("stills", Path("stills"), "flux", capabilities=image_only),
                      ModelEntry("broken", Path("broken"), error="model_index.json missing")])
    items = panel.mode_combo.model()
    assert [items.item(i).isEnabled() for i in range(len(MODES))] == [True] * 5
    assert not panel.model_combo.model().item(2).isEnabled()  # the broken model
    panel.set_mode("t2v")
    panel.model_combo.setCurrentIndex(1)
    assert [items.item(i).isEnabled() for i in range(len(MODES))] == \
        [True, True, False, False, False]
    assert panel.mode() == "t2i"  # the video mode fell back to one the model runs
    assert (panel.width_spin.value(), panel.height_spin.value()) == (512, 512)
    background.shutdown()


def test_a_draft_restored_without_its_model_is_not_saved_over(tmp_path, loop, make_window):
    """A project opened where its draft's model is missing: the panel shows what it can, and
    the whole saved draft stays in the project until the user edits the prompt (the panel's
    own changes, a hash arriving, must not overwrite it); then the edit is saved."""
    project = Project.create(tmp_path / "project")
    stored = {"request": {"mode": "t2i", "model": "/nowhere/flux-dev", "prompt": "a fox",
                          "seed": 5, "steps": 9, "guidance_scale": 3.5, "width": 64,
                          "height": 64, "num_frames": 1, "fps": 8.0},
              "seed_locked": True, "seed_text": "5", "batch": 2, "parent_id": None}
    project.save_draft(stored)
    w = make_window(project)
    assert w.params.prompt_edit.toPlainText() == "a fox" and w.params.batch_spin.value() == 2
    assert "not available" in w.last_message[0]
    w.params.steps_spin.setValue(12)  # a change of the panel's, not the prompt
    w.save_draft()
    assert project.load_draft()["request"]["model"] == "/nowhere/flux-dev"
    w.params.prompt_edit.setPlainText("a fox in snow")
    w.save_draft()
    saved = project.load_draft()
    assert saved["request"]["prompt"] == "a fox in snow" and saved["request"]["steps"] == 12


def test_a_full_disk_is_said_and_the_edits_reach_the_file_when_space_returns(
        tmp_path, loop, make_window):
    """A rename while the disk is full: the window says the change is kept and not saved
    (before: an internal-error banner about a rollback, or nothing at all, and the edit was
    lost at the next draft save), keeps trying, and says when the file has it."""
    from studio.core.document import RenameVariant, StarVariant
    from tests.store.test_project import _FullAtCommit
    from tests.store.test_project import add as add_variant

    project = Project.create(tmp_path / "project")
    w = make_window(project)
    doc = project.document
    vid = add_variant(doc, "a")
    real, full = project._conn, _FullAtCommit(project._conn)
    project._conn = full
    doc.history.push(RenameVariant(vid, "renamed"))
    doc.history.push(StarVariant(vid))
    message = w.statusBar().currentMessage()
    assert "Cannot save to the project (database or disk is full): 2 change(s) are kept" \
        in message, message
    assert w._save_retry.isActive()
    w.save_draft()  # the draft's own save works meanwhile: the edits stay pending
    assert project.unsaved_changes == 2
    w.notify("Settings copied")  # something else working does not hide that
    assert w.canvas.banner_text().startswith("Cannot save to the project")
    full.full = False
    w._retry_save()  # what the timer does every few seconds
    assert "saved again: no change was lost" in w.statusBar().currentMessage()
    assert not w._save_retry.isActive() and project.unsaved_changes == 0
    project._conn = real
    loaded = project._load().variant(vid)
    assert loaded.name == "renamed" and loaded.starred


def test_a_long_pasted_name_is_one_line_and_never_widens_the_window(tmp_path, loop,
                                                                      make_window):
    """10,000 characters with line breaks pasted as a name: the name becomes one line of at
    most 200 characters, and the window keeps its width with the variant on the canvas and
    in the compare view (before, it grew to about 71,800 pixels and stayed so)."""
    from studio.core.commands import MAX_NAME_CHARS, RenameVariant

    project = Project.create(tmp_path / "project")
    w = make_window(project)
    doc = project.document
    fill_prompt(w, "a red circle on grass")
    fast_image_settings(w)
    w.params.batch_spin.setValue(2)
    a, b = w.generate()
    run(loop, until(lambda: all(doc.variant(v).status == Status.DONE for v in (a, b)), 90))
    width = w.width()
    pasted = ("a very long name\n" * 700)[:10_000]
    assert w.variant_model.setData(w.variant_model.index_for(a), pasted)
    name = doc.variant(a).name
    assert len(name) <= MAX_NAME_CHARS and "\n" not in name and name.endswith("…")
    assert name.startswith("a very long name a very long name")
    w.variants.select([a])
    w.variants.select([a, b])
    w.compare_action.trigger()
    run(loop, until(lambda: w.compare.is_loaded(), 30, "the compare view"))
    w.rename(b, "x" * 5000)
    loop.run_until_complete(__import__("asyncio").sleep(0.2))
    assert len(doc.variant(b).name) == MAX_NAME_CHARS
    assert w.width() == width, (w.width(), width)
    with pytest.raises(ValueError, match="name: 201 characters; at most 200"):
        RenameVariant(a, "y" * 201)


def test_errors_do_not_linger_after_the_user_fixed_them(tmp_path, loop, make_window):
    """An error banner about an earlier attempt goes once something works ("Cannot generate
    yet", then a Generate that works); a refused trim puts the boxes back to the shot's trim
    (they showed the refused value while the shot kept another) and its error goes with
    the next good trim; a still shot's disabled boxes show nothing of the video before."""
    project = Project.create(tmp_path / "project")
    w = make_window(project)
    doc = project.document
    fill_prompt(w, "   ")
    assert w.generate() == [] and w.canvas.banner_text().startswith("Cannot generate yet")
    fill_prompt(w, "a small object moves left on grass", seed=1)  # fixed: the banner goes
    assert w.canvas.banner_text() == ""
    w.notify("an export failed", error=True)  # an error about something else stays
    w.params.steps_spin.setValue(5)
    assert w.canvas.banner_text() == "an export failed"
    w.params.set_mode("t2v")
    w.params.set_size(64, 64)
    w.params.steps_spin.setValue(3)
    w.params.frames_spin.setValue(9)
    [video] = w.generate()
    assert w.canvas.banner_text() == ""
    fast_image_settings(w)
    [image] = w.generate()
    run(loop, until(lambda: all(doc.variant(v).status == Status.DONE for v in (video, image)),
                    90))
    clip, still = w.timeline.add_variants([video, image])
    tl = w.timeline
    tl.select(clip)
    tl.out_spin.setValue(6)
    tl.in_spin.setValue(2)
    assert (doc.shot(clip).in_frame, doc.shot(clip).out_frame) == (2, 6)
    tl.in_spin.setValue(7)  # after the out frame: refused
    assert "out frame (6) must come after the in frame (7)" in w.canvas.banner_text()
    assert (tl.in_spin.value(), tl.out_spin.value()) == (2, 6)
    assert (doc.shot(clip).in_frame, doc.shot(clip).out_frame) == (2, 6)
    tl.out_spin.setValue(8)
    assert doc.shot(clip).out_frame == 8 and w.canvas.banner_text() == ""
    assert "Trimmed: frames 2 to 8" in w.statusBar().currentMessage()
    tl.select(still)
    assert not tl.in_spin.isEnabled() and (tl.in_spin.value(), tl.out_spin.value()) == (0, 0)


def test_decimals_take_a_comma_and_guidance_keeps_to_the_models_range(tmp_path, make_window):
    """Typing "4,5" in the guidance box is 4.5 (an English-locale box refused the comma
    keystroke, so it became 45); the box's range is the model's (the embedded model's
    1 to 20), not 0 to 100."""
    from PySide6.QtTest import QTest

    w = make_window(Project.create(tmp_path / "project"))
    box = w.params.guidance_spin
    caps = w.params.capabilities()
    assert (box.minimum(), box.maximum()) == caps.guidance_range
    for typed, want in (("4,5", 4.5), ("7.25", 7.25), ("1,5", 1.5)):
        box.lineEdit().selectAll()
        QTest.keyClicks(box.lineEdit(), typed)
        box.interpretText()
        assert box.value() == want, typed
    w.params.strength_spin.lineEdit().selectAll()
    QTest.keyClicks(w.params.strength_spin.lineEdit(), "0,35")
    w.params.strength_spin.interpretText()
    assert w.params.strength_spin.value() == 0.35


def test_a_finished_job_says_what_ran(tmp_path, loop, make_window):
    """The status bar says each finished job's time and what its profile did, from that
    job's own event: two profiles whose results are pixel-identical share one stored file,
    whose notes are the first job's."""
    project = Project.create(tmp_path / "project")
    w = make_window(project)
    doc = project.document
    seen = []
    w.controller.notice.connect(lambda text, error: seen.append(text))
    fill_prompt(w, "a red circle on grass", seed=5)
    fast_image_settings(w)
    w.params.steps_spin.setValue(12)
    done = []
    for profile in ("exact", "fast"):
        w.params.profile_combo.setCurrentText(profile)
        [vid] = w.generate()
        run(loop, until(lambda v=vid: doc.variant(v).status == Status.DONE, 90))
        done.append(next(t for t in seen if t.startswith("Done: ")))
        seen.clear()
    # exact has no lever to speak of (a busy CPU may be said, when other tests run)
    assert re.match(r"Done: a red circle on grass · seed 5 in \d+\.\d s($|; the CPU)",
                    done[0]), done[0]
    assert re.match(r"Done: .* in \d+\.\d s; step cache: \d+ of 24 denoiser calls "
                    r"computed in full, \d+ forecast", done[1]), done[1]


def test_export_dialogs_add_the_suffix_and_refuse_a_storyboard_as_gif(tmp_path, loop,
                                                                     make_window, monkeypatch):
    """A name typed without a suffix gets the result's (".png"), as the contact sheet and
    storyboard exports already did; a storyboard named "board.gif" is refused (it was
    written as "board.gif.mp4"); a long message is cut on the screen."""
    from PySide6.QtWidgets import QFileDialog

    from studio.ui.main_window import MAX_MESSAGE_CHARS

    w = make_window(Project.create(tmp_path / "project"))
    vid = render_image(w, loop)
    answers = iter([str(tmp_path / "hero"), str(tmp_path / "board.gif")])
    monkeypatch.setattr(QFileDialog, "getSaveFileName",
                        staticmethod(lambda *a, **k: (next(answers), "")))
    w.ask_export_variant()
    run(loop, until(lambda: (tmp_path / "hero.png").exists(), 30, "the export"))
    w.timeline.add_variants([vid])
    w.timeline.ask_export()
    assert "the storyboard is written as MP4; name the file .mp4 instead of .gif" in \
        w.last_message[0]
    assert not list(tmp_path.glob("board*"))
    w.notify("x" * 10_000, error=True)
    assert len(w.statusBar().currentMessage()) == MAX_MESSAGE_CHARS
    assert len(w.canvas.banner_text()) == MAX_MESSAGE_CHARS
