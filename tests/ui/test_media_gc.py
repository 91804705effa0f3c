"""Media garbage collection: a deleted variant's files stay while undo can bring it back and
go once the (bounded) undo history lets go of it; other media stay."""

from __future__ import annotations

import numpy as np
from PIL import Image

from studio.core.document import Status
from studio.store.project import Project
from tests.ui.conftest import fast_image_settings, fill_prompt, run, until


def result_file(project, vid):
    media_id = project.document.variant(vid).artifacts[0].media_id
    return media_id, project.media.path(media_id)


def test_deleted_media_go_when_the_history_lets_go(tmp_path, loop, make_window):
    project = Project.create(tmp_path / "project")
    w = make_window(project)
    doc = project.document
    assert doc.history.limit == 200  # bounded by default
    fill_prompt(w, "a red circle on grass")
    fast_image_settings(w)
    w.params.batch_spin.setValue(3)
    a, b, c = w.generate()
    run(loop, until(lambda: all(doc.variant(v).status == Status.DONE for v in (a, b, c)), 90))
    (a_id, a_path), (b_id, b_path), (c_id, c_path) = (result_file(project, v)
                                                      for v in (a, b, c))
    # an input on the settings panel that no variant uses yet is kept too
    init = tmp_path / "init.png"
    Image.fromarray(np.full((64, 64, 3), 77, np.uint8)).save(init)
    w.import_input(init, "init.png", "init_image")
    run(loop, until(w.params.init_slot.refs, 20, "the init image"))
    init_id = project.media.find_by_pixels(w.params.init_slot.refs()[0].content_id)
    assert init_id is not None

    # deleted, but undo can bring it back: it stays on disk
    w.delete_variants([a])
    assert not doc.has_variant(a)
    assert run(loop, w.collector.collect()) == []
    assert a_path.exists() and a_id in project.media
    w.undo_action.trigger()
    assert doc.variant(a).status == Status.DONE and project.media.verify(a_id)
    w.redo_action.trigger()

    # the history lets go: its media are deleted (off the GUI thread), the others stay
    runs = w.collector.runs
    w.clear_history_action.trigger()
    assert not w.undo_action.isEnabled()
    run(loop, until(lambda: w.collector.runs > runs and not w.collector.busy, 20,
                    "the collection"))
    assert not a_path.exists() and a_id not in project.media
    assert project.media.verify(b_id) and project.media.verify(c_id)
    assert project.media.verify(init_id)
    assert not list((project.media.root / "trash").iterdir())

    # a delete that falls out of the bounded history goes the same way
    doc.history.limit = 3
    w.delete_variants([b])
    for star in (True, False, True):
        w.variants.select([c])
        w.star_action.trigger()
        assert doc.variant(c).starred is star
    runs = w.collector.runs
    w.rename(c, "kept")  # the fourth step: the delete of b is forgotten
    assert len(doc.history) == 3
    run(loop, until(lambda: w.collector.runs > runs and not w.collector.busy, 20,
                    "the collection"))
    assert not b_path.exists() and b_id not in project.media
    assert project.media.verify(c_id) and project.media.verify(init_id)

    # closing the window ends its history: what only it held goes at shutdown
    w.delete_variants([c])
    assert c_path.exists()
    w.close()
    run(loop, w.shutdown())
    assert not c_path.exists()
    assert project.integrity_check() == "ok"
    project.close()
