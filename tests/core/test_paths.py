"""Atomic writes (studio/paths.py): what a killed or failed write leaves behind."""

from __future__ import annotations

import os
import time

from studio.paths import STALE_TEMPORARY_S, atomic_write_bytes


def test_a_write_clears_the_temporaries_killed_writes_of_that_file_left(tmp_path):
    """A process killed mid-export leaves its hidden temporary file (``.clip.<random>.tmp.mp4``)
    for good; the next write of that file deletes those untouched for an hour, and no other
    file: a write in progress (recent), another file's, or the user's own."""
    out = tmp_path / "clip [1].mp4"
    stale = tmp_path / ".clip [1].a1b2c3d4.tmp.mp4"
    fresh = tmp_path / ".clip [1].zz99yy88.tmp.mp4"
    other = tmp_path / ".board.a1b2c3d4.tmp.mp4"
    mine = tmp_path / ".clip [1].notes.txt"
    for path in (stale, fresh, other, mine):
        path.write_bytes(b"partial")
    old = time.time() - STALE_TEMPORARY_S - 60
    for path in (stale, other, mine):
        os.utime(path, (old, old))
    atomic_write_bytes(out, b"whole")
    assert out.read_bytes() == b"whole"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        p.name for p in (out, fresh, other, mine))
