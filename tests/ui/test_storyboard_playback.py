"""Playing the storyboard in the canvas: the frames of the MP4 export, at the film's fps."""

from __future__ import annotations

import math

import numpy as np

from studio.core.document import Status
from studio.store.project import Project
from tests.ui.conftest import fill_prompt, run, until


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def make_video(w, loop, fps: float, seed: int) -> str:
    fill_prompt(w, "a small object moves left on grass", seed=seed)
    w.params.set_mode("t2v")
    w.params.set_size(64, 64)
    w.params.steps_spin.setValue(3)
    w.params.frames_spin.setValue(9)
    w.params.fps_spin.setValue(fps)
    [vid] = w.generate()
    return vid


def test_play_storyboard_shows_the_exported_frames(tmp_path, loop, make_window):
    project = Project.create(tmp_path / "project")
    w = make_window(project)
    doc = project.document
    slow = make_video(w, loop, 8.0, 1)
    fast = make_video(w, loop, 16.0, 2)
    fill_prompt(w, "a red circle on grass", seed=3)
    w.params.set_mode("t2i")
    w.params.steps_spin.setValue(3)
    [image] = w.generate()
    run(loop, until(lambda: all(doc.variant(v).status == Status.DONE
                                for v in (slow, fast, image)), 120, "the shots"))
    shots = w.timeline.add_variants([slow, image, fast])
    w.timeline.select(shots[0])
    w.timeline.in_spin.setValue(1)
    w.timeline.out_spin.setValue(7)
    w.timeline.select(shots[1])
    w.timeline.duration_spin.setValue(0.5)
    frames = {v: project.media.get_video(doc.variant(v).artifacts[0].media_id)
              for v in (slow, fast)}
    frames[image] = project.media.get_image(doc.variant(image).artifacts[0].media_id)[None]

    # the film at 8 fps (the first shot's): 6 trimmed frames, 0.5 s of the still, and the
    # 16 fps video's 9 frames at half rate (nearest frame, as the export does)
    expected = [(slow, i) for i in range(1, 7)] + [(image, 0)] * 4 + \
        [(fast, math.floor((k + 0.5) * 2)) for k in range(round(9 * 8 / 16))]

    player = w.canvas.player
    clock = player.clock = FakeClock()
    w.canvas.controls.loop_box.setChecked(False)

    w.timeline.play_button.click()
    run(loop, until(lambda: player.playing, 10, "playback"))
    film = w.canvas.storyboard
    assert film is not None and w.canvas.mode == "storyboard" and film.fps == 8.0
    assert w.timeline.play_button.text() == "❚❚ Pause" and w.timeline.stop_button.isEnabled()
    assert "shot 1/3" in w.canvas.caption.text()
    shown = [w.canvas.current_frame()]  # frame 0 is on screen from the start
    player.positionChanged.connect(lambda _: shown.append(w.canvas.current_frame()))
    ticks = 0
    while player.playing and ticks < 100:
        clock.t += 1 / film.fps
        player.tick()
        ticks += 1
    assert not player.playing and w.timeline.play_button.text() == "▶ Play"
    assert len(shown) == len(expected) == film.num_frames
    for got, (vid, index) in zip(shown, expected, strict=True):
        np.testing.assert_array_equal(got, frames[vid][index])
    assert "shot 3/3" in w.canvas.caption.text()

    # what plays is what exports
    result = run(loop, w.timeline.export_mp4(tmp_path / "storyboard.mp4"))
    assert result is not None and result.num_frames == len(shown) and result.fps == film.fps

    # a variant deleted while the export reads an earlier shot: the export ends as planned
    # (it used to fail with an unknown id, and only the log heard of it)
    media, load = w.timeline._media, w.timeline._media.load_frames

    async def load_then_delete(media_id):
        frames = await load(media_id)
        if doc.has_variant(fast):
            w.delete_variants([fast])
        return frames

    media.load_frames = load_then_delete
    try:
        again = run(loop, w.timeline.export_mp4(tmp_path / "again.mp4"))
    finally:
        del media.load_frames
    assert not doc.has_variant(fast) and len(doc.shots()) == 2
    assert again is not None and again.num_frames == result.num_frames
    w.undo_action.trigger()
    assert doc.has_variant(fast) and len(doc.shots()) == 3

    # a slow event loop skips frames instead of slowing down: 0.5 s later is frame 4
    player.seek(0)
    shown.clear()
    player.play()
    clock.t += 0.5
    player.tick()
    assert player.position == 4

    # editing the timeline re-plans the film in place; Stop goes back to the variant
    w.timeline.duration_spin.setValue(1.0)
    run(loop, until(lambda: w.canvas.storyboard is not None and
                    w.canvas.storyboard.num_frames == len(expected) + 4, 10, "the new film"))
    w.timeline.stop_button.click()
    assert w.canvas.mode == "variant" and w.canvas.storyboard is None
    assert not w.timeline.stop_button.isEnabled()
