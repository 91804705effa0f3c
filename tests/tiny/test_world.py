"""The tiny synthetic world: vocabulary, rendering, held-out split, captions, datasets."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from studio.tiny import world as w


def _one(colour="red", shape="star", size="small", position="top left", motion="still",
         background="grass", video=False) -> w.SceneSpec:
    return w.SceneSpec(background, (w.ObjectSpec(colour, shape, size, position, motion),), video)


def _model_distance(colour: str, background: str, height: int = 64) -> float:
    """Smallest RGB distance from an object colour to any colour the background model takes."""
    c = np.asarray(w.COLOURS[colour], np.float64)
    best = np.inf
    for p0, p1 in w.background_segments(background, height, height):
        p0 = np.asarray(p0, np.float64).reshape(-1, 3)
        p1 = np.asarray(p1, np.float64).reshape(-1, 3)
        v = p1 - p0
        vv = np.sum(v * v, axis=1)
        t = np.where(vv > 0, np.clip(np.sum((c - p0) * v, axis=1) / np.maximum(vv, 1e-9), 0, 1), 0)
        best = min(best, float(np.min(np.linalg.norm(c - (p0 + t[:, None] * v), axis=1))))
    return best


def test_vocabulary():
    assert len(w.COLOURS) == 8 and len(w.SHAPES) == 4 and len(w.SIZES) == 2
    assert len(w.POSITIONS) == 9 and set(w.POSITION_XY) == set(w.POSITIONS)
    assert len(w.BACKGROUNDS) == 10 and len(w.TEXTURED_BACKGROUNDS) >= 3
    assert set(w.MOTIONS) == {"left", "right", "up", "down", "growing", "shrinking", "still"}
    assert abs(w.SIZE_FRACTIONS["small"] - 1 / 6) < 0.02
    assert abs(w.SIZE_FRACTIONS["large"] - 1 / 3) < 0.04


def test_excluded_pairs_are_exactly_the_low_contrast_ones():
    for colour in w.COLOURS:
        for background in w.BACKGROUNDS:
            d = _model_distance(colour, background)
            if w.is_allowed(colour, background):
                assert d >= w.MIN_CONTRAST, (colour, background, d)
            else:
                assert d < w.MIN_CONTRAST, (colour, background, d)
    assert len(w.EXCLUDED_PAIRS) == 7


def test_spec_validation():
    with pytest.raises(ValueError):
        w.ObjectSpec("brown", "star", "small", "top")
    with pytest.raises(ValueError):
        w.ObjectSpec("red", "star", "medium", "top")
    with pytest.raises(ValueError):
        _one(motion="left", video=False)  # an image cannot move
    with pytest.raises(ValueError):
        w.SceneSpec("grass", ())
    with pytest.raises(ValueError):
        _one(background="desert")


def test_render_image_and_clip_shapes_and_determinism():
    spec = _one(background="night sky", motion="right", video=True)
    img = w.render_image(spec)
    assert img.dtype == np.uint8 and img.shape == (64, 64, 3)
    assert np.array_equal(img, w.render_image(spec))  # same spec, same pixels
    a = w.render_image(spec, 48, 80, rng=np.random.default_rng(3))
    b = w.render_image(spec, 48, 80, rng=np.random.default_rng(3))
    assert a.shape == (48, 80, 3) and np.array_equal(a, b)
    clip = w.render_clip(spec)
    assert clip.dtype == np.uint8 and clip.shape == (9, 64, 64, 3)
    assert np.array_equal(clip[4], img)  # the middle frame is the image
    assert not np.array_equal(clip[0], clip[-1])
    still = w.render_clip(_one(background="brick", motion="still", video=True), 5, 32, 40)
    assert still.shape == (5, 32, 40, 3)
    assert all(np.array_equal(still[0], f) for f in still[1:])


@pytest.mark.parametrize("background", w.BACKGROUNDS)
def test_backgrounds_follow_their_colour_model(background):
    img = w.render_background(background, 64, 64, np.random.default_rng(0))
    assert img.shape == (64, 64, 3) and img.dtype == np.float32
    dist = np.full((64, 64), np.inf)
    for p0, p1 in w.background_segments(background, 64, 64):
        v = p1 - p0
        vv = np.sum(v * v, axis=-1, keepdims=True)
        t = np.where(vv > 0, np.clip(np.sum((img - p0) * v, axis=-1, keepdims=True)
                                     / np.maximum(vv, 1e-9), 0, 1), 0)
        dist = np.minimum(dist, np.linalg.norm(img - (p0 + t * v), axis=-1))
    off_model = dist > 1.0
    if background == "night sky":  # only the one-pixel stars, never two side by side
        assert 5 <= off_model.sum() <= 64
        ys, xs = np.nonzero(off_model)
        gaps = np.maximum(np.abs(ys[:, None] - ys), np.abs(xs[:, None] - xs))
        assert np.min(gaps + 99 * np.eye(len(ys))) >= 6
    else:
        assert not off_model.any()
    if background in w.TEXTURED_BACKGROUNDS:
        assert img.std(axis=(0, 1)).max() > 5  # not a flat colour


@pytest.mark.parametrize("size", w.SIZES)
@pytest.mark.parametrize("res", [64, 128])
def test_object_size_and_position_scale_with_resolution(size, res):
    img = w.render_image(_one("black", "circle", size, "bottom right", background="white"),
                         res, res).astype(float)
    mask = img.mean(axis=-1) < 128
    ys, xs = np.nonzero(mask)
    width = (xs.max() - xs.min() + 1) / res
    assert abs(width - w.SIZE_FRACTIONS[size]) < 0.03
    assert abs(xs.mean() / res - 0.75) < 0.02 and abs(ys.mean() / res - 0.75) < 0.02
    edge = (img.mean(axis=-1) > 40) & (img.mean(axis=-1) < 220)
    assert edge.any()  # antialiased rim


def test_motion_geometry():
    times = w.frame_times(9)
    assert times[0] == -0.5 and times[-1] == 0.5 and times[4] == 0
    def state(motion, t):
        return w.object_state(w.ObjectSpec("red", "square", "large", "center", motion), t,
                              64, 64)
    assert state("left", 0.5)[0] - state("left", -0.5)[0] == pytest.approx(-0.18 * 64)
    assert state("down", 0.5)[1] - state("down", -0.5)[1] == pytest.approx(0.18 * 64)
    assert state("growing", 0.5)[2] / state("growing", -0.5)[2] == pytest.approx(w.GROWTH)
    assert state("shrinking", 0.5)[2] / state("shrinking", -0.5)[2] == pytest.approx(1 / w.GROWTH)
    assert state("still", 0.5) == state("still", -0.5) == state("up", 0.0)


def test_holdout_split():
    held, train = w.held_out_triples(), w.train_triples()
    assert 0.08 <= len(held) / (len(held) + len(train)) <= 0.12
    assert not set(held) & set(train)
    assert {c for c, _, _ in held} == set(w.COLOURS)
    assert {s for _, s, _ in held} == set(w.SHAPES)
    assert {b for _, _, b in held} == set(w.BACKGROUNDS)
    assert all(w.is_allowed(c, b) for c, _, b in held)
    # Every pair still occurs in training: held-out triples are new combinations only.
    assert {(c, s) for c, s, _ in train} == {(c, s) for c in w.COLOURS for s in w.SHAPES}
    assert {(s, b) for _, s, b in train} == {(s, b) for s in w.SHAPES for b in w.BACKGROUNDS}
    assert {(c, b) for c, _, b in train} == {(c, b) for c in w.COLOURS for b in w.BACKGROUNDS
                                             if w.is_allowed(c, b)}


def test_sample_scene_train_never_yields_held_out_and_eval_only_does():
    rng = np.random.default_rng(0)
    two = 0
    for i in range(1500):
        spec = w.sample_scene(rng, video=bool(i % 2), split="train")
        assert spec.video == bool(i % 2)
        for obj in spec.objects:
            assert w.is_allowed(obj.colour, spec.background)
            assert not w.is_held_out(obj.colour, obj.shape, spec.background)
            assert spec.video or obj.motion == "still"
        if len(spec.objects) == 2:
            two += 1
            a, b = spec.objects
            assert a.colour != b.colour and a.position != b.position
            assert w._boxes_apart(a, b)
    assert 300 < two < 700
    held = set(w.held_out_triples())
    for _ in range(200):
        spec = w.sample_scene(rng, video=True, split="eval")
        (obj,) = spec.objects
        assert (obj.colour, obj.shape, spec.background) in held
    with pytest.raises(ValueError):
        w.sample_scene(rng, split="test")


def test_caption_round_trip_vocabulary_and_variety():
    rng = np.random.default_rng(1)
    captions = []
    for i in range(1500):
        spec = w.sample_scene(rng, video=bool(i % 2), split="train" if i % 5 else "eval")
        text = w.caption(spec, rng)
        assert w.parse_caption(text) == spec, text
        assert set(text.replace(",", " ").replace(":", " ").split()) <= w.VOCABULARY, text
        captions.append(text)
    assert len(set(captions)) > 1400
    spec = _one(video=True, motion="up")
    variants = {w.caption(spec, np.random.default_rng(s)) for s in range(60)}
    assert len(variants) >= 30
    assert all(w.parse_caption(v) == spec for v in variants)


@pytest.mark.parametrize("text, expected", [
    ("a small red star in the top left corner on a grass background",
     _one("red", "star", "small", "top left", background="grass")),
    ("A Small RED star, top-left corner, on a grass background.",
     _one("red", "star", "small", "top left", background="grass")),
    ("a big blue circle in the center slides to the right across a night sky",
     _one("blue", "circle", "large", "center", "right", "night sky", video=True)),
    ("a tiny violet triangle at the bottom stays still against a starry sky",
     _one("purple", "triangle", "small", "bottom", "still", "night sky", video=True)),
    ("two shapes: a small red star at the top left and a large blue circle on the right, "
     "on a grey background",
     w.SceneSpec("gray", (w.ObjectSpec("red", "star", "small", "top left"),
                          w.ObjectSpec("blue", "circle", "large", "right")))),
    ("a large white square in the lower right grows; a small black circle at the top rises, "
     "on a beige backdrop",
     w.SceneSpec("beige", (w.ObjectSpec("white", "square", "large", "bottom right", "growing"),
                           w.ObjectSpec("black", "circle", "small", "top", "up")), True)),
])
def test_parse_caption_examples(text, expected):
    assert w.parse_caption(text) == expected


@pytest.mark.parametrize("text", [
    "a red star on a grass background",  # no size, no position
    "a small red star in the center",  # no background
    "a small red blue star in the center on a grass background",  # two colours
    "on a white background",  # no object
])
def test_parse_caption_rejects_incomplete(text):
    with pytest.raises(ValueError):
        w.parse_caption(text)


@pytest.mark.parametrize("mode", w.MODES)
def test_eval_prompts(mode):
    prompts = w.eval_prompts(mode=mode)
    assert len(prompts) >= 200
    assert prompts == w.eval_prompts(mode=mode, seed=0)
    assert prompts != w.eval_prompts(mode=mode, seed=1)
    held = set(w.held_out_triples())
    seen = set()
    for text, spec in prompts:
        (obj,) = spec.objects
        seen.add((obj.colour, obj.shape, spec.background))
        assert spec.video == (mode == "t2v")
        assert w.parse_caption(text) == spec
    assert seen == held  # every held-out triple is asked for
    motions = {s.objects[0].motion for _, s in prompts}
    assert motions == (set(w.MOTIONS) if mode == "t2v" else {"still"})
    with pytest.raises(ValueError):
        w.eval_prompts(10, "i2v")


def test_batches():
    images = w.batches(np.random.default_rng(0), 4, height=32, width=48)
    caps, pixels = next(images)
    assert len(caps) == 4 and all(isinstance(c, str) for c in caps)
    assert pixels.dtype == np.uint8 and pixels.shape == (4, 32, 48, 3)
    caps, pixels = next(w.batches(np.random.default_rng(0), 3, video=True, frames=5))
    assert pixels.shape == (3, 5, 64, 64, 3)
    assert all(w.parse_caption(c).video for c in caps)
    again = next(w.batches(np.random.default_rng(0), 3, video=True, frames=5))
    assert again[0] == caps and np.array_equal(again[1], pixels)


def test_import_is_light():
    code = ("import sys; import studio.tiny.world, studio.tiny.evaluate; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_gradient_tilt_turns_the_sky_gradient_for_the_block_only():
    """Inside ``gradient_tilt(0.0)`` the sky changes across the width only; after it the
    module's tilt (most of the change down the height) is back, and a bad tilt is refused."""
    before = w.GRADIENT_TILT
    with w.gradient_tilt(0.0):
        sky = w.render_background("sky", 32, 32)
        assert np.abs(np.diff(sky, axis=0)).max() == 0  # no change down the height
        assert np.abs(np.diff(sky, axis=1)).max() > 0
    assert w.GRADIENT_TILT == before
    sky = w.render_background("sky", 32, 32)
    down = np.abs(sky[-1] - sky[0]).mean()
    across = np.abs(sky[:, -1] - sky[:, 0]).mean()
    assert down > across > 0
    with pytest.raises(ValueError, match="gradient tilt"):
        with w.gradient_tilt(1.2):
            pass
    assert w.GRADIENT_TILT == before


def test_motion_distance_lengthens_the_travel_for_the_block_only():
    """Inside ``motion_distance(0.36)`` a clip's object travels twice as far, and the
    evaluator reads that travel from the pixels; after the block the world's distance is
    back, and a distance outside [0, 0.5] is refused."""
    from studio.tiny import evaluate

    before = w.MOTION_DISTANCE
    spec = w.SceneSpec(background="white", objects=(
        w.ObjectSpec("red", "circle", "small", "center", "right"),), video=True)

    def travel() -> float:
        clip = w.render_clip(spec, 9, 64, 64, np.random.default_rng(0))
        (obj,) = evaluate.analyze_clip(clip).objects
        assert obj.motion == "right"
        return obj.motion_features[0]

    normal = travel()
    with w.motion_distance(2 * before):
        assert w.MOTION_DISTANCE == 2 * before
        longer = travel()
    assert w.MOTION_DISTANCE == before
    assert longer == pytest.approx(2 * normal, rel=0.15)
    with pytest.raises(ValueError, match="motion distance"):
        with w.motion_distance(0.6):
            pass
    assert w.MOTION_DISTANCE == before


def test_free_captions_leave_out_size_and_position_and_say_so():
    """The grammar's free forms (issue 3's own example, "a blue circle slides to the right
    across a night sky", names neither size nor position): every unnamed set round-trips
    through ``unnamed_attributes``, ``parse_caption`` refuses them, the words stay in the
    vocabulary, and the default draws the same captions as before."""
    rng = np.random.default_rng(3)
    seen = set()
    for i in range(600):
        spec = w.sample_scene(rng, video=bool(i % 2))
        if len(spec.objects) != 1:
            continue
        unnamed = [frozenset(), frozenset({"size"}), frozenset({"position"}),
                   w.UNNAMEABLE][i % 4]
        text = w.caption(spec, rng, unnamed=unnamed)
        assert w.unnamed_attributes(text) == unnamed, text
        assert set(text.replace(",", " ").split()) <= w.VOCABULARY, text
        if unnamed:
            with pytest.raises(ValueError):
                w.parse_caption(text)
        else:
            assert w.parse_caption(text) == spec
        seen.add(unnamed)
    assert len(seen) == 4
    assert w.unnamed_attributes("a blue circle slides to the right across a night sky") == \
        w.UNNAMEABLE
    assert w.unnamed_attributes("an orange square on a grass background") == w.UNNAMEABLE
    assert w.unnamed_attributes("a red star on the left on a grass background") == {"size"}
    assert w.unnamed_attributes("a big red star moves up on a grass background") == \
        {"position"}
    spec = _one(video=True, motion="up")
    assert [w.caption(spec, np.random.default_rng(s)) for s in range(20)] == \
        [w.caption(spec, np.random.default_rng(s), unnamed=set()) for s in range(20)]


@pytest.mark.parametrize("text", [
    "a red star",  # no background
    "a red blue star on a grass background",  # two colours
    "a star on a grass background",  # no colour: only size and position may be left out
    "a red star and a blue circle on a grass background",  # two objects
])
def test_unnamed_attributes_rejects_what_parse_caption_cannot_repair(text):
    with pytest.raises(ValueError):
        w.unnamed_attributes(text)


def test_caption_refuses_bad_unnamed_sets():
    two = w.SceneSpec("gray", (w.ObjectSpec("red", "star", "small", "top left"),
                               w.ObjectSpec("blue", "circle", "large", "right")))
    with pytest.raises(ValueError, match="only a one-object caption"):
        w.caption(two, np.random.default_rng(0), unnamed={"size"})
    with pytest.raises(ValueError, match="cannot be left out"):
        w.caption(_one(), np.random.default_rng(0), unnamed={"colour"})


def test_the_denoiser_trains_on_free_captions_at_its_share():
    """DenoiserTask.caption: at share 1 every one-object caption is a free one (size,
    position or both left out, each kind drawn), two-object captions name everything; at
    share 0 it draws exactly world.caption's captions; a share outside [0, 1] is refused."""
    import torch

    from studio.tiny.denoiser import DenoiserTask
    from studio.tiny.train import main

    task = DenoiserTask.__new__(DenoiserTask)
    rng = np.random.default_rng(5)
    specs = [w.sample_scene(rng, video=bool(i % 2)) for i in range(300)]
    a, b = np.random.default_rng(9), np.random.default_rng(9)
    assert [task.caption(s, a) for s in specs] == [w.caption(s, b) for s in specs]
    task.free_caption_share = 1.0
    kinds = []
    for spec in specs:
        text = task.caption(spec, rng)
        kinds.append(w.unnamed_attributes(text))
        assert bool(kinds[-1]) == (len(spec.objects) == 1), text
    assert set(kinds) - {frozenset()} == set(DenoiserTask.FREE_CAPTION_KINDS)
    with pytest.raises(ValueError, match="free_caption_share"):
        DenoiserTask(torch.device("cpu"), None, free_caption_share=1.5)
    with pytest.raises(SystemExit):
        main(["dit", "--out", "/nonexistent/run", "--free-caption-share", "-0.1"])


@pytest.mark.parametrize("mode", w.MODES)
def test_free_eval_prompts_are_held_out_and_leave_out_what_they_say(mode):
    """``free_eval_prompts``: held-out triples only, each caption leaves out exactly its
    ``unnamed`` set (all three kinds, in turn), names the spec's other attributes, and the
    named prompts of ``eval_prompts`` are not disturbed (another random stream)."""
    before = w.eval_prompts(12, mode, 3)
    prompts = w.free_eval_prompts(30, mode, 3)
    assert w.eval_prompts(12, mode, 3) == before
    assert w.free_eval_prompts(30, mode, 3) == prompts
    assert len(prompts) == 30
    held_out = set(w.held_out_triples())
    for i, (text, spec, unnamed) in enumerate(prompts):
        obj = spec.objects[0]
        assert len(spec.objects) == 1 and spec.video == (mode == "t2v")
        assert (obj.colour, obj.shape, spec.background) in held_out
        assert unnamed == w.FREE_EVAL_UNNAMED[i % 3]
        assert w.unnamed_attributes(text) == unnamed, text
        # with stand-ins for the unnamed words, the caption reads as the spec's scene
        repaired = re.sub(rf"\b{obj.shape}\b", ("small " if "size" in unnamed else "")
                          + obj.shape + (" in the center" if "position" in unnamed else ""),
                          text, count=1)
        read = w.parse_caption(repaired)
        assert read.background == spec.background, text
        got = read.objects[0]
        assert (got.colour, got.shape, got.motion) == (obj.colour, obj.shape, obj.motion), text
        assert "size" in unnamed or got.size == obj.size, text
        assert "position" in unnamed or got.position == obj.position, text
    with pytest.raises(ValueError, match="mode"):
        w.free_eval_prompts(4, "x2y")
    with pytest.raises(ValueError, match="n: -1"):
        w.free_eval_prompts(-1, mode)
