"""The playback rate a video file really has, read back from files written by write_result."""

import numpy as np
import pytest
from PIL import Image

from studio.store.export import as_stored, playback_fps, read_frames, write_result


@pytest.mark.parametrize("suffix", [".gif", ".webp"])
@pytest.mark.parametrize("fps", [8.0, 16.0, 24.0, 7.3, 60.0, 120.0])
def test_playback_fps_is_what_the_file_stores(tmp_path, suffix, fps):
    frames = np.random.default_rng(0).integers(0, 255, (3, 16, 16, 3), dtype=np.uint8)
    path = write_result(tmp_path / f"clip{suffix}", frames, fps, '{"mode": "t2v"}', {})
    with Image.open(path) as im:
        im.seek(1)
        im.load()  # WebP reports a frame's duration once it is decoded
        stored_ms = im.info["duration"]
    assert playback_fps(suffix, fps) == pytest.approx(1000.0 / stored_ms)
    assert read_frames(path).shape == frames.shape
    assert playback_fps(".mp4", fps) == fps


def test_fast_gifs_are_written_at_most_at_50_fps(tmp_path):
    """GIF frame times of 10 ms or less play as ~100 ms in browsers: never write them."""
    frames = np.random.default_rng(1).integers(0, 255, (3, 16, 16, 3), dtype=np.uint8)
    path = write_result(tmp_path / "fast.gif", frames, 120.0, '{"mode": "t2v"}', {})
    with Image.open(path) as im:
        im.seek(1)
        assert im.info["duration"] == 20
    assert playback_fps(".gif", 120.0) == 50.0
    assert playback_fps(".webp", 120.0) == 100.0


@pytest.mark.parametrize("suffix", [".mp4", ".gif", ".webp"])
def test_as_stored_is_what_a_file_of_that_format_decodes_to(tmp_path, suffix):
    # odd size: MP4 pads to even sides; the noise makes H.264 and the GIF palette lossy
    frames = np.random.default_rng(3).integers(0, 256, (3, 17, 23, 3), dtype=np.uint8)
    path = write_result(tmp_path / f"v{suffix}", frames, 8.0, "{}")
    stored = as_stored(frames, suffix.upper(), 8.0)
    assert np.array_equal(stored, read_frames(path))
    assert np.array_equal(stored, frames) == (suffix == ".webp")


def test_as_stored_refuses_an_unknown_format():
    with pytest.raises(ValueError, match="out="):
        as_stored(np.zeros((1, 8, 8, 3), np.uint8), ".bmp", 8.0)
