"""GenerationRequest: validation of every field at its boundaries, JSON, content ids."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from studio.core.capabilities import ModelCapabilities
from studio.core.request import GenerationRequest, MediaRef, OptimizationSettings, RequestError

CAPS = ModelCapabilities(
    name="wan-test", family="wan", modes=frozenset({"t2i", "t2v", "i2v", "i2i"}),
    spatial_multiple=16, frame_multiple=4, min_size=16, max_size=256, max_pixels=256 * 128,
    max_frames=33, guidance_range=(1.0, 20.0))


def req(**changes) -> GenerationRequest:
    base = GenerationRequest(mode="t2i", model="m", prompt="a red circle", seed=1, steps=20,
                             guidance_scale=5.0, width=64, height=64)
    return base.replace(**changes)


def fields_of(problems) -> list[str]:
    return [p.field for p in problems]


def test_valid_request_has_no_problems():
    assert req().validate(CAPS) == []
    assert req(mode="t2v", num_frames=9).validate(CAPS) == []
    assert req(mode="t2v", num_frames=33).validate(CAPS) == []


@pytest.mark.parametrize("field,value,ok", [
    ("seed", -1, False), ("seed", 0, True), ("seed", 2**63 - 1, True), ("seed", 2**63, False),
    ("seed", 1.5, False), ("seed", True, False),
    ("steps", 0, False), ("steps", 1, True), ("steps", 200, True), ("steps", 201, False),
    ("guidance_scale", 0.99, False), ("guidance_scale", 1.0, True), ("guidance_scale", 20.0, True),
    ("guidance_scale", 20.01, False), ("guidance_scale", float("nan"), False),
    ("guidance_scale", "5", False),
    ("width", 15, False), ("width", 16, True), ("width", 24, False), ("width", 256, True),
    ("width", 272, False), ("height", 0, False), ("height", 48, True),
    ("fps", 0.5, False), ("fps", 1.0, True), ("fps", 120.0, True), ("fps", 121.0, False),
    ("prompt", "", False), ("prompt", "x" * 10_001, False), ("prompt", 5, False),
    ("negative_prompt", "x" * 10_000, True), ("model", "", False), ("mode", "x2y", False),
    ("prompt", "caf\udce9", False), ("negative_prompt", "caf\udce9", False),
    ("prompt", "café ☕ ｏｂｊｅｃｔ", True), ("model_hash", 5, False), ("model_hash", "", True),
])
def test_field_boundaries(field, value, ok):
    problems = req(**{field: value}).validate(CAPS)
    if ok:
        assert problems == []
    else:
        assert field in fields_of(problems), problems
        text = str([p for p in problems if p.field == field][0])
        assert text.startswith(field) and "must" in text


@pytest.mark.parametrize("frames,ok", [(1, False), (2, False), (5, True), (8, False),
                                       (9, True), (33, True), (37, False)])
def test_video_frames_follow_4k_plus_1(frames, ok):
    problems = req(mode="t2v", num_frames=frames).validate(CAPS)
    assert (problems == []) == ok, problems
    if not ok:
        assert "num_frames" in fields_of(problems)


def test_frame_error_names_the_nearest_valid_counts():
    (p,) = req(mode="t2v", num_frames=10).validate(CAPS)
    assert "4k+1" in p.rule and "9" in p.rule and "13" in p.rule


def test_image_modes_need_one_frame():
    assert "num_frames" in fields_of(req(num_frames=5).validate(CAPS))


def test_pixel_budget():
    problems = req(width=256, height=256).validate(CAPS)
    assert "width x height" in fields_of(problems)


def test_mode_inputs():
    ref = MediaRef("a" * 32)
    assert fields_of(req(mode="i2i").validate(CAPS)) == ["init_image"]
    assert fields_of(req(mode="i2v", num_frames=9).validate(CAPS)) == ["first_frame"]
    assert "init_image" in fields_of(req(init_image=ref).validate(CAPS))
    assert "references" in fields_of(req(references=(ref,)).validate(CAPS))
    assert req(mode="i2i", init_image=ref, strength=0.5).validate(CAPS) == []
    assert "strength" in fields_of(req(mode="i2i", init_image=ref, strength=1.5).validate(CAPS))
    assert "strength" in fields_of(
        req(mode="i2i", init_image=ref, strength=0.01, steps=20).validate(CAPS))
    # the model has no inpainting and no reference-to-video
    assert "mask" in fields_of(req(mode="i2i", init_image=ref, mask=ref).validate(CAPS))
    assert "mode" in fields_of(req(mode="r2v", num_frames=9, references=(ref,)).validate(CAPS))


def test_every_problem_is_reported_at_once():
    problems = req(steps=0, width=17, seed=-3, guidance_scale=99.0).validate(CAPS)
    assert set(fields_of(problems)) >= {"steps", "width", "seed", "guidance_scale"}
    with pytest.raises(RequestError) as info:
        req(steps=0, width=17).check(CAPS)
    assert isinstance(info.value, ValueError) and len(info.value.problems) == 2


def test_profile_is_checked():
    problems = req(optimization=OptimizationSettings("turbo")).validate(CAPS)
    assert fields_of(problems) == ["optimization.profile"]


def test_json_round_trip_and_canonical_form():
    r = req(mode="i2i", init_image=MediaRef("b" * 32, "cat.png", "palette expanded"),
            negative_prompt="blurry", strength=0.55)
    text = r.to_json()
    assert " " not in text.replace("a red circle", "").replace("palette expanded", "")
    assert list(json.loads(text)) == sorted(json.loads(text))
    back = GenerationRequest.from_json(text)
    assert back == r and back.content_id == r.content_id
    assert GenerationRequest.from_json(json.dumps(json.loads(text), indent=2)) == r


def test_content_id_changes_with_every_field():
    base = req()
    ids = {base.content_id}
    for change in [dict(seed=2), dict(steps=21), dict(prompt="a blue circle"),
                   dict(guidance_scale=5.5), dict(width=80),
                   dict(optimization=OptimizationSettings("fast")), dict(model_hash="x")]:
        ids.add(base.replace(**change).content_id)
    assert len(ids) == 8


def test_content_id_is_stable_across_processes():
    r = req(prompt="ünïcode prompt ☀", seed=123456789)
    code = ("from studio.core.request import GenerationRequest as G; import sys; "
            "print(G.from_json(sys.stdin.read()).content_id)")
    ids = {subprocess.run([sys.executable, "-c", code], input=r.to_json(), text=True,
                          capture_output=True, check=True,
                          env={"PYTHONHASHSEED": str(seed), "PATH": ""}).stdout.strip()
           for seed in (1, 2)}
    assert ids == {r.content_id}


@pytest.mark.parametrize("text,field", [
    ("not json", "request"), ("[1]", "request"), ('{"schema": 99}', "schema"),
    ('{"mode":"t2i","model":"m","prompt":"p","seed":1,"steps":2,"guidance_scale":1,'
     '"width":16,"height":16,"colour":"red"}', "colour"),
    ('{"mode":"t2i","model":"m","prompt":"p"}', "seed"),
    ('{"mode":"t2i","model":"m","prompt":"p","seed":1,"steps":2,"guidance_scale":1,'
     '"width":16,"height":16,"init_image":5}', "init_image"),
])
def test_bad_json_names_the_field(text, field):
    with pytest.raises(ValueError, match=field):
        GenerationRequest.from_json(text)


def test_nearest_frames():
    assert [CAPS.nearest_frames(n) for n in (1, 5, 7, 9, 100)] == [5, 5, 9, 9, 33]


def test_a_huge_step_count_with_a_strength_is_a_problem_not_an_overflow():
    image = MediaRef("0" * 32, "in.png")
    problems = req(mode="i2i", init_image=image, strength=0.5, steps=10**400).validate(CAPS)
    assert fields_of(problems) == ["steps"]
