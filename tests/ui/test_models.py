"""The item models under every kind of document change, checked by QAbstractItemModelTester
and against the document; and the pure helpers of the UI (sizes, diffs, storyboard rules)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PySide6.QtCore import QMimeData, QModelIndex, Qt
from PySide6.QtTest import QAbstractItemModelTester

from studio.core.capabilities import ModelCapabilities
from studio.core.commands import (
    AddShot,
    AddVariant,
    DeleteVariant,
    MoveShot,
    RemoveShot,
    RenameVariant,
    SetShotDuration,
    StarVariant,
    TrimShot,
)
from studio.core.document import Artifact, Document, Status
from studio.store.storyboard import StoryboardShot, letterbox, source_indices
from studio.ui.background import difference_heatmap, from_qimage, to_qimage
from studio.ui.compare import differing_parameters
from studio.ui.params import preset_size
from studio.ui.queue_panel import QueueModel
from studio.ui.timeline import SHOT_MIME, TimelineModel
from studio.ui.variants import VARIANTS_MIME, VariantTreeModel

MEDIA = "0" * 31 + "1"


def req(seed: int = 1, prompt: str = "a cat") -> str:
    return json.dumps({"mode": "t2i", "prompt": prompt, "seed": seed, "fps": 8.0})


def tree_of(model: VariantTreeModel, parent: QModelIndex = QModelIndex()) -> list:
    out = []
    for row in range(model.rowCount(parent)):
        index = model.index(row, 0, parent)
        out.append((model.variant_id(index), tree_of(model, index)))
    return out


def doc_tree(doc: Document, parent: str | None = None) -> list:
    return [(vid, doc_tree(doc, vid)) for vid in doc.children(parent)]


def test_models_follow_every_change_and_pass_the_model_tester(qapp, model_failures):
    doc = Document()
    tree, queue, timeline = VariantTreeModel(doc), QueueModel(doc), TimelineModel(doc)
    mode = QAbstractItemModelTester.FailureReportingMode.Warning
    testers = [QAbstractItemModelTester(m, mode, m) for m in (tree, queue, timeline)]

    def check() -> None:
        assert tree_of(tree) == doc_tree(doc)
        assert [queue.variant_id(r) for r in range(queue.rowCount())][: len(doc.queue())] \
            == list(doc.queue())
        assert queue.rowCount() == len(doc)
        assert [timeline.shot_id(r) for r in range(timeline.rowCount())] == \
            [s.id for s in doc.shots()]

    roots = []
    for i in range(3):
        cmd = AddVariant(req(i), f"r{i}", created_at=100 + i)
        doc.history.push(cmd)
        roots.append(cmd.variant_id)
    check()
    kids = []
    with doc.history.group("Generate 3"):
        for i in range(3):
            cmd = AddVariant(req(10 + i), "k", parent_id=roots[0], created_at=200 - i)
            doc.history.push(cmd)
            kids.append(cmd.variant_id)
    grand = AddVariant(req(20), "g", parent_id=kids[0], created_at=300)
    doc.history.push(grand)
    check()
    assert doc.children(roots[0]) == tuple(reversed(kids))  # siblings by creation time

    doc.set_status(roots[0], Status.RUNNING)
    doc.finish(roots[0], [Artifact(MEDIA, "image")])
    doc.set_status(roots[1], Status.RUNNING)
    doc.fail(roots[1], "out of memory")
    doc.move_job(grand.variant_id, 0)
    check()
    doc.retry(roots[1])
    doc.history.push(RenameVariant(roots[0], "hero"))
    assert tree.setData(tree.index_for(kids[1], 2), Qt.CheckState.Checked.value,
                        Qt.ItemDataRole.CheckStateRole)
    assert doc.variant(kids[1]).starred
    doc.history.push(StarVariant(roots[2]))
    check()

    shots = []
    for vid in (roots[0], kids[0], grand.variant_id):
        cmd = AddShot(vid)
        doc.history.push(cmd)
        shots.append(cmd.shot_id)
    doc.history.push(MoveShot(shots[2], 0))
    doc.history.push(TrimShot(shots[1], 1, 3))
    doc.history.push(SetShotDuration(shots[0], 3.0))
    check()
    # an edit typed in the table that the document refuses is said, and changes nothing
    refused: list[str] = []
    timeline.editRefused.connect(refused.append)
    rows = [timeline.shot_id(r) for r in range(timeline.rowCount())]
    depth = doc.history.index
    assert not timeline.setData(timeline.index(rows.index(shots[0]), 4), 0.0)
    assert not timeline.setData(timeline.index(rows.index(shots[1]), 3), 1)
    assert len(refused) == 2 and refused[0].startswith(f"Shot {rows.index(shots[0]) + 1}: ")
    assert "duration_s" in refused[0] and "out_frame: must be > in_frame (1)" in refused[1]
    assert doc.shot(shots[0]).duration_s == 3.0 and doc.shot(shots[1]).out_frame == 3
    assert doc.history.index == depth
    # a drop on the timeline moves the shot (and is an undo step)
    mime = timeline.mimeData([timeline.index(0, 0)])
    assert mime.hasFormat(SHOT_MIME)
    assert not timeline.dropMimeData(mime, Qt.DropAction.MoveAction, 3, 0, QModelIndex())
    assert doc.shots()[-1].id == shots[2]
    doc.history.push(RemoveShot(shots[0]))
    check()

    doc.history.push(DeleteVariant(kids[0]))  # takes its child and two shots with it
    check()
    assert not tree.index_for(grand.variant_id).isValid()
    steps = doc.history.index
    while doc.history.undo():
        check()
    assert len(doc) == 0
    for _ in range(steps):
        doc.history.redo()
        check()
    assert doc.variant(roots[0]).name == "hero"
    assert model_failures == []
    del testers


def test_timeline_table_trims_stay_inside_the_clip(qapp):
    """A trim typed in the table is checked against the clip's frames (the document alone
    cannot: it does not know them); a shot whose variant has no result yet edits nothing."""
    from PySide6.QtCore import QObject, Signal

    class Media(QObject):  # the MediaCache calls the model makes
        thumbnailReady = Signal(str)

        def info(self, media_id):
            return {"meta": {"shape": [9, 64, 64, 3]}}

        def thumbnail(self, media_id):
            return None

    doc = Document()
    timeline = TimelineModel(doc, Media())
    clip, pending = AddVariant(req(1), "clip"), AddVariant(req(2), "pending")
    doc.history.push(clip)
    doc.history.push(pending)
    doc.set_status(clip.variant_id, Status.RUNNING)
    doc.finish(clip.variant_id, [Artifact(MEDIA, "video")])
    shots = [AddShot(clip.variant_id), AddShot(pending.variant_id)]
    for cmd in shots:
        doc.history.push(cmd)
    refused: list[str] = []
    timeline.editRefused.connect(refused.append)
    assert not timeline.setData(timeline.index(0, 2), 9)  # frames 0..8
    assert not timeline.setData(timeline.index(0, 3), 10)
    assert "in frame 9 is past the clip's last frame (8)" in refused[0]
    assert "out frame 10 is past the clip's end (9 frames)" in refused[1]
    assert timeline.setData(timeline.index(0, 2), 8) and timeline.setData(
        timeline.index(0, 3), 9)
    assert (doc.shot(shots[0].shot_id).in_frame, doc.shot(shots[0].shot_id).out_frame) == (8, 9)
    editable = Qt.ItemFlag.ItemIsEditable
    assert timeline.flags(timeline.index(0, 2)) & editable
    assert not any(timeline.flags(timeline.index(1, c)) & editable for c in (2, 3, 4))


def test_variants_dragged_from_the_tree_drop_on_the_timeline_as_shots(qapp):
    """Dragging variants from the tree onto the timeline table adds a shot per variant where
    they are dropped (one undo step); the table still takes its own shots' moves."""
    from PySide6.QtCore import QPoint
    from PySide6.QtGui import QDragEnterEvent, QDragMoveEvent, QDropEvent
    from PySide6.QtWidgets import QApplication

    from studio.ui.background import Background
    from studio.ui.timeline import TimelinePanel

    doc = Document()
    tree, timeline = VariantTreeModel(doc), TimelineModel(doc)
    ids = []
    for i in range(3):
        cmd = AddVariant(req(i), f"v{i}", created_at=100 + i)
        doc.history.push(cmd)
        ids.append(cmd.variant_id)
    first = AddShot(ids[0])
    doc.history.push(first)
    indexes = [tree.index_for(v) for v in (ids[2], ids[1])]
    assert all(tree.flags(i) & Qt.ItemFlag.ItemIsDragEnabled for i in indexes)
    mime = tree.mimeData(indexes)
    depth = doc.history.index
    assert not timeline.dropMimeData(mime, Qt.DropAction.CopyAction, 0, 0, QModelIndex())
    assert [s.variant_id for s in doc.shots()] == [ids[2], ids[1], ids[0]]
    assert doc.history.index == depth + 1  # one step
    doc.history.undo()
    assert [s.variant_id for s in doc.shots()] == [ids[0]]

    # through the panel's real view: a drop below the rows appends (its drag-drop mode
    # must take drops from another view; InternalMove refused them)
    panel = TimelinePanel(timeline, doc, Background(), None)
    panel.resize(400, 300)
    viewport = panel.view.viewport()
    at = QPoint(10, viewport.height() - 5)
    copy, left = Qt.DropAction.CopyAction, Qt.MouseButton.LeftButton
    none = Qt.KeyboardModifier.NoModifier
    for event in (QDragEnterEvent(at, copy, mime, left, none),
                  QDragMoveEvent(at, copy, mime, left, none),
                  QDropEvent(at.toPointF(), copy, mime, left, none)):
        QApplication.sendEvent(viewport, event)
    assert [s.variant_id for s in doc.shots()] == [ids[0], ids[2], ids[1]]
    broken = QMimeData()
    broken.setData(VARIANTS_MIME, b"{not json")
    assert not timeline.dropMimeData(broken, Qt.DropAction.CopyAction, 0, 0, QModelIndex())
    assert len(doc.shots()) == 3
    panel.deleteLater()


def test_wipe_fits_a_second_image_of_another_aspect_inside_the_first():
    from PySide6.QtCore import QRectF

    from studio.ui.image_view import fit_rect

    outer = QRectF(10, 20, 200, 100)  # a 2:1 first image on screen
    assert fit_rect(outer, 400, 200) == outer  # same aspect: the same place
    tall = fit_rect(outer, 50, 100)  # 1:2 second image: 50 x 100, centred
    assert (tall.x(), tall.y(), tall.width(), tall.height()) == (85, 20, 50, 100)
    wide = fit_rect(outer, 400, 100)  # 4:1: full width, 50 high, centred
    assert (wide.x(), wide.y(), wide.width(), wide.height()) == (10, 45, 200, 50)
    assert fit_rect(outer, 0, 10) == outer


def test_preset_sizes_snap_to_the_model():
    tiny = ModelCapabilities("tiny", "wan", frozenset({"t2i"}), spatial_multiple=16,
                             max_size=256, max_pixels=65536, default_width=64,
                             default_height=64)
    assert preset_size(1, 1, tiny) == (64, 64)
    assert preset_size(16, 9, tiny) == (80, 48)
    assert preset_size(9, 16, tiny) == (48, 80)
    assert preset_size(4, 5, tiny) == (64, 80)
    big = ModelCapabilities("big", "wan", frozenset({"t2v"}), spatial_multiple=16,
                            max_size=1920, max_pixels=1280 * 720, default_width=832,
                            default_height=480)
    for rw, rh in ((16, 9), (9, 16), (4, 5), (1, 1)):
        w, h = preset_size(rw, rh, big)
        assert w % 16 == 0 and h % 16 == 0 and w * h <= 1280 * 720
        assert abs((w / h) / (rw / rh) - 1) < 0.05


def test_storyboard_rules():
    video = np.arange(8, dtype=np.uint8).reshape(8, 1, 1, 1).repeat(3, axis=3)
    video = np.broadcast_to(video, (8, 4, 4, 3))
    shot = StoryboardShot(video, fps=8.0)
    assert source_indices(shot, 8.0) == list(range(8))
    assert source_indices(shot, 16.0) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7]
    assert source_indices(shot, 4.0) == [1, 3, 5, 7]
    trimmed = StoryboardShot(video, fps=8.0, in_frame=2, out_frame=5)
    assert source_indices(trimmed, 8.0) == [2, 3, 4]
    still = StoryboardShot(video[:1], fps=8.0)
    assert source_indices(still, 10.0) == [0] * 20  # the default 2 s
    assert source_indices(StoryboardShot(video[:1], 8.0, duration_s=0.5), 10.0) == [0] * 5
    wide = np.full((2, 8, 3), 255, np.uint8)
    boxed = letterbox(wide, 8, 8)
    assert boxed.shape == (8, 8, 3)
    assert boxed[0].max() == 0 and boxed[3:5].min() == 255  # black bars above and below
    # playback letterboxes a repeated source frame (an image shot) once, not per film frame
    from studio.store.storyboard import plan_storyboard

    film = plan_storyboard([StoryboardShot(video[:3], fps=8.0), StoryboardShot(wide[None], 8.0)])
    assert (film.width, film.height) == (4, 4) and film.num_frames == 3 + 16
    first = film.frame(3)
    assert film.frame(4) is first and film.frame(18) is first
    np.testing.assert_array_equal(first, letterbox(wide, 4, 4))
    np.testing.assert_array_equal(film.frame(1), letterbox(np.asarray(video[1]), 4, 4))
    assert film.frame(3) is not first  # after another shot's frame: made again, equal
    np.testing.assert_array_equal(film.frame(3), first)
    # the film's rate is the first video shot's: an image request's fps is a hidden field
    # (an 8 fps still first must not drop two of every three frames of the 24 fps clips)
    film = plan_storyboard([StoryboardShot(wide[None], 8.0), StoryboardShot(video, fps=24.0),
                            StoryboardShot(video, fps=12.0)])
    assert film.fps == 24.0 and (film.width, film.height) == (8, 2)
    assert film.indices[1] == tuple(range(8)) and film.indices[2] == tuple(
        i for i in range(8) for _ in range(2))
    assert plan_storyboard([StoryboardShot(wide[None], 8.0)]).fps == 8.0  # stills alone
    from studio.store.storyboard import film_rate  # compare plays at the same rate

    assert film_rate([(1, 8.0), (9, 24.0), (9, 12.0)]) == 24.0
    assert film_rate([(1, 8.0), (1, 30.0)]) == 8.0
    with pytest.raises(ValueError, match="clips"):
        film_rate([])


def test_pixels_round_trip_and_difference_map():
    pixels = np.random.default_rng(0).integers(0, 255, (5, 7, 3), dtype=np.uint8)
    np.testing.assert_array_equal(from_qimage(to_qimage(pixels)), pixels)
    heat, stats = difference_heatmap(pixels, pixels)
    assert stats == {"mean": 0.0, "max": 0.0} and heat.shape == (5, 7, 3)
    other = pixels.copy()
    other[0, 0] = 255 - other[0, 0]
    heat, stats = difference_heatmap(pixels, other)
    assert stats["max"] > 0 and heat[0, 0].sum() > heat[1, 1].sum()


@pytest.mark.parametrize(
    ("requests", "fields"),
    [
        ([{"a": 1, "o": {"p": "x"}}, {"a": 1, "o": {"p": "y"}}], ["o.p"]),
        ([{"a": 1}, {"a": 1.0}], ["a"]),
        ([{"a": 1}, {"a": 1}, {"a": 2, "b": None}], ["a"]),
    ],
)
def test_differing_parameters(requests, fields):
    assert [key for key, _ in differing_parameters(requests)] == fields
