"""The project store on real SQLite files: saving every edit, reopening, crashes, media."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from studio.core.document import (
    AddShot,
    AddVariant,
    Artifact,
    DeleteVariant,
    Document,
    MoveShot,
    RemoveShot,
    RenameVariant,
    SetShotDuration,
    StarVariant,
    Status,
    TrimShot,
)
from studio.core.media import pixels_content_id
from studio.store import MIGRATIONS, Project, ProjectError, ProjectLockedError, media_id_of
from studio.store.project import INTERRUPTED_MESSAGE

REPO = Path(__file__).resolve().parents[2]


def req(prompt: str, **extra: object) -> str:
    return json.dumps({"prompt": prompt, "seed": 7, **extra}, sort_keys=True)


def add(doc: Document, name: str, parent: str | None = None, **kw) -> str:
    cmd = AddVariant(req(name), "rid-" + name, parent_id=parent, name=name, **kw)
    doc.history.push(cmd)
    return cmd.variant_id


def state(doc: Document) -> tuple:
    return tuple(doc.variants()), doc.shots(), doc.queue()


def saved_state(project: Project) -> tuple:
    """What the database holds right now, read back through the loader."""
    return state(project._load())


def image(value: int, h: int = 6, w: int = 5, c: int = 3) -> np.ndarray:
    rng = np.random.default_rng(value)
    return rng.integers(0, 256, size=(h, w, c), dtype=np.uint8)


@pytest.fixture
def project(tmp_path: Path):
    p = Project.create(tmp_path / "proj")
    yield p
    p.close()


# -- opening ----------------------------------------------------------------------------------


def test_connection_settings_and_schema(project: Project) -> None:
    conn = project.connection
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 5000
    rows = conn.execute("SELECT id, name FROM schema_version ORDER BY id").fetchall()
    assert rows == [(m.id, m.name) for m in MIGRATIONS]
    assert project.schema_version == MIGRATIONS[-1].id
    assert project.integrity_check() == "ok"
    assert (project.folder / "project.sqlite").is_file() and (project.folder / "media").is_dir()


def test_open_errors(tmp_path: Path, project: Project) -> None:
    with pytest.raises(FileNotFoundError, match="folder"):
        Project.open(tmp_path / "missing")
    with pytest.raises(FileExistsError, match="folder"):
        Project.create(project.folder)
    with pytest.raises(ProjectLockedError):
        Project.open(project.folder)
    with pytest.raises(ValueError, match="synchronous"):
        Project.open(tmp_path / "x", create=True, synchronous="OFF")


def test_reopen_does_not_reapply_migrations_and_refuses_newer_schema(tmp_path: Path) -> None:
    folder = tmp_path / "p"
    Project.create(folder).close()
    with Project.open(folder) as p:
        assert p.schema_version == MIGRATIONS[-1].id
        with p.transaction() as conn:
            conn.execute("INSERT INTO schema_version VALUES (999, 'from_the_future', 0)")
    with pytest.raises(ProjectError, match="newer version"):
        Project.open(folder)
    conn = sqlite3.connect(folder / "project.sqlite")
    conn.execute("DELETE FROM schema_version WHERE id = 999")
    conn.execute("UPDATE schema_version SET name = 'renamed' WHERE id = 1")
    conn.commit()
    conn.close()
    with pytest.raises(ProjectError, match="schema"):
        Project.open(folder)


def test_transaction_rolls_back_and_nests(project: Project) -> None:
    doc = project.document
    vid = add(doc, "x")
    with pytest.raises(RuntimeError):
        with project.transaction():
            doc.history.push(RenameVariant(vid, "lost"))
            raise RuntimeError("boom")
    assert project._load().variant(vid).name == "x"
    with project.transaction():
        doc.history.push(RenameVariant(vid, "kept"))
        with pytest.raises(RuntimeError):
            with project.transaction():
                doc.history.push(StarVariant(vid))
                raise RuntimeError("inner")
    saved = project._load().variant(vid)
    assert saved.name == "kept" and not saved.starred


# -- every edit is saved when it happens ------------------------------------------------------


def test_every_command_undo_and_redo_is_saved(project: Project) -> None:
    doc = project.document
    steps = []

    def check() -> None:
        assert saved_state(project) == state(doc)
        steps.append(state(doc))

    root = add(doc, "root")
    check()
    child = add(doc, "child", root)
    grandchild = add(doc, "grandchild", child)
    check()
    doc.history.push(RenameVariant(root, "r"))
    doc.history.push(RenameVariant(root, "ro"))
    check()
    doc.history.push(StarVariant(child))
    check()
    shots = []
    for vid in (root, child, grandchild):
        cmd = AddShot(vid, duration_s=2.5)
        doc.history.push(cmd)
        shots.append(cmd.shot_id)
    check()
    doc.history.push(MoveShot(shots[0], 2))
    check()
    doc.history.push(TrimShot(shots[1], 3, 30))
    doc.history.push(TrimShot(shots[1], 4, 25))
    check()
    doc.history.push(SetShotDuration(shots[2], 6.0))
    check()
    doc.history.push(RemoveShot(shots[2]))
    check()
    with doc.history.group("gesture"):
        doc.history.push(RenameVariant(grandchild, "g"))
        doc.history.push(StarVariant(grandchild))
    check()
    doc.history.push(DeleteVariant(child))
    check()
    while doc.history.undo():
        check()
    assert len(doc) == 0
    while doc.history.redo():
        check()
    final = state(doc)
    project.close()
    with Project.open(project.folder) as again:
        assert state(again.document) == final
        assert not again.document.history.can_undo  # history is not saved
        assert again.integrity_check() == "ok"


def test_results_are_saved_and_reopened(project: Project) -> None:
    doc = project.document
    a, b, c, d = (add(doc, n) for n in "abcd")
    doc.move_job(d, 0)
    doc.set_status(a, "running")
    media = project.media.put_image(image(1))
    doc.finish(a, [Artifact(media, "image")])
    doc.set_status(b, "running")
    doc.fail(b, "Out of memory on the GPU")
    doc.set_status(c, "running")
    folder = project.folder
    project.close()
    with Project.open(folder) as p:
        doc2 = p.document
        assert p.recovered == [c]
        assert doc2.variant(a).status is Status.DONE
        assert doc2.variant(a).artifacts == (Artifact(media, "image"),)
        assert doc2.variant(b).error == "Out of memory on the GPU"
        assert doc2.variant(c).status is Status.INTERRUPTED
        assert doc2.variant(c).error == INTERRUPTED_MESSAGE
        assert doc2.queue() == (d,)
        np.testing.assert_array_equal(p.media.get_image(media), image(1))
        doc2.retry(c)
        assert doc2.queue() == (d, c)
    with Project.open(folder) as p:
        assert p.document.queue() == (d, c) and p.recovered == []


def test_open_repairs_and_saves_the_queue(tmp_path: Path) -> None:
    folder = tmp_path / "p"
    with Project.create(folder) as p:
        a, b = add(p.document, "a"), add(p.document, "b")
    conn = sqlite3.connect(folder / "project.sqlite")
    conn.execute("DELETE FROM queue WHERE variant_id = ?", (a,))  # a queued job lost its row
    conn.commit()
    conn.close()
    with Project.open(folder) as p:
        assert p.document.queue() == (b, a)
        rows = p.connection.execute("SELECT variant_id FROM queue ORDER BY position").fetchall()
        assert rows == [(b,), (a,)]


def test_a_failed_write_is_rolled_back_and_raised(project: Project) -> None:
    doc = project.document
    vid = add(doc, "x")
    # an artifact naming media the store does not have breaks a foreign key at commit
    with pytest.raises(sqlite3.IntegrityError):
        doc.finish(vid, [Artifact("0" * 32, "image")])
    assert project._load().variant(vid).status is Status.QUEUED
    assert project.integrity_check() == "ok"
    # the memory agrees (the result is not on screen either), nothing is left pending to
    # poison later saves, and the variant can still fail or finish
    assert doc.variant(vid).status is Status.QUEUED and doc.variant(vid).artifacts == ()
    assert vid in doc.queue() and project.unsaved_changes == 0
    doc.fail(vid, "the result could not be saved")
    assert project._load().variant(vid).status is Status.FAILED


# -- crash -----------------------------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import json, os, signal, sys
    import numpy as np
    from studio.core.document import (
        AddShot, AddVariant, Artifact, RenameVariant, StarVariant, TrimShot)
    from studio.store import Project

    project = Project.open(sys.argv[1], create=True)
    doc = project.document

    def add(name, parent=None):
        cmd = AddVariant(json.dumps({"prompt": name}), "rid-" + name, parent_id=parent,
                         name=name)
        doc.history.push(cmd)
        return cmd.variant_id

    done = add("done")
    doc.set_status(done, "running")
    media = project.media.put_image(np.full((8, 8, 3), 200, np.uint8))
    doc.finish(done, [Artifact(media, "image")])
    running = add("running", done)
    queued1 = add("queued-1", done)
    queued2 = add("queued-2")
    doc.set_status(running, "running")
    doc.history.push(RenameVariant(done, "hero"))
    doc.history.push(StarVariant(done))
    shot = AddShot(done, duration_s=3.0)
    doc.history.push(shot)
    doc.history.push(TrimShot(shot.shot_id, 0, 5))
    print(json.dumps({"done": done, "running": running, "queued": [queued1, queued2],
                      "media": media, "shot": shot.shot_id}), flush=True)
    i = 0
    while True:
        with project.transaction():
            doc.history.push(RenameVariant(queued2, f"loop-{i}"))
            if i == 5:
                # mid-transaction: a media file on disk and a row not yet committed
                orphan = project.media.put_image(np.full((8, 8, 3), 9, np.uint8))
                print(json.dumps({"orphan": orphan}), flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
        i += 1
    """
)


def test_crash_keeps_every_committed_edit(tmp_path: Path) -> None:
    folder = tmp_path / "crashed"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, str(script), str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == -signal.SIGKILL, result.stderr
    first, second = (json.loads(line) for line in result.stdout.splitlines())

    with Project.open(folder) as p:
        assert p.integrity_check() == "ok"
        doc = p.document
        done = doc.variant(first["done"])
        assert done.status is Status.DONE and done.name == "hero" and done.starred
        assert done.artifacts == (Artifact(first["media"], "image"),)
        assert p.media.verify(first["media"])
        np.testing.assert_array_equal(p.media.get_image(first["media"]), np.full((8, 8, 3), 200))
        assert p.recovered == [first["running"]]
        assert doc.variant(first["running"]).status is Status.INTERRUPTED
        q1, q2 = first["queued"]
        assert doc.queue() == (q1, q2)
        assert doc.variant(q1).status is Status.QUEUED
        assert doc.variant(q2).name == "loop-4"  # loop-5 was never committed
        (shot,) = doc.shots()
        assert (shot.id, shot.in_frame, shot.out_frame, shot.duration_s) == (
            first["shot"],
            0,
            5,
            3.0,
        )
        orphan = second["orphan"]
        assert orphan not in p.media  # its row was in the killed transaction
        doc.retry(first["running"])
        assert doc.queue() == (q1, q2, first["running"])
        # the orphan file is collected once old enough; the finished variant's media stays
        assert p.collect_garbage(orphan_grace_s=0) == [orphan]
        assert p.media.ids() == {first["media"]}


# -- media ------------------------------------------------------------------------------------


def no_temp_files(root: Path) -> bool:
    return not [p for p in root.rglob("*") if p.name.startswith(".tmp-")]


@pytest.mark.parametrize("shape", [(6, 5, 3), (6, 5, 4), (6, 5, 1), (6, 5)])
def test_image_round_trip_and_content_id(project: Project, shape: tuple) -> None:
    pixels = np.random.default_rng(3).integers(0, 256, size=shape, dtype=np.uint8)
    media_id = project.media.put_image(pixels)
    path = project.media.path(media_id)
    assert path.name == f"{media_id}.png" and path.parent.name == media_id[:2]
    data = path.read_bytes()
    assert media_id == hashlib.blake2b(data, digest_size=16).hexdigest() == media_id_of(data)
    np.testing.assert_array_equal(project.media.get_image(media_id), pixels)
    assert project.media.kind(media_id) == "image"
    assert project.media.find_by_pixels(pixels_content_id(pixels)) == media_id
    assert project.media.verify(media_id)
    assert no_temp_files(project.media.root)


def test_same_pixels_same_file(project: Project) -> None:
    a = project.media.put_image(image(5))
    b = project.media.put_image(image(5))
    assert a == b and project.media.ids() == {a}


def test_video_round_trip(project: Project) -> None:
    frames = np.random.default_rng(4).integers(0, 256, size=(3, 4, 6, 3), dtype=np.uint8)
    media_id = project.media.put_video(frames[:, :, ::2])  # non-contiguous input
    path = project.media.path(media_id)
    assert path.suffix == ".npy"
    assert media_id == media_id_of(path.read_bytes())
    np.testing.assert_array_equal(project.media.get_video(media_id), frames[:, :, ::2])
    mapped = project.media.get_video(media_id, mmap=True)
    assert isinstance(mapped, np.memmap) and not mapped.flags.writeable
    with pytest.raises(ValueError, match="media_id"):
        project.media.get_image(media_id)
    assert project.media.info(media_id)["meta"]["shape"] == [3, 4, 3, 3]
    assert no_temp_files(project.media.root)


@pytest.mark.parametrize(
    ("method", "value", "field"),
    [
        ("put_image", np.zeros((4, 4, 3), np.float32), "pixels"),
        ("put_image", np.zeros((4, 4, 2), np.uint8), "pixels"),
        ("put_image", np.zeros((0, 4, 3), np.uint8), "pixels"),
        ("put_image", [[1, 2]], "pixels"),
        ("put_video", np.zeros((4, 4), np.uint8), "frames"),
    ],
)
def test_bad_media_input(project: Project, method: str, value, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        getattr(project.media, method)(value)


def test_bad_media_ids(project: Project) -> None:
    with pytest.raises(ValueError, match="media_id"):
        project.media.path("../../etc/passwd")
    with pytest.raises(KeyError, match="media_id"):
        project.media.path("f" * 32)
    assert "f" * 32 not in project.media and "../x" not in project.media


def test_failed_write_leaves_no_file_and_no_row(project: Project, monkeypatch) -> None:
    def half_write(f, arr, allow_pickle):
        f.write(b"\x93NUMPY partial")
        raise OSError("disk full")

    monkeypatch.setattr(np, "save", half_write)
    with pytest.raises(OSError, match="disk full"):
        project.media.put_video(np.zeros((2, 2, 2, 3), np.uint8))
    files = [p for p in project.media.root.rglob("*") if p.is_file()]
    assert files == [] and project.media.ids() == set()


# -- garbage collection -----------------------------------------------------------------------


def test_garbage_collection_respects_document_history_and_requests(project: Project) -> None:
    doc = project.document
    media = project.media
    init = image(10)
    init_id = media.put_image(init)  # named by a request through its pixels id
    keep_id = media.put_image(image(11))
    vid = add(doc, "a")
    doc.set_status(vid, "running")
    art = media.put_image(image(12))
    doc.finish(vid, [Artifact(art, "image")])
    child = AddVariant(
        req("b", init_image={"content_id": pixels_content_id(init)}), "rid", parent_id=vid
    )
    doc.history.push(child)
    stray = media.put_image(image(13))

    assert project.collect_garbage(keep={keep_id}) == [stray]
    assert not (media.root / stray[:2] / f"{stray}.png").exists()

    doc.history.push(DeleteVariant(vid))  # the undo history still holds both variants
    assert project.collect_garbage(keep={keep_id}) == []
    doc.history.undo()
    np.testing.assert_array_equal(media.get_image(art), image(12))

    doc.history.redo()
    doc.history.clear()  # now nothing can bring them back
    assert sorted(project.collect_garbage()) == sorted([art, init_id, keep_id])
    assert media.ids() == set()
    assert [p for p in media.root.rglob("*") if p.is_file()] == []
    assert project.integrity_check() == "ok"


def test_collect_refuses_to_delete_referenced_media(project: Project) -> None:
    doc = project.document
    vid = add(doc, "a")
    art = project.media.put_image(image(1))
    doc.finish(vid, [Artifact(art, "image")])
    with pytest.raises(sqlite3.IntegrityError):
        project.media.collect_garbage(keep=set(), orphan_grace_s=0)
    assert project.media.verify(art)


def test_orphan_files_wait_for_the_grace_period(project: Project) -> None:
    root = project.media.root
    young = root / "ab" / ("ab" + "0" * 30 + ".png")
    young.parent.mkdir()
    young.write_bytes(b"x")
    temp = root / "incoming" / ".tmp-abc.png"
    temp.parent.mkdir(exist_ok=True)
    temp.write_bytes(b"y")
    assert project.collect_garbage() == []
    assert young.exists() and temp.exists()
    old = time.time() - 7200
    os.utime(young, (old, old))
    os.utime(temp, (old, old))
    assert project.collect_garbage() == [young.name.split(".")[0]]
    assert not young.exists() and not temp.exists()


def test_mark_then_sweep_on_another_thread_spares_a_reimport(project: Project) -> None:
    """The studio marks on its thread and sweeps on a worker; bytes stored again in between
    (the same content id) must survive the sweep."""
    import threading

    media = project.media
    gone = media.put_image(image(20))
    again = media.put_image(image(21))
    plan = project.mark_garbage(keep=set(), include_history=False)
    assert set(plan.doomed) == {gone, again} and media.ids() == set()
    assert not (media.root / gone[:2] / f"{gone}.png").exists()  # moved to media/trash/
    assert media.put_image(image(21)) == again  # re-imported before the sweep ran
    swept: list[list[str]] = []
    worker = threading.Thread(target=lambda: swept.append(media.sweep_garbage(plan)))
    worker.start()
    worker.join()
    assert sorted(swept[0]) == sorted([gone, again])
    assert media.verify(again) and again in media
    assert not list((media.root / "trash").iterdir())


def test_a_damaged_database_is_a_clear_project_error(tmp_path):
    """Garbage or a truncated file where the database should be: a ProjectError naming the
    file (the studio shows it in its "Cannot open the project" box), and the lock freed."""
    folder = tmp_path / "damaged"
    folder.mkdir()
    (folder / "project.sqlite").write_bytes(b"garbage" * 100)
    with pytest.raises(ProjectError, match="project.sqlite is not a readable project database"):
        Project.open(folder)
    good = Project.create(tmp_path / "good")
    good.close()
    data = (tmp_path / "good" / "project.sqlite").read_bytes()
    (folder / "project.sqlite").write_bytes(data[: len(data) // 2])
    with pytest.raises(ProjectError, match="not a readable project database"):
        Project.open(folder)
    (folder / "project.sqlite").unlink()
    Project.create(folder).close()  # the lock was released


def test_an_emptied_database_beside_stored_media_is_refused(tmp_path):
    """A 0-byte project.sqlite (a crash or a full disk truncated it) is a valid empty
    database to SQLite: the project opened empty, a new schema was written over the file and
    its media were orphaned. With stored media it is refused, naming both; without any, it
    is a project whose creation was cut short, and opens as a new one."""
    project = Project.create(tmp_path / "p")
    stored = project.media.put_image(np.zeros((8, 8, 3), np.uint8))
    project.close()
    db = tmp_path / "p" / "project.sqlite"
    db.write_bytes(b"")
    with pytest.raises(ProjectError, match=r"project.sqlite is empty \(0 bytes\) while .*media "
                                           r"holds 1 stored file\(s\): the project's "
                                           r"database was lost"):
        Project.open(tmp_path / "p")
    assert db.stat().st_size == 0 and stored
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "project.sqlite").write_bytes(b"")
    with Project.open(tmp_path / "cut") as fresh:
        assert len(fresh.document) == 0
    Project.open(tmp_path / "cut").close()  # the lock was released both times


def test_a_staged_result_is_kept_from_collection_until_committed(project: Project) -> None:
    """A result is written on a worker thread and recorded later on the project's thread; a
    collection in between must not take it for an unreferenced medium of the same bytes."""
    doc, media = project.document, project.media
    old = media.put_image(image(5))  # the same pixels, left unreferenced (a deleted variant)
    staged = media.stage_image(image(5))
    assert staged.media_id == old and media.staged_ids() == {old}
    assert project.collect_garbage(orphan_grace_s=0) == []
    vid = add(doc, "again")
    doc.set_status(vid, "running")
    with project.transaction():
        doc.finish(vid, [Artifact(media.commit(staged), "image")])
    assert media.staged_ids() == set()
    np.testing.assert_array_equal(media.get_image(old), image(5))
    # a staged file given up (its variant deleted meanwhile) is collectable again
    lost = media.stage_image(image(6))
    assert project.collect_garbage(orphan_grace_s=0) == []
    media.release(lost)
    assert project.collect_garbage(orphan_grace_s=0) == [lost.media_id]
    assert not media.root.joinpath(lost.media_id[:2], f"{lost.media_id}.png").exists()


def test_an_undo_group_is_saved_in_one_transaction(project: Project, monkeypatch) -> None:
    """"Generate 3" is one undo step: a failed save of its third variant keeps none of the
    three in the file (before, the first two were committed one by one)."""
    doc = project.document
    real = project._save_variant
    calls: list[str] = []

    def flaky(variant_id: str) -> None:
        calls.append(variant_id)
        if len(calls) == 3:
            raise sqlite3.OperationalError("disk I/O error")
        real(variant_id)

    monkeypatch.setattr(project, "_save_variant", flaky)
    with pytest.raises(sqlite3.OperationalError), doc.history.group("Generate 3"):
        for name in ("a", "b", "c"):
            doc.history.push(AddVariant(req(name), "rid-" + name, name=name))
    assert len(calls) == 3
    assert len(project._load()) == 0  # all or none: none
    # the three stay on screen (and in the undo history), pending: the next good save
    # writes them with its own change, so the file catches up with what the user sees
    assert len(doc) == 3 and project.unsaved_changes > 0
    monkeypatch.undo()
    with doc.history.group("Generate 2"):
        add(doc, "d")
        add(doc, "e")
    assert project.unsaved_changes == 0
    assert state(project._load()) == state(doc)
    assert sorted(v.name for v in project._load().variants()) == ["a", "b", "c", "d", "e"]


def test_a_failed_save_is_retried_and_saved_at_close(project: Project, monkeypatch) -> None:
    """An edit whose save failed (a full disk) is not lost by the next edits or by closing:
    the file gets it with the next good save, or at close."""
    doc = project.document
    vid = add(doc, "a")
    real = project._save_variant

    def failing(variant_id: str) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(project, "_save_variant", failing)
    with pytest.raises(sqlite3.OperationalError):
        doc.history.push(RenameVariant(vid, "renamed"))
    with pytest.raises(sqlite3.OperationalError):
        project.save_pending()  # still failing: still pending
    assert project._load().variant(vid).name == "a" and project.unsaved_changes == 1
    monkeypatch.setattr(project, "_save_variant", real)
    folder = project.folder
    project.close()
    with Project.open(folder) as again:
        assert again.document.variant(vid).name == "renamed"


class _FullAtCommit:
    """The project's connection on a disk that fills when the write-ahead log grows at
    COMMIT: SQLite then ends the transaction by itself (a ROLLBACK after it fails: "cannot
    rollback - no transaction is active")."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn, self.full = conn, True

    def execute(self, sql: str, *args):
        if self.full and sql == "COMMIT":
            self.conn.execute("ROLLBACK")
            raise sqlite3.OperationalError("database or disk is full")
        return self.conn.execute(sql, *args)

    def __getattr__(self, name: str):
        return getattr(self.conn, name)


def test_a_full_disk_loses_no_edit_and_says_so(project: Project) -> None:
    """A full disk at COMMIT: the error is the disk's (not "cannot rollback"), the edit stays
    pending, and a later good save of something else (the draft) does not count it as
    saved. Before, the failed ROLLBACK skipped the reset of the "written" mark, and the
    draft's save emptied the pending edits: reopened, the project had lost them. Told to a
    listener, the failure is reported instead of raised, and so is the save that catches
    up."""
    doc = project.document
    vid = add(doc, "a")
    told: list[tuple[str | None, int]] = []
    project.on_save_state = lambda exc, n: told.append((exc and str(exc), n))
    real, full = project._conn, _FullAtCommit(project._conn)
    project._conn = full
    doc.history.push(RenameVariant(vid, "renamed"))  # told, not raised
    doc.history.push(StarVariant(vid))
    assert told == [("database or disk is full", 1), ("database or disk is full", 2)]
    assert project.unsaved_changes == 2
    full.full = False
    project.save_draft({"request": {"prompt": "x"}})  # another transaction that works
    assert project.unsaved_changes == 2 and project._load().variant(vid).name == "a"
    project.save_pending()
    assert told[-1] == (None, 0) and project.unsaved_changes == 0
    project._conn = real
    folder = project.folder
    project.close()
    with Project.open(folder) as again:
        v = again.document.variant(vid)
        assert v.name == "renamed" and v.starred


def test_a_database_at_its_size_limit_raises_the_full_disk_error(project: Project) -> None:
    """SQLite's own SQLITE_FULL (the file cannot grow: a page-count limit stands in for the
    disk) ends the transaction at the INSERT: the error raised is that one."""
    doc = project.document
    pages = project.connection.execute("PRAGMA page_count").fetchone()[0]
    project.connection.execute(f"PRAGMA max_page_count={pages}")
    with pytest.raises(sqlite3.OperationalError, match="database or disk is full"):
        for i in range(50):  # until a page is needed
            add(doc, "x" * 2000 + str(i))
    assert project.unsaved_changes >= 1
    project.connection.execute("PRAGMA max_page_count=1073741823")
    project.save_pending()
    assert project.unsaved_changes == 0 and state(project._load()) == state(doc)


def test_a_crafted_project_cannot_get_files_outside_it_moved_or_deleted(tmp_path: Path) -> None:
    """A project someone else made: its media/trash or a fan-out folder is a link out of the
    project, and its database names media by "../" paths. Opening it and collecting garbage
    (the studio does both at once) touches nothing outside the project."""
    outside = tmp_path / "Pictures"
    outside.mkdir()
    photo = outside / "photo.jpg"
    photo.write_bytes(b"holiday")
    old_media = outside / ("ab" * 16 + ".png")  # media-like, old: an orphan if followed
    old_media.write_bytes(b"another project's medium")
    long_ago = time.time() - 7200
    os.utime(old_media, (long_ago, long_ago))
    secret = tmp_path / "home" / "ssh" / "id_key"
    secret.parent.mkdir(parents=True)
    secret.write_bytes(b"private")

    folder = tmp_path / "shared"
    with Project.create(folder) as p:
        root = p.media.root
        (root / "trash").symlink_to(outside, target_is_directory=True)
        (root / "zz").symlink_to(outside, target_is_directory=True)
        with p.transaction() as conn:
            conn.executemany(
                "INSERT INTO media (id, kind, ext, pixels_id, meta_json, created_at) "
                "VALUES (?, 'image', ?, ?, '{}', 0)",
                [("../../home/", "ssh/id_key", "x"), ("c" * 32, "../../../home/ssh/id_key", "y")])
    with Project.open(folder) as p:
        with pytest.raises(ValueError, match="media_id"):
            p.media.path("c" * 32)  # a valid id with a traversing extension is refused
        p.collect_garbage(orphan_grace_s=0)
    assert photo.read_bytes() == b"holiday" and old_media.exists()
    assert secret.read_bytes() == b"private"
    assert not (folder / "home").exists()


def test_the_draft_is_saved_replaced_and_keeps_its_inputs(tmp_path):
    """The settings panel's unsent request: one row, replaced whole; its strings (input and
    mask ids) count as references, so the garbage collector keeps their media; a damaged row
    is ignored rather than failing the open."""
    folder = tmp_path / "p"
    with Project.create(folder) as project:
        assert project.load_draft() is None
        project.save_draft({"request": {"prompt": "a cat", "init_image": {"content_id": "ab"}},
                            "batch": 2})
        project.save_draft({"request": {"prompt": "a dog", "init_image": {"content_id": "cd"}},
                            "batch": 3})
        with pytest.raises(ValueError, match="draft"):
            project.save_draft({"seed": float("nan")})
    with Project.open(folder) as project:
        assert project.load_draft() == {"request": {"prompt": "a dog",
                                                    "init_image": {"content_id": "cd"}},
                                        "batch": 3}
        refs = project.referenced_media()
        assert "cd" in refs and "ab" not in refs
        with project.transaction() as conn:
            conn.execute("UPDATE draft SET state_json = '{not json'")
        assert project.load_draft() is None and "cd" not in project.referenced_media()


def test_another_programs_database_is_not_made_a_project(tmp_path):
    """A project.sqlite with tables of its own but none of ours (another program's file):
    refused, and left as it was (before, the project's 15 tables were written into it)."""
    folder = tmp_path / "foreign"
    folder.mkdir()
    conn = sqlite3.connect(folder / "project.sqlite")
    conn.execute("CREATE TABLE invoices (id INTEGER, amount REAL)")
    conn.commit()
    conn.close()
    before = (folder / "project.sqlite").read_bytes()
    with pytest.raises(ProjectError, match=r"another program's database \(tables: invoices\)"):
        Project.open(folder)
    assert (folder / "project.sqlite").read_bytes() == before
    Project.create(tmp_path / "fine").close()  # and our own still open
    Project.open(tmp_path / "fine").close()
