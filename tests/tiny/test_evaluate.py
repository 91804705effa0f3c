"""The adherence evaluator: right on the world's own renders (also noisy or blurred), and
demonstrably able to fail (shuffled captions, single wrong attributes, ignored prompts)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from studio.tiny import evaluate as ev
from studio.tiny import world as w

N_PROMPTS = 240  # per mode; the evaluation set is >= 200 prompts


def _noise(x: np.ndarray, rng: np.random.Generator, sigma: float = 8.0) -> np.ndarray:
    return np.clip(np.rint(x + rng.normal(0.0, sigma, x.shape)), 0, 255).astype(np.uint8)


def _box_blur(x: np.ndarray) -> np.ndarray:
    """3x3 box blur over the two spatial axes (the last but one two), edges replicated."""
    pad = [(0, 0)] * (x.ndim - 3) + [(1, 1), (1, 1), (0, 0)]
    p = np.pad(x.astype(np.float32), pad, mode="edge")
    h, wd = x.shape[-3:-1]
    out = sum(p[..., dy:dy + h, dx:dx + wd, :] for dy in range(3) for dx in range(3)) / 9.0
    return np.rint(out).astype(np.uint8)


def _gaussian_blur(x: np.ndarray, sigma: float = 0.7) -> np.ndarray:
    k = np.exp(-np.arange(-2, 3) ** 2 / (2 * sigma ** 2))
    k /= k.sum()
    f = x.astype(np.float32)
    h, wd = x.shape[-3:-1]
    lead = [(0, 0)] * (x.ndim - 3)
    p = np.pad(f, lead + [(2, 2), (0, 0), (0, 0)], mode="edge")
    f = sum(k[i] * p[..., i:i + h, :, :] for i in range(5))
    p = np.pad(f, lead + [(0, 0), (2, 2), (0, 0)], mode="edge")
    f = sum(k[i] * p[..., :, i:i + wd, :] for i in range(5))
    return np.rint(f).astype(np.uint8)


CORRUPTIONS = {
    "clean": lambda x, rng: x,
    "noise": _noise,
    "box_blur": lambda x, rng: _box_blur(x),
    "gaussian_blur": lambda x, rng: _gaussian_blur(x),
}


@pytest.fixture(scope="module")
def renders():
    """Per mode: the evaluation specs and the world's renders of them."""
    out = {}
    for mode in w.MODES:
        specs = [s for _, s in w.eval_prompts(N_PROMPTS, mode, seed=0)]
        if mode == "t2v":
            samples = [w.render_clip(s) for s in specs]
        else:
            samples = [w.render_image(s) for s in specs]
        out[mode] = specs, samples
    return out


def _failures(report: ev.EvalReport) -> list:
    return [d for d in report.details if not all(all(v) for v in d["correct"].values())][:5]


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
@pytest.mark.parametrize("mode", w.MODES)
def test_own_renders_score_at_least_98_percent(renders, mode, corruption):
    specs, samples = renders[mode]
    rng = np.random.default_rng(7)
    corrupted = [CORRUPTIONS[corruption](x, rng) for x in samples]
    report = ev.evaluate(corrupted, specs)
    expected = {"background", "count", "colour", "shape", "size", "position"}
    if mode == "t2v":
        expected.add("motion")
    assert set(report.accuracy) == expected
    assert report.counts["colour"] == N_PROMPTS
    for attribute, accuracy in report.accuracy.items():
        assert accuracy >= 0.98, (attribute, report.summary(), _failures(report))


@pytest.mark.parametrize("mode", w.MODES)
def test_shuffled_captions_score_near_chance(renders, mode):
    specs, samples = renders[mode]
    perm = np.random.default_rng(1).permutation(len(specs))
    report = ev.evaluate(samples, [specs[i] for i in perm])
    for attribute, accuracy in report.accuracy.items():
        if attribute == "count":  # every evaluation scene has one object
            continue
        chance = report.chance[attribute]
        assert chance < 0.55
        assert abs(accuracy - chance) <= 0.1, (attribute, accuracy, chance)
        assert accuracy <= 0.6, (attribute, accuracy)


def _other(values, current, rng):
    choices = [v for v in values if v != current]
    return choices[int(rng.integers(len(choices)))]


def _change(spec: w.SceneSpec, attribute: str, rng: np.random.Generator) -> w.SceneSpec:
    (obj,) = spec.objects
    if attribute == "background":
        allowed = [b for b in w.BACKGROUNDS if w.is_allowed(obj.colour, b)]
        return dataclasses.replace(spec, background=_other(allowed, spec.background, rng))
    if attribute == "colour":
        allowed = [c for c in w.COLOURS if w.is_allowed(c, spec.background)]
        new = dataclasses.replace(obj, colour=_other(allowed, obj.colour, rng))
    else:
        values = {"shape": w.SHAPES, "size": w.SIZES, "position": w.POSITIONS,
                  "motion": w.MOTIONS}[attribute]
        new = dataclasses.replace(obj, **{attribute: _other(values, getattr(obj, attribute), rng)})
    return dataclasses.replace(spec, objects=(new,))


@pytest.mark.parametrize("attribute", ["background", "colour", "shape", "size", "position",
                                       "motion"])
def test_a_single_wrong_attribute_is_caught(renders, attribute):
    """Render each prompt with exactly one attribute changed: only that attribute fails."""
    mode = "t2v" if attribute == "motion" else "t2i"
    specs = renders[mode][0][:60]
    rng = np.random.default_rng(3)
    wrong = [_change(s, attribute, rng) for s in specs]
    render = w.render_clip if mode == "t2v" else w.render_image
    report = ev.evaluate([render(s) for s in wrong], specs)
    for name, accuracy in report.accuracy.items():
        if name == attribute:
            assert accuracy <= 0.02, (name, report.summary())
        else:
            assert accuracy >= 0.98, (name, report.summary())


def test_error_counts_tell_a_still_clip_from_a_wrong_direction(renders):
    """Clips rendered with no travel read "<direction>->still"; clips moving the opposite way
    read "<direction>-><opposite>"; the counts add up to the wrong objects."""
    specs = [s for s in renders["t2v"][0][:80]
             if len(s.objects) == 1 and s.objects[0].motion in ("left", "right", "up", "down")]
    assert len(specs) >= 10
    with w.motion_distance(0.0):
        still = ev.evaluate([w.render_clip(s) for s in specs], specs)
    counts = ev.error_counts(still, "motion")
    assert sum(counts.values()) == len(specs)
    assert all(k.endswith("->still") for k in counts), counts
    assert list(counts.values()) == sorted(counts.values(), reverse=True)
    opposite = {"left": "right", "right": "left", "up": "down", "down": "up"}
    flipped = [dataclasses.replace(s, objects=(dataclasses.replace(
        s.objects[0], motion=opposite[s.objects[0].motion]),)) for s in specs]
    backwards = ev.evaluate([w.render_clip(s) for s in flipped], specs)
    assert ev.error_counts(backwards, "motion") == {
        k: v for k, v in sorted(
            {f"{m}->{opposite[m]}": sum(s.objects[0].motion == m for s in specs)
             for m in opposite}.items(), key=lambda kv: (-kv[1], kv[0])) if v}
    assert ev.error_counts(backwards, "colour") == {}
    with pytest.raises(ValueError, match="attribute='speed'"):
        ev.error_counts(still, "speed")


@pytest.mark.parametrize("video", [False, True])
def test_two_object_training_scenes(video):
    rng = np.random.default_rng(11)
    specs = []
    while len(specs) < (40 if video else 120):
        spec = w.sample_scene(rng, video=video, two_object_prob=1.0)
        if len(spec.objects) == 2:
            specs.append(spec)
    render = w.render_clip if video else w.render_image
    report = ev.evaluate([_noise(render(s), rng) for s in specs], specs)
    assert report.counts["colour"] == 2 * len(specs)
    for attribute, accuracy in report.accuracy.items():
        assert accuracy >= 0.98, (attribute, report.summary(), _failures(report))


@pytest.mark.parametrize("frames, height, width", [(9, 96, 96), (5, 64, 96), (16, 128, 128)])
def test_other_resolutions_and_frame_counts(frames, height, width):
    specs = [s for _, s in w.eval_prompts(28, "t2v", seed=5)]
    samples = [w.render_clip(s, frames, height, width) for s in specs]
    report = ev.evaluate(samples, specs)
    assert min(report.accuracy.values()) >= 0.96, report.summary()


def test_reading_measures_geometry():
    spec = w.SceneSpec("sky", (w.ObjectSpec("red", "square", "large", "top right"),))
    reading = ev.analyze_image(w.render_image(spec))
    assert reading.background == "sky"
    assert reading.background_scores["sky"] < 10  # the object's pixels, capped
    assert min(v for k, v in reading.background_scores.items() if k != "sky") > 50
    (obj,) = reading.objects
    assert obj.motion is None and obj.motion_features is None
    assert obj.extent == pytest.approx(w.SIZE_FRACTIONS["large"], abs=0.01)
    assert obj.centre == pytest.approx(w.POSITION_XY["top right"], abs=0.01)
    assert obj.shape_scores["square"] > 0.95 > max(
        v for k, v in obj.shape_scores.items() if k != "square")
    assert np.allclose(obj.rgb, w.COLOURS["red"], atol=2)
    falling = dataclasses.replace(spec.objects[0], motion="down")
    clip = w.render_clip(dataclasses.replace(spec, video=True, objects=(falling,)))
    (moving,) = ev.analyze_clip(clip).objects
    assert moving.position == "top right" and moving.motion == "down"
    dx, dy, dlog_area = moving.motion_features
    assert dy == pytest.approx(w.MOTION_DISTANCE, abs=0.01) and abs(dx) < 0.01
    assert abs(dlog_area) < 0.1


def test_empty_and_float_inputs():
    blank = np.broadcast_to(np.asarray(w.SOLID_BACKGROUNDS["teal"], np.uint8), (64, 64, 3))
    reading = ev.analyze_image(blank)
    assert reading.background == "teal" and reading.objects == ()
    spec = w.SceneSpec("teal", (w.ObjectSpec("yellow", "circle", "small", "left"),))
    report = ev.evaluate([blank], [spec])
    assert report.accuracy["background"] == 1.0
    assert report.accuracy["colour"] == 0.0 and report.accuracy["count"] == 0.0
    image = w.render_image(spec)
    as_float = ev.analyze_image(image.astype(np.float32) / 255.0)
    assert as_float.objects[0].colour == "yellow" and as_float.objects[0].position == "left"
    with pytest.raises(ValueError):
        ev.evaluate([image], [spec, spec])
    with pytest.raises(ValueError):
        ev.analyze_image(image[..., :2])


def test_numpy_labelling_matches_scipy(monkeypatch):
    rng = np.random.default_rng(2)
    specs = [w.sample_scene(rng, two_object_prob=1.0) for _ in range(12)]
    images = [_noise(w.render_image(s), rng) for s in specs]
    with_default = [ev.analyze_image(x) for x in images]
    monkeypatch.setattr(ev, "_USE_SCIPY", False)
    labels, n = ev._label(np.array([[1, 0, 0, 1], [0, 1, 0, 1], [0, 0, 0, 0], [1, 1, 0, 0]],
                                   dtype=bool))
    assert n == 3 and labels[0, 0] == labels[1, 1] != labels[0, 3] != labels[3, 0]
    with_numpy = [ev.analyze_image(x) for x in images]
    assert with_numpy == with_default


def test_score_mode_oracle_and_prompt_ignoring_generators():
    oracle = ev.score_mode(ev.oracle_generator(), "t2i", n=48, batch_size=16)
    assert min(oracle.accuracy.values()) >= 0.98, oracle.summary()
    assert oracle.counts["background"] == 48

    fixed = w.render_image(w.SceneSpec("gray", (w.ObjectSpec("red", "circle", "small",
                                                             "center"),)))

    def ignore_prompts(captions):
        return np.stack([fixed] * len(captions))

    ignorant = ev.score_mode(ignore_prompts, "t2i", n=48)
    assert ignorant.accuracy["background"] <= 0.1
    assert ignorant.accuracy["colour"] <= 0.3
    assert ignorant.accuracy["position"] <= 0.3

    clips = ev.score_mode(ev.oracle_generator(frames=5), "t2v", n=16)
    assert min(clips.accuracy.values()) >= 0.98, clips.summary()
    assert "motion" in clips.accuracy and "motion" in clips.summary()

    with pytest.raises(ValueError):
        ev.score_mode(ignore_prompts, "t2v", n=4)  # images where clips are due


def test_position_axes_tell_a_mirrored_model_from_a_right_one(renders):
    """A generator that puts every object in the mirrored column (left <-> right) keeps its
    rows: the axis split reports rows right and columns wrong wherever the column is not the
    middle one, and both right for true renders."""
    mirror = {"left": "right", "right": "left"}
    specs = renders["t2i"][0][:90]

    def mirrored(spec):
        obj = spec.objects[0]
        words = obj.position.split()
        position = " ".join(mirror.get(word, word) for word in words)
        return dataclasses.replace(spec, objects=(dataclasses.replace(obj, position=position),))

    true_axes = ev.position_axes(ev.evaluate([w.render_image(s) for s in specs], specs))
    assert true_axes["row"] >= 0.98 and true_axes["column"] >= 0.98
    axes = ev.position_axes(ev.evaluate([w.render_image(mirrored(s)) for s in specs], specs))
    middle = np.mean(["left" not in s.objects[0].position and "right" not in s.objects[0].position
                      for s in specs])
    assert axes["row"] >= 0.98
    assert abs(axes["column"] - middle) <= 0.03, (axes, middle)
    assert ev.position_axes(ev.EvalReport({}, {}, {}, [])) == {}


@pytest.mark.parametrize("mode", w.MODES)
def test_unscored_attributes_are_left_out_and_the_rest_still_fail(mode):
    """Free captions (``world.free_eval_prompts``) leave size and/or position unnamed: an
    object drawn at another size or position than the spec's random ones scores full marks
    on what the caption names, fails position where that is scored, and an empty sample
    still fails colour and shape; bad ``unscored`` sets are refused."""
    prompts = w.free_eval_prompts(24, mode, 5)
    specs = [s for _, s, _ in prompts]
    unscored = [u for _, _, u in prompts]
    render = w.render_clip if mode == "t2v" else w.render_image
    rng = np.random.default_rng(0)
    moved = []
    for spec, left_out in zip(specs, unscored, strict=True):  # unnamed ones changed
        obj = spec.objects[0]
        others = [p for p in w.POSITIONS if p != obj.position]
        if "position" in left_out:
            obj = dataclasses.replace(obj, position=str(rng.choice(others)))
        if "size" in left_out:
            obj = dataclasses.replace(obj, size="small" if obj.size == "large" else "large")
        moved.append(dataclasses.replace(spec, objects=(obj,)))
    samples = [render(s) for s in moved]
    free = ev.evaluate(samples, specs, unscored)
    assert min(free.accuracy.values()) >= 0.95, free.summary()
    assert free.counts["position"] == sum("position" not in u for u in unscored) == 8
    assert free.counts["size"] == sum("size" not in u for u in unscored) == 8
    assert free.counts["colour"] == 24
    named = ev.evaluate(samples, specs)  # scoring everything, the moves are caught
    assert named.accuracy["position"] <= 8 / 24 + 0.05 and named.accuracy["size"] <= 8 / 24 + 0.05
    axes = ev.position_axes(free)
    assert axes and min(axes.values()) >= 0.95
    blank = [np.broadcast_to(np.asarray(w.render_background(s.background, 64, 64), np.uint8),
                             np.shape(x)) for s, x in zip(specs, samples, strict=True)]
    empty = ev.evaluate(blank, specs, unscored)
    assert empty.accuracy["colour"] == 0.0 and empty.accuracy["shape"] == 0.0
    assert empty.accuracy["count"] == 0.0
    with pytest.raises(ValueError, match="unscored"):
        ev.evaluate(samples, specs, unscored[:-1])
    with pytest.raises(ValueError, match="unscored"):
        ev.evaluate(samples, specs, [frozenset({"mood"})] * len(specs))
