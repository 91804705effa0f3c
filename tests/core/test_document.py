"""The document model: commands with undo/redo, merging, groups, results, events, diffs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from studio.core.document import (
    HISTORY_CHANGED,
    QUEUE_CHANGED,
    SHOTS_ADDED,
    SHOTS_REMOVED,
    VARIANTS_ADDED,
    VARIANTS_CHANGED,
    VARIANTS_REMOVED,
    AddShot,
    AddVariant,
    Artifact,
    ChangeEvent,
    Command,
    DeleteVariant,
    Document,
    MoveShot,
    RemoveShot,
    RenameVariant,
    SetShotDuration,
    Shot,
    StarVariant,
    Status,
    TrimShot,
    UnknownIdError,
    Variant,
    diff_requests,
    json_strings,
    new_id,
)

REPO = Path(__file__).resolve().parents[2]


def req(prompt: str = "a cat", seed: int = 1, **extra: object) -> str:
    return json.dumps({"prompt": prompt, "seed": seed, **extra}, sort_keys=True)


def add(doc: Document, name: str = "", parent: str | None = None, t: float = 0.0, **kw) -> str:
    cmd = AddVariant(req(name), "rid-" + name, parent_id=parent, name=name, created_at=t, **kw)
    doc.history.push(cmd)
    return cmd.variant_id


def state(doc: Document) -> tuple:
    return tuple(doc.variants()), doc.shots(), doc.queue()


def check_undo_redo(doc: Document, command: Command) -> None:
    """push, undo, redo, undo, redo: each state is exactly the one before/after."""
    before = state(doc)
    doc.history.push(command)
    after = state(doc)
    assert after != before
    for _ in range(2):
        assert doc.history.undo()
        assert state(doc) == before
        assert doc.history.redo()
        assert state(doc) == after


@pytest.fixture
def doc() -> Document:
    return Document()


@pytest.fixture
def tree(doc: Document) -> tuple[Document, dict[str, str]]:
    """root -> (a -> a1, b); other root r2; shots on a, a1, r2, b."""
    ids = {"root": add(doc, "root", t=1)}
    ids["a"] = add(doc, "a", ids["root"], t=2)
    ids["b"] = add(doc, "b", ids["root"], t=3)
    ids["a1"] = add(doc, "a1", ids["a"], t=4)
    ids["r2"] = add(doc, "r2", t=5)
    for key in ("a", "a1", "r2", "b"):
        cmd = AddShot(ids[key])
        doc.history.push(cmd)
        ids["shot_" + key] = cmd.shot_id
    doc.history.clear()
    return doc, ids


# -- values -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"id": "nope"}, "id"),
        ({"parent_id": "x"}, "parent_id"),
        ({"request_json": "{not json"}, "request_json"),
        ({"request_json": "[1]"}, "request_json"),
        ({"request_id": ""}, "request_id"),
        ({"status": "exploded"}, "status"),
        ({"starred": 1}, "starred"),
        ({"name": 3}, "name"),
        ({"created_at": float("nan")}, "created_at"),
        ({"artifacts": ("x",)}, "artifacts"),
    ],
)
def test_variant_rejects_bad_fields(changes: dict, field: str) -> None:
    fields = {"id": new_id(), "parent_id": None, "request_json": req(), "request_id": "r"}
    fields.update(changes)
    with pytest.raises(ValueError, match=field):
        Variant(**fields)


def test_variant_converts_status_and_parses_request() -> None:
    v = Variant(new_id(), None, req("x"), "r", status="done")
    assert v.status is Status.DONE
    assert v.request["prompt"] == "x"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"in_frame": -1}, "in_frame"),
        ({"in_frame": 1.5}, "in_frame"),
        ({"in_frame": 5, "out_frame": 5}, "out_frame"),
        ({"duration_s": 0}, "duration_s"),
        ({"duration_s": float("inf")}, "duration_s"),
        ({"variant_id": "bad"}, "variant_id"),
    ],
)
def test_shot_rejects_bad_fields(kwargs: dict, field: str) -> None:
    fields = {"id": new_id(), "variant_id": new_id(), **kwargs}
    with pytest.raises(ValueError, match=field):
        Shot(**fields)


def test_artifact_rejects_bad_kind() -> None:
    with pytest.raises(ValueError, match="kind"):
        Artifact("abc", "audio")
    with pytest.raises(ValueError, match="media_id"):
        Artifact("", "image")


def test_commands_validate_at_construction() -> None:
    with pytest.raises(ValueError, match="request_json"):
        AddVariant("nope", "r")
    with pytest.raises(ValueError, match="name"):
        RenameVariant(new_id(), 5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="out_frame"):
        TrimShot(new_id(), 3, 2)
    with pytest.raises(ValueError, match="duration_s"):
        SetShotDuration(new_id(), -1.0)
    with pytest.raises(ValueError, match="index"):
        MoveShot(new_id(), -1)
    with pytest.raises(ValueError, match="starred"):
        StarVariant(new_id(), "yes")  # type: ignore[arg-type]


# -- commands: undo/redo over every one -----------------------------------------------------


def test_add_variant_undo_redo(doc: Document) -> None:
    root = add(doc, "root", t=1)
    check_undo_redo(doc, AddVariant(req("child"), "r", parent_id=root, name="child"))
    (child,) = doc.children(root)
    assert doc.variant(child).parent_id == root
    assert doc.queue() == (root, child)
    assert doc.history.undo_label == "Add variant"


def test_add_variant_checks_parent_when_done(doc: Document) -> None:
    with pytest.raises(UnknownIdError, match="parent_id"):
        doc.history.push(AddVariant(req(), "r", parent_id=new_id()))
    assert len(doc) == 0 and not doc.history.can_undo


def test_add_variant_redo_brings_back_the_result(doc: Document) -> None:
    vid = add(doc, "x")
    doc.set_status(vid, "running")
    doc.finish(vid, [Artifact("m1", "image")])
    done = doc.variant(vid)
    doc.history.undo()
    assert vid not in doc and doc.queue() == ()
    assert "m1" in doc.history.held_media()
    doc.history.redo()
    assert doc.variant(vid) == done and doc.queue() == ()


def test_add_variant_undo_while_running_comes_back_queued(doc: Document) -> None:
    first, vid = add(doc, "first", t=1), add(doc, "x", t=2)
    doc.set_status(vid, "running")
    doc.history.undo()
    doc.history.redo()
    assert doc.variant(vid).status is Status.QUEUED
    assert doc.queue() == (first, vid)


def test_delete_variant_restores_subtree_shots_and_queue(tree) -> None:
    doc, ids = tree
    doc.move_job(ids["a1"], 0)
    check_undo_redo(doc, DeleteVariant(ids["a"]))
    assert ids["a"] not in doc and ids["a1"] not in doc
    assert [s.variant_id for s in doc.shots()] == [ids["r2"], ids["b"]]
    assert doc.queue() == (ids["root"], ids["b"], ids["r2"])
    doc.history.undo()
    assert doc.children(ids["root"]) == (ids["a"], ids["b"])
    assert [s.id for s in doc.shots()] == [ids[f"shot_{k}"] for k in ("a", "a1", "r2", "b")]
    assert doc.queue() == (ids["a1"], ids["root"], ids["a"], ids["b"], ids["r2"])


def test_delete_running_variant_comes_back_queued(tree) -> None:
    doc, ids = tree
    doc.set_status(ids["a1"], "running")
    doc.move_job(ids["a1"], 0)
    doc.finish(ids["b"], [Artifact("m", "image")])
    doc.history.push(DeleteVariant(ids["root"]))
    assert doc.queue() == (ids["r2"],)
    doc.history.undo()
    # the delete cancelled the running job; undo brings it back queued at its old place
    assert doc.queue() == (ids["a1"], ids["root"], ids["a"], ids["r2"])
    assert doc.variant(ids["a1"]).status is Status.QUEUED
    assert doc.variant(ids["b"]).status is Status.DONE
    assert doc.variant(ids["b"]).artifacts == (Artifact("m", "image"),)


def test_delete_variant_holds_its_media(tree) -> None:
    doc, ids = tree
    doc.finish(ids["a1"], [Artifact("vid1", "video")])
    assert doc.media_in_use() >= {"vid1"}
    doc.history.push(DeleteVariant(ids["a"]))
    assert "vid1" not in doc.media_in_use()
    assert "vid1" in doc.history.held_media()
    doc.history.clear()
    assert "vid1" not in doc.history.held_media()


def test_rename_merges_consecutive_edits(tree) -> None:
    doc, ids = tree
    for name in ("c", "ca", "cat"):
        doc.history.push(RenameVariant(ids["a"], name))
    assert len(doc.history) == 1 and doc.variant(ids["a"]).name == "cat"
    doc.history.undo()
    assert doc.variant(ids["a"]).name == "a"
    doc.history.redo()
    assert doc.variant(ids["a"]).name == "cat"


def test_rename_does_not_merge_across_variants_seal_undo_or_clean(tree) -> None:
    doc, ids = tree
    doc.history.push(RenameVariant(ids["a"], "x"))
    doc.history.push(RenameVariant(ids["b"], "y"))  # other variant
    assert len(doc.history) == 2
    doc.history.seal()
    doc.history.push(RenameVariant(ids["b"], "z"))  # sealed: new step
    assert len(doc.history) == 3
    doc.history.set_clean()
    doc.history.push(RenameVariant(ids["b"], "w"))  # top is the clean state: new step
    assert len(doc.history) == 4 and not doc.history.is_clean
    doc.history.undo()
    assert doc.history.is_clean and doc.variant(ids["b"]).name == "z"
    doc.history.push(RenameVariant(ids["b"], "v"))  # after an undo: new step, tail dropped
    assert len(doc.history) == 4 and not doc.history.can_redo
    check_undo_redo(doc, RenameVariant(ids["root"], "renamed"))


def test_star_variant(tree) -> None:
    doc, ids = tree
    check_undo_redo(doc, StarVariant(ids["b"]))
    assert doc.variant(ids["b"]).starred
    check_undo_redo(doc, StarVariant(ids["b"], False))


def test_add_shot_at_index(tree) -> None:
    doc, ids = tree
    cmd = AddShot(ids["root"], index=1, duration_s=4.0)
    check_undo_redo(doc, cmd)
    assert doc.shot_index(cmd.shot_id) == 1 and doc.shot(cmd.shot_id).duration_s == 4.0
    with pytest.raises(ValueError, match="index"):
        doc.history.push(AddShot(ids["root"], index=99))
    with pytest.raises(UnknownIdError, match="variant_id"):
        doc.history.push(AddShot(new_id()))


def test_remove_shot(tree) -> None:
    doc, ids = tree
    check_undo_redo(doc, RemoveShot(ids["shot_a1"]))
    with pytest.raises(UnknownIdError, match="shot_id"):
        doc.history.push(RemoveShot(new_id()))


def test_move_shot(tree) -> None:
    doc, ids = tree
    check_undo_redo(doc, MoveShot(ids["shot_a"], 3))
    assert [s.id for s in doc.shots()][-1] == ids["shot_a"]
    with pytest.raises(ValueError, match="index"):
        doc.history.push(MoveShot(ids["shot_a"], 4))


def test_trim_merges_while_dragging(tree) -> None:
    doc, ids = tree
    sid = ids["shot_a"]
    for out in (40, 30, 20):
        doc.history.push(TrimShot(sid, 2, out))
    assert len(doc.history) == 1
    assert (doc.shot(sid).in_frame, doc.shot(sid).out_frame) == (2, 20)
    doc.history.undo()
    assert (doc.shot(sid).in_frame, doc.shot(sid).out_frame) == (0, None)
    doc.history.redo()
    doc.history.seal()  # mouse released: the next drag is its own step
    check_undo_redo(doc, TrimShot(sid, 5, None))


def test_set_shot_duration(tree) -> None:
    doc, ids = tree
    check_undo_redo(doc, SetShotDuration(ids["shot_b"], 3.5))
    assert len(doc.history) == 1
    doc.history.push(SetShotDuration(ids["shot_b"], 1.0))  # after a redo: a new step
    doc.history.push(SetShotDuration(ids["shot_b"], 2.0))  # merged into it
    assert len(doc.history) == 2
    doc.history.undo()
    assert doc.shot(ids["shot_b"]).duration_s == 3.5
    doc.history.push(SetShotDuration(ids["shot_r2"], 5.0))
    doc.history.seal()
    check_undo_redo(doc, SetShotDuration(ids["shot_r2"], None))


def test_group_is_one_step_and_nests(tree) -> None:
    doc, ids = tree
    before = state(doc)
    with doc.history.group("Replace"):
        doc.history.push(RemoveShot(ids["shot_b"]))
        with doc.history.group("inner"):
            doc.history.push(RenameVariant(ids["b"], "x"))
            doc.history.push(RenameVariant(ids["b"], "xy"))
        cmd = AddShot(ids["root"], index=0)
        doc.history.push(cmd)
    after = state(doc)
    assert len(doc.history) == 1 and doc.history.undo_label == "Replace"
    doc.history.undo()
    assert state(doc) == before
    doc.history.redo()
    assert state(doc) == after


def test_group_rules(tree) -> None:
    doc, ids = tree
    doc.history.begin_group("empty")
    doc.history.end_group()
    assert len(doc.history) == 0
    with pytest.raises(RuntimeError):
        doc.history.end_group()
    doc.history.begin_group("open")
    doc.history.push(StarVariant(ids["a"]))
    assert not doc.history.can_undo
    with pytest.raises(RuntimeError):
        doc.history.undo()
    with pytest.raises(RuntimeError):
        doc.history.redo()
    doc.history.end_group()
    assert doc.history.can_undo
    assert doc.history.undo() and not doc.variant(ids["a"]).starred
    assert not doc.history.undo()  # nothing left
    assert doc.history.redo() and doc.variant(ids["a"]).starred
    assert not doc.history.redo()


def test_push_rejects_non_commands_and_failed_commands_leave_no_step(doc: Document) -> None:
    with pytest.raises(TypeError):
        doc.history.push("rename")  # type: ignore[arg-type]
    with pytest.raises(UnknownIdError):
        doc.history.push(RenameVariant(new_id(), "x"))
    assert len(doc.history) == 0


# -- results from the engine ------------------------------------------------------------------


def test_results_are_not_undo_steps(tree) -> None:
    doc, ids = tree
    vid = ids["a"]
    doc.set_status(vid, Status.RUNNING)
    doc.set_status(vid, "running")  # the same status again: no-op
    doc.finish(vid, [Artifact("img", "image")])
    assert doc.variant(vid).status is Status.DONE and vid not in doc.queue()
    assert len(doc.history) == 0
    with pytest.raises(ValueError, match="status"):
        doc.set_status(vid, "running")
    with pytest.raises(ValueError, match="status"):
        doc.finish(vid, [])


def test_fail_and_retry(tree) -> None:
    doc, ids = tree
    vid = ids["b"]
    doc.set_status(vid, "running")
    doc.fail(vid, "Out of memory")
    v = doc.variant(vid)
    assert v.status is Status.FAILED and v.error == "Out of memory"
    assert vid not in doc.queue()
    doc.retry(vid)
    assert doc.variant(vid).status is Status.QUEUED and doc.variant(vid).error is None
    assert doc.queue()[-1] == vid
    with pytest.raises(ValueError, match="status"):
        doc.set_status(vid, "interrupted")  # only a running job is interrupted
    with pytest.raises(ValueError, match="status"):
        doc.set_status(vid, "bogus")
    with pytest.raises(UnknownIdError):
        doc.set_status(new_id(), "running")


def test_move_job(tree) -> None:
    doc, ids = tree
    q = list(doc.queue())
    doc.move_job(q[-1], 0)
    assert doc.queue() == (q[-1], *q[:-1])
    with pytest.raises(ValueError, match="index"):
        doc.move_job(q[0], len(q))
    doc.set_status(q[0], "cancelled")
    with pytest.raises(UnknownIdError):
        doc.move_job(q[0], 0)


# -- observers ---------------------------------------------------------------------------------


def test_each_operation_is_one_notification(tree) -> None:
    doc, ids = tree
    heard: list[tuple[ChangeEvent, ...]] = []
    unsubscribe = doc.subscribe(lambda events: heard.append(tuple(events)))
    doc.history.push(DeleteVariant(ids["a"]))
    assert len(heard) == 1
    kinds = [e.kind for e in heard[0]]
    assert kinds == [SHOTS_REMOVED, VARIANTS_REMOVED, QUEUE_CHANGED, HISTORY_CHANGED]
    assert heard[0][1].ids == (ids["a1"], ids["a"])  # children first
    doc.history.undo()
    assert [e.kind for e in heard[1]] == [
        VARIANTS_ADDED,
        SHOTS_ADDED,
        QUEUE_CHANGED,
        HISTORY_CHANGED,
    ]
    assert heard[1][0].ids == (ids["a"], ids["a1"])  # parents first
    doc.finish(ids["b"], [Artifact("m", "image")])
    assert [e.kind for e in heard[2]] == [VARIANTS_CHANGED, QUEUE_CHANGED]
    with doc.batch():
        doc.history.push(StarVariant(ids["b"]))
        doc.history.push(StarVariant(ids["a"]))
    assert len(heard) == 4
    unsubscribe()
    doc.history.undo()
    assert len(heard) == 4


def test_a_failing_listener_does_not_silence_others(doc: Document) -> None:
    heard = []

    def broken(events):
        raise OSError("disk full")

    doc.subscribe(broken)
    doc.subscribe(heard.append)
    with pytest.raises(OSError, match="disk full"):
        add(doc, "x")
    assert len(heard) == 1 and len(doc) == 1 and doc.history.can_undo


# -- diffs, restore, helpers ------------------------------------------------------------------


def test_diff_requests() -> None:
    parent = json.dumps({"prompt": "a cat", "seed": 1, "opt": {"profile": "exact", "x": 1}})
    child = json.dumps({"prompt": "a dog", "seed": 1, "opt": {"profile": "fast", "x": 1.0}, "n": 2})
    assert diff_requests(parent, child) == [
        ("n", None, 2),
        ("opt.profile", "exact", "fast"),
        ("opt.x", 1, 1.0),
        ("prompt", "a cat", "a dog"),
    ]
    assert diff_requests(parent, parent) == []
    with pytest.raises(ValueError, match="parent_json"):
        diff_requests("{", child)
    with pytest.raises(ValueError, match="child_json"):
        diff_requests(parent, "3")


def test_request_diff_against_parent(tree) -> None:
    doc, ids = tree
    assert doc.request_diff(ids["root"]) == []
    assert doc.request_diff(ids["a"]) == [("prompt", "root", "a")]


def test_json_strings() -> None:
    text = json.dumps({"init_image": {"content_id": "abc", "n": 1}, "refs": [{"id": "def"}]})
    assert json_strings(text) == {"abc", "def"}


def test_restore_repairs_queue_and_rejects_orphans() -> None:
    a = Variant(new_id(), None, req(), "r", status="done", created_at=1)
    b = Variant(new_id(), a.id, req(), "r", status="queued", created_at=2)
    c = Variant(new_id(), a.id, req(), "r", status="queued", created_at=3)
    doc = Document.restore([c, b, a], [Shot(new_id(), b.id)], queue=[c.id, a.id, "zz"])
    assert doc.queue() == (c.id, b.id)
    assert doc.children(a.id) == (b.id, c.id)
    assert not doc.history.can_undo
    with pytest.raises(ValueError, match="parent_id"):
        Document.restore([b])
    with pytest.raises(ValueError, match="variant_id"):
        Document.restore([a], [Shot(new_id(), b.id)])


def test_unknown_id_error_is_key_and_value_error(doc: Document) -> None:
    with pytest.raises(KeyError):
        doc.variant(new_id())
    with pytest.raises(ValueError, match="variant_id"):
        doc.variant(new_id())


def test_core_and_store_import_neither_torch_nor_qt() -> None:
    code = (
        "import sys, studio.core.document, studio.store\n"
        "bad = [m for m in ('torch', 'PySide6') if m in sys.modules]\n"
        "print(bad); sys.exit(1 if bad else 0)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
