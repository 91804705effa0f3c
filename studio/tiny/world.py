"""A tiny procedural world of coloured shapes, to train and check a tiny text-to-image/video model.

Everything here is numpy only (no torch), deterministic given a seed, and free of side effects
at import. Images are ``uint8`` arrays ``(H, W, 3)`` (RGB), clips ``uint8`` arrays
``(F, H, W, 3)``.

World
=====

* Object colours (``COLOURS``, fixed sRGB values): red, orange, yellow, green, blue, purple,
  white, black.
* Shapes (``SHAPES``): circle, square, triangle (pointing up), star (five points, pointing up).
  All shapes are axis aligned and antialiased (4x4 supersampling).
* Sizes (``SIZES``): small and large. The *extent* of an object is ``SIZE_FRACTIONS[size]``
  (0.16 and 0.30) times ``min(H, W)``: a circle's diameter, about a square's side (0.88x), a
  triangle's base (1.1x), a star's width (1.14x).
* Positions (``POSITIONS``): a 3x3 grid, "top left", "top", "top right", "left", "center",
  "right", "bottom left", "bottom", "bottom right"; the object's bounding-box centre sits at
  0.25, 0.5 or 0.75 of the width and of the height (``POSITION_XY``).
* Backgrounds (``BACKGROUNDS``), 10 of them: six solid colours (white, black, gray, beige, pink,
  teal) and four textured ones: "sky" (a diagonal blue gradient, lighter towards the bottom
  right: ``GRADIENT_TILT`` of the change runs along the height, the rest along the width),
  "grass" (green with darker and lighter vertical blades), "brick" (red bricks in a running
  bond, dark mortar lines) and "night sky" (a dark blue gradient, tilted the same way, sprinkled with
  one-pixel stars at least 6 pixels apart). ``background_segments`` describes each as the
  colour model the evaluator uses (segments in RGB space, per pixel).
* Colour/background pairs that would be hard to see are never generated (``EXCLUDED_PAIRS``):
  a white object on white, black on black, green on grass, blue on sky, red on brick, black
  on brick (dark mortar) and black on night sky. Every other pair is at least
  ``MIN_CONTRAST`` (80) apart in RGB, measured against the nearest colour the background can
  take anywhere.
* One or two objects per scene; two objects always have different colours, different
  positions and bounding boxes at least ``MIN_GAP`` (0.06 of the side) apart in every frame.
* Clips (``render_clip``) add a motion per object (``MOTIONS``): "left", "right", "up",
  "down" (the centre travels ``MOTION_DISTANCE`` = 0.18 of the width/height over the clip),
  "growing", "shrinking" (the extent changes by a factor ``GROWTH`` = 1.8 over the clip) and
  "still". The spec's position and size describe the *middle* of the clip; frame ``f`` of
  ``F`` is at time ``u = f / (F - 1) - 0.5`` (see ``frame_times``).

Held-out combinations
=====================

About 10 % of the allowed (colour, shape, background) triples are held out by a fixed hash
(``is_held_out``, ``held_out_triples``): ``sample_scene(split="train")`` never yields a scene in
which any object forms a held-out triple with the background, while every (colour, shape),
(colour, background) and (shape, background) pair still occurs in training.
``sample_scene(split="eval")`` and ``eval_prompts`` yield single-object scenes built only from
held-out triples, so they measure compositional generalisation.

Caption grammar
===============

Captions are lower-case English. ``caption`` picks a template and synonyms at random;
``parse_caption`` inverts every caption it can produce (it is keyword based, so it is lenient
with word order and punctuation)::

    caption      := single | double | free
    single(img)  := NP POS BG | PREFIX NP POS BG | BG "," NP VERB POS | NP BG "," POS
    single(clip) := NP POS MOTION BG | VPREFIX NP POS "that" MOTION BG
                  | BG "," NP POS MOTION | NP MOTION BG "," POS
    free(img)    := FNP [POS] BG | PREFIX FNP [POS] BG | BG "," FNP [POS]
    free(clip)   := FNP [POS] MOTION BG | VPREFIX FNP [POS] "that" MOTION BG
                  | BG "," FNP [POS] MOTION
    FNP          := NP | ("a" | "an") COLOUR SHAPE      (size left out)
    double       := LEAD OBJ "and" OBJ "," BG | OBJ "and" OBJ BG | BG "," OBJ "and" OBJ
    OBJ          := NP POS            (images)   |  NP POS MOTION   (clips)
    NP           := "a" SIZE COLOUR SHAPE
    SIZE         := small: "small" | "little" | "tiny"      large: "large" | "big"
    COLOUR       := red | orange | yellow | green | blue | purple | "violet" (= purple)
                  | white | black
    SHAPE        := circle | square | triangle | star
    POS          := corners: "in the top left corner" | "at the top left" | "in the upper left
                    corner" | "in the top left" (and the same for top right, bottom left,
                    bottom right; "lower" = bottom)
                    edges: "at the top" | "near the top" | "at the top of the frame"
                    | "along the top edge" (bottom alike) | "on the left" | "on the left side"
                    | "near the left edge" | "at the left" (right alike)
                    center: "in the center" | "in the middle" | "in the centre" | "at the center"
    MOTION       := left: "moves to the left" | "slides to the left" | "slides left"
                    | "drifts leftward" (right alike)
                    up: "moves up" | "rises" | "floats upward" | "drifts up"
                    down: "moves down" | "sinks" | "falls" | "drifts down"
                    growing: "grows" | "grows larger" | "gets bigger" | "expands"
                    shrinking: "shrinks" | "gets smaller" | "contracts" | "becomes smaller"
                    still: "stays still" | "stays in place" | "does not move" | "sits still"
    BG           := solid C (C in white, black, gray/grey, beige, pink, teal):
                    "on a C background" | "against a C background" | "on a plain C background"
                    | "over a C backdrop"
                    sky: "against a blue sky" | "in a clear blue sky" | "on a sky background"
                    | "across a blue sky"
                    grass: "on a grass background" | "on green grass" | "on a grassy field"
                    | "over the grass"
                    brick: "against a brick wall" | "on a brick background"
                    | "in front of a red brick wall" | "on a brick wall"
                    night sky: "against a starry night sky" | "on a night sky background"
                    | "in the night sky" | "across a dark night sky"
    PREFIX       := "a picture of" | "an image of" | "a drawing of"
    VPREFIX      := "a video of" | "a clip of" | "an animation of"
    VERB         := "sits" | "is" | "appears" | "rests"
    LEAD         := "two shapes:" | "two objects:" | PREFIX | VPREFIX (clips)

The ``free`` forms (``caption(..., unnamed=...)``, at least one of size and position left
out; one object only) describe a scene at any size or position: "a blue circle slides to
the right across a night sky". ``parse_caption`` refuses them and ``unnamed_attributes``
says what they leave out; the default captions and the evaluation prompts name everything.

A caption describes a clip exactly when it contains a MOTION phrase (a clip of still objects
says "stays still"). ``VOCABULARY`` lists every word a caption can contain.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

# --------------------------------------------------------------------------- vocabulary

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "orange": (250, 140, 0),
    "yellow": (250, 225, 30),
    "green": (30, 160, 50),
    "blue": (30, 70, 220),
    "purple": (140, 40, 190),
    "white": (245, 245, 245),
    "black": (20, 20, 20),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "star")
SIZES: tuple[str, ...] = ("small", "large")
#: Object extent as a fraction of ``min(H, W)``.
SIZE_FRACTIONS: dict[str, float] = {"small": 0.16, "large": 0.30}
POSITIONS: tuple[str, ...] = (
    "top left", "top", "top right",
    "left", "center", "right",
    "bottom left", "bottom", "bottom right",
)
#: Bounding-box centre of each position as (x, y) fractions of (W, H); y grows downwards.
POSITION_XY: dict[str, tuple[float, float]] = {
    "top left": (0.25, 0.25), "top": (0.5, 0.25), "top right": (0.75, 0.25),
    "left": (0.25, 0.5), "center": (0.5, 0.5), "right": (0.75, 0.5),
    "bottom left": (0.25, 0.75), "bottom": (0.5, 0.75), "bottom right": (0.75, 0.75),
}
MOTIONS: tuple[str, ...] = ("left", "right", "up", "down", "growing", "shrinking", "still")
#: Distance travelled over a clip by a moving object, as a fraction of the width (left/right)
#: or height (up/down).
MOTION_DISTANCE = 0.18
#: Ratio of last-frame to first-frame extent of a growing object (inverse for shrinking).
GROWTH = 1.8

SOLID_BACKGROUNDS: dict[str, tuple[int, int, int]] = {
    "white": (250, 250, 250),
    "black": (12, 12, 12),
    "gray": (128, 128, 128),
    "beige": (215, 190, 140),
    "pink": (240, 150, 190),
    "teal": (0, 128, 128),
}
TEXTURED_BACKGROUNDS: tuple[str, ...] = ("sky", "grass", "brick", "night sky")
BACKGROUNDS: tuple[str, ...] = (*SOLID_BACKGROUNDS, *TEXTURED_BACKGROUNDS)

_SKY = ((70, 130, 215), (160, 200, 240))  # top-left and bottom-right colours
_NIGHT = ((10, 15, 55), (45, 35, 110))
_GRASS_BASE = (75, 135, 45)
_GRASS_DARK = (50, 105, 30)  # the base is the midpoint of dark and light
_GRASS_LIGHT = (100, 165, 60)
_BRICK = (175, 65, 45)
_MORTAR = (75, 45, 35)

#: Smallest RGB distance between an object colour and any colour its background can take.
MIN_CONTRAST = 80.0
#: (object colour, background) pairs never generated, because they are too alike.
EXCLUDED_PAIRS: frozenset[tuple[str, str]] = frozenset({
    ("white", "white"), ("black", "black"), ("green", "grass"), ("blue", "sky"),
    ("red", "brick"), ("black", "brick"), ("black", "night sky"),
})
#: Smallest gap between the bounding boxes of two objects, as a fraction of the side.
MIN_GAP = 0.06

#: Salt of the held-out hash; this one holds out 29 of the 292 allowed triples (9.9 %), with
#: every colour, shape and background in some held-out triple.
HOLDOUT_SALT = "tiny-world/holdout/v59"
HOLDOUT_PER_MILLE = 100

SPLITS = ("train", "eval")
MODES = ("t2i", "t2v")


# --------------------------------------------------------------------------- specs

@dataclass(frozen=True)
class ObjectSpec:
    """One object: canonical attribute names from ``COLOURS``, ``SHAPES``, ``SIZES``,
    ``POSITIONS`` and ``MOTIONS`` (images use ``motion="still"``)."""

    colour: str
    shape: str
    size: str
    position: str
    motion: str = "still"

    def __post_init__(self) -> None:
        for value, allowed, what in ((self.colour, COLOURS, "colour"),
                                     (self.shape, SHAPES, "shape"),
                                     (self.size, SIZES, "size"),
                                     (self.position, POSITIONS, "position"),
                                     (self.motion, MOTIONS, "motion")):
            if value not in allowed:
                raise ValueError(f"unknown {what} {value!r}")


@dataclass(frozen=True)
class SceneSpec:
    """A scene: a background, one or two objects, and whether it is a clip.

    For an image (``video=False``) every object's motion must be ``"still"``.
    """

    background: str
    objects: tuple[ObjectSpec, ...]
    video: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "objects", tuple(self.objects))
        if self.background not in BACKGROUNDS:
            raise ValueError(f"unknown background {self.background!r}")
        if not 1 <= len(self.objects) <= 2:
            raise ValueError("a scene has one or two objects")
        if not self.video and any(o.motion != "still" for o in self.objects):
            raise ValueError("an image scene cannot have moving objects")


# --------------------------------------------------------------------------- combinations

def is_allowed(colour: str, background: str) -> bool:
    """Whether an object of ``colour`` may appear on ``background`` (see ``EXCLUDED_PAIRS``)."""
    return (colour, background) not in EXCLUDED_PAIRS


def is_held_out(colour: str, shape: str, background: str) -> bool:
    """Whether the (colour, shape, background) triple is reserved for evaluation.

    A fixed hash of the triple (salted with ``HOLDOUT_SALT``) selects about
    ``HOLDOUT_PER_MILLE`` per mille of the allowed triples. Excluded pairs are never held out.
    """
    if not is_allowed(colour, background):
        return False
    digest = hashlib.sha256(f"{HOLDOUT_SALT}:{colour}:{shape}:{background}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % 1000 < HOLDOUT_PER_MILLE


@lru_cache(maxsize=1)
def held_out_triples() -> tuple[tuple[str, str, str], ...]:
    """All held-out (colour, shape, background) triples, in vocabulary order."""
    return tuple((c, s, b) for b in BACKGROUNDS for c in COLOURS for s in SHAPES
                 if is_held_out(c, s, b))


@lru_cache(maxsize=1)
def train_triples() -> tuple[tuple[str, str, str], ...]:
    """All (colour, shape, background) triples that training scenes may use."""
    return tuple((c, s, b) for b in BACKGROUNDS for c in COLOURS for s in SHAPES
                 if is_allowed(c, b) and not is_held_out(c, s, b))


# --------------------------------------------------------------------------- geometry

_SQUARE_HALF = 0.44
_TRI_BASE = 1.1
_TRI_HEIGHT = _TRI_BASE * math.sqrt(3.0) / 2.0
_STAR_OUTER = 0.6
_STAR_INNER = 0.42  # inner radius / outer radius
_COS36 = math.cos(math.radians(36.0))
_SIN72 = math.sin(math.radians(72.0))


def shape_half_extents(shape: str) -> tuple[float, float]:
    """Half width and half height of a shape's bounding box, in units of its extent."""
    if shape == "circle":
        return 0.5, 0.5
    if shape == "square":
        return _SQUARE_HALF, _SQUARE_HALF
    if shape == "triangle":
        return _TRI_BASE / 2.0, _TRI_HEIGHT / 2.0
    if shape == "star":
        return _STAR_OUTER * _SIN72, _STAR_OUTER * (1.0 + _COS36) / 2.0
    raise ValueError(f"unknown shape {shape!r}")


def _star_vertices(cx: float, cy: float, extent: float) -> np.ndarray:
    outer = _STAR_OUTER * extent
    centre_y = cy + outer * (1.0 - _COS36) / 2.0  # so that the bounding box is centred on cy
    k = np.arange(10)
    angle = -np.pi / 2.0 + k * np.pi / 5.0
    radius = np.where(k % 2 == 0, outer, outer * _STAR_INNER)
    return np.stack([cx + radius * np.cos(angle), centre_y + radius * np.sin(angle)], axis=1)


def _inside(shape: str, x: np.ndarray, y: np.ndarray, cx: float, cy: float,
            extent: float) -> np.ndarray:
    if shape == "circle":
        return (x - cx) ** 2 + (y - cy) ** 2 <= (extent / 2.0) ** 2
    if shape == "square":
        half = _SQUARE_HALF * extent
        return (np.abs(x - cx) <= half) & (np.abs(y - cy) <= half)
    if shape == "triangle":
        height = _TRI_HEIGHT * extent
        top = cy - height / 2.0
        depth = y - top
        return (depth >= 0) & (depth <= height) & (
            np.abs(x - cx) <= depth * (_TRI_BASE * extent / 2.0) / height)
    if shape == "star":
        verts = _star_vertices(cx, cy, extent)
        inside = np.zeros(np.broadcast_shapes(x.shape, y.shape), dtype=bool)
        for i in range(len(verts)):
            x1, y1 = verts[i]
            x2, y2 = verts[(i + 1) % len(verts)]
            if y1 == y2:
                continue
            crosses = (y1 > y) != (y2 > y)
            inside ^= crosses & (x < (x2 - x1) * (y - y1) / (y2 - y1) + x1)
        return inside
    raise ValueError(f"unknown shape {shape!r}")


def shape_coverage(shape: str, cx: float, cy: float, extent: float, height: int, width: int,
                   *, supersample: int = 4) -> np.ndarray:
    """Antialiased coverage of one shape on a ``height x width`` pixel grid.

    Args:
        shape: one of ``SHAPES``.
        cx, cy: bounding-box centre in pixels (pixel ``(i, j)`` spans ``[j, j+1] x [i, i+1]``).
        extent: the shape's extent in pixels (see the module docstring).
        height, width: grid size in pixels.
        supersample: samples per pixel along each axis.
    Returns:
        float32 array ``(height, width)`` of coverage fractions in [0, 1].
    """
    out = np.zeros((height, width), dtype=np.float32)
    hx, hy = shape_half_extents(shape)
    x0 = max(0, int(math.floor(cx - hx * extent)) - 1)
    x1 = min(width, int(math.ceil(cx + hx * extent)) + 1)
    y0 = max(0, int(math.floor(cy - hy * extent)) - 1)
    y1 = min(height, int(math.ceil(cy + hy * extent)) + 1)
    if x1 <= x0 or y1 <= y0 or extent <= 0:
        return out
    s = supersample
    xs = x0 + (np.arange((x1 - x0) * s) + 0.5) / s
    ys = y0 + (np.arange((y1 - y0) * s) + 0.5) / s
    inside = _inside(shape, xs[None, :], ys[:, None], cx, cy, extent)
    cov = inside.reshape(y1 - y0, s, x1 - x0, s).mean(axis=(1, 3))
    out[y0:y1, x0:x1] = cov
    return out


def frame_times(frames: int) -> np.ndarray:
    """Clip time of each frame: float64 ``(frames,)``, evenly from -0.5 to 0.5 (0 if one)."""
    if frames <= 1:
        return np.zeros(max(frames, 0))
    return np.linspace(-0.5, 0.5, frames)


def object_state(obj: ObjectSpec, t: float, height: int, width: int) -> tuple[float, float, float]:
    """Where an object is at clip time ``t`` (in [-0.5, 0.5]; 0 is the middle and images).

    Returns:
        ``(cx, cy, extent)`` in pixels: bounding-box centre and extent.
    """
    fx, fy = POSITION_XY[obj.position]
    extent = SIZE_FRACTIONS[obj.size] * min(height, width)
    if obj.motion == "left":
        fx -= MOTION_DISTANCE * t
    elif obj.motion == "right":
        fx += MOTION_DISTANCE * t
    elif obj.motion == "up":
        fy -= MOTION_DISTANCE * t
    elif obj.motion == "down":
        fy += MOTION_DISTANCE * t
    elif obj.motion == "growing":
        extent *= GROWTH ** t
    elif obj.motion == "shrinking":
        extent *= GROWTH ** (-t)
    return fx * width, fy * height, extent


def _boxes_apart(a: ObjectSpec, b: ObjectSpec, gap: float = MIN_GAP) -> bool:
    """Whether two objects' bounding boxes stay ``gap`` apart (unit square) over a clip."""
    for t in frame_times(9):
        boxes = []
        for obj in (a, b):
            cx, cy, e = object_state(obj, float(t), 1, 1)
            hx, hy = shape_half_extents(obj.shape)
            boxes.append((cx - hx * e, cx + hx * e, cy - hy * e, cy + hy * e))
        (ax0, ax1, ay0, ay1), (bx0, bx1, by0, by1) = boxes
        if max(bx0 - ax1, ax0 - bx1, by0 - ay1, ay0 - by1) < gap:
            return False
    return True


# --------------------------------------------------------------------------- rendering

#: Share of a sky gradient's change that runs down the height; the rest runs across the width.
#: Why tilted: a denoiser whose only positional signal is rotary embeddings (relative) learns
#: where "top" is from backgrounds that differ from top to bottom. With purely vertical
#: gradients the embedded denoiser (step 16516) placed objects in the right row 98 % of the
#: time, even on solid backgrounds, and in the right column at chance (32 %): it ignored
#: "left" and "right". The width component gives it the same cue across.
GRADIENT_TILT = 0.6


@contextlib.contextmanager
def _world_setting(name: str, value: float, low: float, high: float,
                   what: str) -> Iterator[None]:
    """Sets the module constant ``name`` to ``value`` inside the block, restored after.

    Raises:
        ValueError: ``value`` outside [low, high] (``what`` names it in the message).
    """
    if not low <= value <= high:
        raise ValueError(f"{what} {value}: must be in [{low:g}, {high:g}]")
    module = globals()
    before, module[name] = module[name], value
    try:
        yield
    finally:
        module[name] = before


def gradient_tilt(tilt: float) -> contextlib.AbstractContextManager[None]:
    """Render sky gradients with ``GRADIENT_TILT = tilt`` inside the block (a training
    experiment: a lower tilt gives columns the stronger positional cue), restored after.

    Raises:
        ValueError: ``tilt`` outside [0, 1].
    """
    return _world_setting("GRADIENT_TILT", tilt, 0.0, 1.0, "gradient tilt")


def motion_distance(distance: float) -> contextlib.AbstractContextManager[None]:
    """Render clips with ``MOTION_DISTANCE = distance`` inside the block (a training
    experiment: a longer travel makes the motion word's effect on each latent frame larger),
    restored after. Scenes sampled inside keep two objects apart over the longer travel.

    Raises:
        ValueError: ``distance`` outside [0, 0.5] (fractions of the width or height).
    """
    return _world_setting("MOTION_DISTANCE", distance, 0.0, 0.5, "motion distance")


def _gradient(top: tuple[int, int, int], bottom: tuple[int, int, int], height: int,
              width: int) -> np.ndarray:
    """float32 ``(height, width, 3)``: ``top`` at the top-left corner, ``bottom`` at the
    bottom-right one, the mix linear in ``GRADIENT_TILT * y + (1 - GRADIENT_TILT) * x``
    (fractions of height and width)."""
    fy = ((np.arange(height) + 0.5) / height)[:, None, None]
    fx = ((np.arange(width) + 0.5) / width)[None, :, None]
    f = GRADIENT_TILT * fy + (1 - GRADIENT_TILT) * fx
    return (np.asarray(top, np.float32) * (1 - f)
            + np.asarray(bottom, np.float32) * f).astype(np.float32)


def background_segments(name: str, height: int, width: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The colours a background can take at each pixel, as RGB segments.

    A background pixel (also after blurring) lies on or near one of the segments
    ``[p0, p1]``; decorations of one pixel (the night sky's stars) are left out.

    Returns:
        A list of ``(p0, p1)`` float32 pairs, each broadcastable to ``(height, width, 3)``:
        shape ``(3,)`` for a constant colour, ``(height, width, 3)`` for a gradient.
    """
    if name in SOLID_BACKGROUNDS:
        c = np.asarray(SOLID_BACKGROUNDS[name], np.float32)
        return [(c, c)]
    if name == "sky":
        g = _gradient(*_SKY, height, width)
        return [(g, g)]
    if name == "night sky":
        g = _gradient(*_NIGHT, height, width)
        return [(g, g)]
    if name == "grass":
        return [(np.asarray(_GRASS_DARK, np.float32), np.asarray(_GRASS_LIGHT, np.float32))]
    if name == "brick":
        return [(np.asarray(_BRICK, np.float32), np.asarray(_MORTAR, np.float32))]
    raise ValueError(f"unknown background {name!r}")


def render_background(name: str, height: int, width: int,
                      rng: np.random.Generator | None = None) -> np.ndarray:
    """One background.

    Args:
        name: one of ``BACKGROUNDS``.
        height, width: size in pixels.
        rng: randomness for the grass blades and the stars (a fixed seed when None).
    Returns:
        float32 array ``(height, width, 3)``, RGB values in [0, 255].
    """
    rng = rng if rng is not None else np.random.default_rng(0)
    if name in SOLID_BACKGROUNDS:
        return np.broadcast_to(np.asarray(SOLID_BACKGROUNDS[name], np.float32),
                               (height, width, 3)).copy()
    if name == "sky":
        return _gradient(*_SKY, height, width)
    if name == "night sky":
        img = _gradient(*_NIGHT, height, width)
        # One-pixel stars on a jittered 8-pixel grid (at most one per cell, 3..5 pixels into
        # it), so two stars are always at least 6 pixels apart.
        cells_y, cells_x = np.meshgrid(np.arange(0, height - 5, 8), np.arange(0, width - 5, 8),
                                       indexing="ij")
        cells_y, cells_x = cells_y.ravel(), cells_x.ravel()
        keep = rng.random(cells_y.size) < 0.4
        ys = cells_y[keep] + rng.integers(3, 6, int(keep.sum()))
        xs = cells_x[keep] + rng.integers(3, 6, int(keep.sum()))
        img[ys, xs] = rng.uniform(170, 255, ys.size).astype(np.float32)[:, None]
        return img
    if name == "grass":
        img = np.broadcast_to(np.asarray(_GRASS_BASE, np.float32), (height, width, 3)).copy()
        n = max(1, round(height * width / 10))
        scale = max(1, round(height / 64))
        xs = rng.integers(0, width, n)
        ys = rng.integers(0, height, n)
        lengths = rng.integers(2, 6, n) * scale
        shade = np.where(rng.random(n) < 0.5, 0, 1)
        palette = np.asarray([_GRASS_DARK, _GRASS_LIGHT], np.float32)
        k = np.arange(int(lengths.max()))
        yy = ys[:, None] - k[None, :]
        ok = (k[None, :] < lengths[:, None]) & (yy >= 0)
        rows, cols = np.nonzero(ok)
        img[yy[rows, cols], xs[rows]] = palette[shade[rows]]
        return img
    if name == "brick":
        y = np.arange(height) + 0.5
        x = np.arange(width) + 0.5
        brick_h, brick_w = height / 8.0, width / 4.0
        row = np.floor(y / brick_h)
        mortar_h = (y % brick_h) < max(1.0, height / 32.0)
        offset = (row % 2) * brick_w / 2.0
        mortar_v = ((x[None, :] + offset[:, None]) % brick_w) < max(1.0, width / 32.0)
        mortar = mortar_h[:, None] | mortar_v
        img = np.where(mortar[..., None], np.asarray(_MORTAR, np.float32),
                       np.asarray(_BRICK, np.float32))
        return img.astype(np.float32)
    raise ValueError(f"unknown background {name!r}")


def _spec_rng(spec: SceneSpec) -> np.random.Generator:
    digest = hashlib.sha256(repr(spec).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "big"))


def _to_uint8(img: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def _paint(canvas: np.ndarray, spec: SceneSpec, t: float) -> np.ndarray:
    height, width = canvas.shape[:2]
    img = canvas.copy()
    for obj in spec.objects:
        cx, cy, extent = object_state(obj, t, height, width)
        alpha = shape_coverage(obj.shape, cx, cy, extent, height, width)[..., None]
        img = img * (1.0 - alpha) + np.asarray(COLOURS[obj.colour], np.float32) * alpha
    return img


def render_image(spec: SceneSpec, height: int = 64, width: int = 64,
                 rng: np.random.Generator | None = None) -> np.ndarray:
    """Renders a scene as one image (a clip spec is drawn as its middle frame).

    Args:
        spec: the scene.
        height, width: size in pixels; positions and sizes scale with it.
        rng: randomness for background textures; when None, a seed derived from ``spec``
            (the same spec always renders the same image).
    Returns:
        uint8 array ``(height, width, 3)``, RGB.
    """
    rng = rng if rng is not None else _spec_rng(spec)
    background = render_background(spec.background, height, width, rng)
    return _to_uint8(_paint(background, spec, 0.0))


def render_clip(spec: SceneSpec, frames: int = 9, height: int = 64, width: int = 64,
                rng: np.random.Generator | None = None) -> np.ndarray:
    """Renders a scene as a clip; the background is the same in every frame.

    Args:
        spec: the scene (object motions apply whatever ``spec.video`` says).
        frames: number of frames ``F``; frame ``f`` is at time ``frame_times(F)[f]``.
        height, width: size in pixels.
        rng: randomness for background textures; when None, derived from ``spec``.
    Returns:
        uint8 array ``(frames, height, width, 3)``, RGB.
    """
    rng = rng if rng is not None else _spec_rng(spec)
    background = render_background(spec.background, height, width, rng)
    out = np.empty((frames, height, width, 3), dtype=np.uint8)
    for f, t in enumerate(frame_times(frames)):
        out[f] = _to_uint8(_paint(background, spec, float(t)))
    return out


def object_coverage(spec: SceneSpec, frames: int | None = None, height: int = 64,
                    width: int = 64, *, by_shape: bool = False) -> np.ndarray:
    """Where the scene's objects are: the union (pixelwise maximum) of their antialiased
    coverages, as :func:`render_image` (``frames`` None) or :func:`render_clip` draw them.

    Args:
        by_shape: one plane per shape of :data:`SHAPES` (in that order), each the union of
            the coverages of the objects of that shape, rather than one plane for all.

    Returns:
        float32 ``(height, width)`` for an image, ``(frames, height, width)`` for a clip, in
        [0, 1] (0: background only); with ``by_shape`` a leading axis of ``len(SHAPES)``.
    """
    times = [0.0] if frames is None else [float(t) for t in frame_times(frames)]
    planes = len(SHAPES) if by_shape else 1
    out = np.zeros((planes, len(times), height, width), np.float32)
    for f, t in enumerate(times):
        for obj in spec.objects:
            cx, cy, extent = object_state(obj, t, height, width)
            plane = out[SHAPES.index(obj.shape) if by_shape else 0, f]
            np.maximum(plane, shape_coverage(obj.shape, cx, cy, extent, height, width),
                       out=plane)
    out = out if by_shape else out[0]
    return out[..., 0, :, :] if frames is None else out


# --------------------------------------------------------------------------- sampling

def _pick(rng: np.random.Generator, seq: Sequence):
    return seq[int(rng.integers(len(seq)))]


def _sample_train_object(rng: np.random.Generator, background: str, video: bool,
                         avoid_colours: frozenset[str] = frozenset()) -> ObjectSpec:
    colours = [c for c in COLOURS if is_allowed(c, background) and c not in avoid_colours]
    while True:
        colour, shape = _pick(rng, colours), _pick(rng, SHAPES)
        if not is_held_out(colour, shape, background):
            break
    return ObjectSpec(colour, shape, _pick(rng, SIZES), _pick(rng, POSITIONS),
                      _pick(rng, MOTIONS) if video else "still")


def sample_scene(rng: np.random.Generator, *, video: bool = False, split: str = "train",
                 two_object_prob: float = 0.35) -> SceneSpec:
    """Draws a random scene.

    Args:
        rng: the randomness.
        video: whether objects get a motion (else all are ``"still"``).
        split: ``"train"`` (one or two objects, never a held-out triple) or ``"eval"`` (one
            object forming a held-out triple with the background).
        two_object_prob: probability of a second object in training scenes.
    Returns:
        A SceneSpec with ``video`` set as asked.
    """
    if split == "eval":
        colour, shape, background = _pick(rng, held_out_triples())
        obj = ObjectSpec(colour, shape, _pick(rng, SIZES), _pick(rng, POSITIONS),
                         _pick(rng, MOTIONS) if video else "still")
        return SceneSpec(background, (obj,), video)
    if split != "train":
        raise ValueError(f"unknown split {split!r}")
    background = _pick(rng, BACKGROUNDS)
    first = _sample_train_object(rng, background, video)
    objects = [first]
    if rng.random() < two_object_prob:
        for _ in range(50):
            second = _sample_train_object(rng, background, video, frozenset({first.colour}))
            if second.position != first.position and _boxes_apart(first, second):
                objects.append(second)
                break
    return SceneSpec(background, tuple(objects), video)


# --------------------------------------------------------------------------- captions

_SIZE_WORDS = {"small": ("small", "small", "little", "tiny"), "large": ("large", "large", "big")}
_COLOUR_WORDS = {c: (c,) for c in COLOURS} | {"purple": ("purple", "purple", "violet")}


def _corner(v: str, h: str) -> tuple[str, ...]:
    alt = {"top": "upper", "bottom": "lower"}[v]
    return (f"in the {v} {h} corner", f"at the {v} {h}", f"in the {alt} {h} corner",
            f"in the {v} {h}")


_POSITION_PHRASES: dict[str, tuple[str, ...]] = {
    "top left": _corner("top", "left"), "top right": _corner("top", "right"),
    "bottom left": _corner("bottom", "left"), "bottom right": _corner("bottom", "right"),
    "top": ("at the top", "near the top", "at the top of the frame", "along the top edge"),
    "bottom": ("at the bottom", "near the bottom", "at the bottom of the frame",
               "along the bottom edge"),
    "left": ("on the left", "on the left side", "near the left edge", "at the left"),
    "right": ("on the right", "on the right side", "near the right edge", "at the right"),
    "center": ("in the center", "in the middle", "in the centre", "at the center"),
}
_MOTION_PHRASES: dict[str, tuple[str, ...]] = {
    "left": ("moves to the left", "slides to the left", "slides left", "drifts leftward"),
    "right": ("moves to the right", "slides to the right", "slides right", "drifts rightward"),
    "up": ("moves up", "rises", "floats upward", "drifts up"),
    "down": ("moves down", "sinks", "falls", "drifts down"),
    "growing": ("grows", "grows larger", "gets bigger", "expands"),
    "shrinking": ("shrinks", "gets smaller", "contracts", "becomes smaller"),
    "still": ("stays still", "stays in place", "does not move", "sits still"),
}
# Accepted by the parser only (a model's users may phrase motion this way).
_MOTION_EXTRA: dict[str, tuple[str, ...]] = {
    "left": ("moving left", "moving to the left", "moves left", "moving leftward"),
    "right": ("moving right", "moving to the right", "moves right", "moving rightward"),
    "up": ("moving up", "moves upward", "moving upward", "rising"),
    "down": ("moving down", "moves downward", "moving downward", "sinking", "falling"),
    "growing": ("growing",),
    "shrinking": ("shrinking",),
    "still": ("standing still", "not moving", "motionless"),
}
_SOLID_BG_PHRASES = ("on a {} background", "against a {} background",
                     "on a plain {} background", "over a {} backdrop")
_BG_PHRASES: dict[str, tuple[str, ...]] = {
    "sky": ("against a blue sky", "in a clear blue sky", "on a sky background",
            "across a blue sky"),
    "grass": ("on a grass background", "on green grass", "on a grassy field", "over the grass"),
    "brick": ("against a brick wall", "on a brick background", "in front of a red brick wall",
              "on a brick wall"),
    "night sky": ("against a starry night sky", "on a night sky background", "in the night sky",
                  "across a dark night sky"),
}
_PREFIXES = ("a picture of", "an image of", "a drawing of")
_VIDEO_PREFIXES = ("a video of", "a clip of", "an animation of")
_VERBS = ("sits", "is", "appears", "rests")
_LEADS = ("two shapes:", "two objects:")


def _bg_phrase(rng: np.random.Generator, background: str) -> str:
    if background in SOLID_BACKGROUNDS:
        word = _pick(rng, ("gray", "grey")) if background == "gray" else background
        return _pick(rng, _SOLID_BG_PHRASES).format(word)
    return _pick(rng, _BG_PHRASES[background])


def _noun_phrase(rng: np.random.Generator, obj: ObjectSpec) -> str:
    return (f"a {_pick(rng, _SIZE_WORDS[obj.size])} {_pick(rng, _COLOUR_WORDS[obj.colour])} "
            f"{obj.shape}")


#: The attributes a one-object caption may leave out (``caption(..., unnamed=...)``).
UNNAMEABLE = frozenset({"size", "position"})


def caption(spec: SceneSpec, rng: np.random.Generator, *,
            unnamed: frozenset[str] | set[str] = frozenset()) -> str:
    """A varied English caption of ``spec`` (grammar in the module docstring).

    Clips (``spec.video``) mention every object's motion; images never mention motion.
    ``parse_caption(caption(spec, rng)) == spec`` for every valid spec.

    Args:
        unnamed: attributes of a one-object scene the caption leaves out, a subset of
            :data:`UNNAMEABLE` (the ``free`` forms of the grammar): such a caption describes
            the scene at any size or position, and ``parse_caption`` refuses it
            (:func:`unnamed_attributes` reads which are left out). The default names all,
            drawing from ``rng`` exactly as before this argument existed.

    Raises:
        ValueError: ``unnamed`` holds another attribute, or is not empty for a two-object
            scene (its objects are told apart by their positions).
    """
    unnamed = frozenset(unnamed)
    if not unnamed <= UNNAMEABLE:
        raise ValueError(f"unnamed: {sorted(unnamed - UNNAMEABLE)} cannot be left out; "
                         f"allowed: {sorted(UNNAMEABLE)}")
    if unnamed and len(spec.objects) != 1:
        raise ValueError("unnamed: only a one-object caption may leave attributes out")
    bg = _bg_phrase(rng, spec.background)
    parts = []
    for obj in spec.objects:
        np_ = _noun_phrase(rng, obj)
        pos = _pick(rng, _POSITION_PHRASES[obj.position])
        mot = _pick(rng, _MOTION_PHRASES[obj.motion]) if spec.video else ""
        parts.append((np_, pos, mot))
    if unnamed:
        return _free_caption(rng, spec, parts[0], unnamed, bg)
    if len(parts) == 2:
        objs = [" ".join(w for w in p if w) for p in parts]
        lead = _pick(rng, _LEADS + (_VIDEO_PREFIXES if spec.video else _PREFIXES))
        template = int(rng.integers(3))
        if template == 0:
            return f"{lead} {objs[0]} and {objs[1]}, {bg}"
        if template == 1:
            return f"{objs[0]} and {objs[1]} {bg}"
        return f"{bg}, {objs[0]} and {objs[1]}"
    (np_, pos, mot), template = parts[0], int(rng.integers(4))
    if not spec.video:
        if template == 0:
            return f"{np_} {pos} {bg}"
        if template == 1:
            return f"{_pick(rng, _PREFIXES)} {np_} {pos} {bg}"
        if template == 2:
            return f"{bg}, {np_} {_pick(rng, _VERBS)} {pos}"
        return f"{np_} {bg}, {pos}"
    if template == 0:
        return f"{np_} {pos} {mot} {bg}"
    if template == 1:
        return f"{_pick(rng, _VIDEO_PREFIXES)} {np_} {pos} that {mot} {bg}"
    if template == 2:
        return f"{bg}, {np_} {pos} {mot}"
    return f"{np_} {mot} {bg}, {pos}"


def _free_caption(rng: np.random.Generator, spec: SceneSpec, part: tuple[str, str, str],
                  unnamed: frozenset[str], bg: str) -> str:
    """The ``free`` forms: a one-object caption without its size and/or position words."""
    np_, pos, mot = part
    if "size" in unnamed:
        colour_shape = np_.split(" ", 2)[2]  # "a <size> <colour> <shape>"
        np_ = f"{'an' if colour_shape[0] in 'aeiou' else 'a'} {colour_shape}"
    pos = "" if "position" in unnamed else f" {pos}"
    template = int(rng.integers(3))
    if not spec.video:
        if template == 0:
            return f"{np_}{pos} {bg}"
        if template == 1:
            return f"{_pick(rng, _PREFIXES)} {np_}{pos} {bg}"
        return f"{bg}, {np_}{pos}"
    if template == 0:
        return f"{np_}{pos} {mot} {bg}"
    if template == 1:
        return f"{_pick(rng, _VIDEO_PREFIXES)} {np_}{pos} that {mot} {bg}"
    return f"{bg}, {np_}{pos} {mot}"


def _alternation(phrases: Sequence[str]) -> str:
    ordered = sorted(set(phrases), key=len, reverse=True)
    return r"\b(?:" + "|".join(r"\s+".join(map(re.escape, p.split())) for p in ordered) + r")\b"


_MOTION_LOOKUP = {p: m for table in (_MOTION_PHRASES, _MOTION_EXTRA)
                  for m, ps in table.items() for p in ps}
_MOTION_RE = re.compile(_alternation(list(_MOTION_LOOKUP)))
_BG_RES: tuple[tuple[re.Pattern[str], str | None], ...] = (
    (re.compile(r"\b(?:(?:dark|starry)\s+)*night\s+sky(?:\s+background)?\b|\bstarry\s+sky\b"),
     "night sky"),
    (re.compile(r"\b(?:(?:clear|blue)\s+)*sky(?:\s+background)?\b"), "sky"),
    (re.compile(r"\b(?:green\s+)?grass(?:y\s+field|\s+background)?\b"), "grass"),
    (re.compile(r"\b(?:red\s+)?brick(?:\s+wall|\s+background)?\b"), "brick"),
    (re.compile(r"\b(white|black|gray|grey|beige|pink|teal)\s+(?:background|backdrop)\b"), None),
)
_SIZE_RE = re.compile(r"\b(small|little|tiny|large|big|huge)\b")
_SIZE_LOOKUP = {"small": "small", "little": "small", "tiny": "small",
                "large": "large", "big": "large", "huge": "large"}
_COLOUR_RE = re.compile(r"\b(red|orange|yellow|green|blue|purple|violet|white|black)\b")
_SHAPE_RE = re.compile(r"\b(circle|square|triangle|star)s?\b")
_VERTICAL_RE = re.compile(r"\b(top|upper|bottom|lower)\b")
_HORIZONTAL_RE = re.compile(r"\b(left|right)\b")
_CENTRE_RE = re.compile(r"\b(center|centre|middle)\b")


def _cut(text: str, match: re.Match[str]) -> str:
    return text[:match.start()] + " " + text[match.end():]


def _parse_object(segment: str) -> tuple[ObjectSpec, bool]:
    motion, moving = "still", False
    m = _MOTION_RE.search(segment)
    if m:
        motion, moving = _MOTION_LOOKUP[re.sub(r"\s+", " ", m.group(0))], True
        segment = _cut(segment, m)
    found = {}
    for name, regex in (("size", _SIZE_RE), ("colour", _COLOUR_RE), ("shape", _SHAPE_RE)):
        hits = regex.findall(segment)
        if len(hits) != 1:
            raise ValueError(f"expected one {name} word in {segment.strip()!r}")
        found[name] = hits[0]
    vertical = _VERTICAL_RE.search(segment)
    horizontal = _HORIZONTAL_RE.search(segment)
    v = {"upper": "top", "lower": "bottom"}.get(vertical.group(1), vertical.group(1)) \
        if vertical else None
    h = horizontal.group(1) if horizontal else None
    if v and h:
        position = f"{v} {h}"
    elif v or h:
        position = v or h
    elif _CENTRE_RE.search(segment):
        position = "center"
    else:
        raise ValueError(f"no position in {segment.strip()!r}")
    colour = "purple" if found["colour"] == "violet" else found["colour"]
    obj = ObjectSpec(colour, found["shape"], _SIZE_LOOKUP[found["size"]], position, motion)
    return obj, moving


def parse_caption(text: str) -> SceneSpec:
    """Reads a caption back into a SceneSpec (inverse of ``caption``).

    Keyword based: the background phrase is found and removed first, the rest is split into
    objects at "and" / ";", and each object's motion phrase is removed before its position
    words are read. A caption is a clip's exactly when some object has a motion phrase; objects
    of a clip without one are "still".

    Raises:
        ValueError: when the background, an object attribute or the objects are missing or
            ambiguous.
    """
    t = re.sub(r"[^a-z:,;]+", " ", text.lower().replace("-", " "))
    background = None
    for regex, name in _BG_RES:
        m = regex.search(t)
        if m:
            background = name or {"grey": "gray"}.get(m.group(1), m.group(1))
            t = _cut(t, m)
            break
    if background is None:
        raise ValueError(f"no background in {text!r}")
    segments = [s for s in re.split(r"\band\b|;", t) if _SHAPE_RE.search(s)]
    if not 1 <= len(segments) <= 2:
        raise ValueError(f"expected one or two objects in {text!r}")
    parsed = [_parse_object(s) for s in segments]
    video = any(moving for _, moving in parsed)
    return SceneSpec(background, tuple(obj for obj, _ in parsed), video)


def unnamed_attributes(text: str) -> frozenset[str]:
    """Which of :data:`UNNAMEABLE` (size, position) a one-object caption leaves out: the
    attributes to leave unscored when the scene it asked for is judged. Two-object captions
    and captions ``parse_caption`` reads whole give the empty set.

    Raises:
        ValueError: no background, no object or two, or an attribute other than size and
            position missing or ambiguous (as :func:`parse_caption`).
    """
    try:
        parse_caption(text)
        return frozenset()
    except ValueError:
        pass
    t = re.sub(r"[^a-z:,;]+", " ", text.lower().replace("-", " "))
    missing = set()
    if not _SIZE_RE.search(t):
        missing.add("size")
    filler = "small " if "size" in missing else ""
    bg_cut = t
    for regex, _ in _BG_RES:
        m = regex.search(bg_cut)
        if m:
            bg_cut = _cut(bg_cut, m)
            break
    motion = _MOTION_RE.search(bg_cut)
    body = _cut(bg_cut, motion) if motion else bg_cut
    if not (_VERTICAL_RE.search(body) or _HORIZONTAL_RE.search(body)
            or _CENTRE_RE.search(body)):
        missing.add("position")
    repaired = re.sub(_SHAPE_RE, lambda m: f"{filler}{m.group(0)}"
                      + (" in the center" if "position" in missing else ""), t, count=1)
    if len([s for s in re.split(r"\band\b|;", repaired) if _SHAPE_RE.search(s)]) != 1:
        raise ValueError(f"unnamed attributes: {text!r} is not a one-object caption")
    parse_caption(repaired)  # every other attribute is there and unambiguous
    return frozenset(missing)


def _caption_words() -> frozenset[str]:
    texts: list[str] = ["a an and that two shapes objects:", "gray grey violet"]
    for table in (_SIZE_WORDS, _COLOUR_WORDS, _POSITION_PHRASES, _MOTION_PHRASES, _BG_PHRASES):
        texts.extend(" ".join(v) for v in table.values())
    texts += [*_SOLID_BG_PHRASES, *_PREFIXES, *_VIDEO_PREFIXES, *_VERBS, *_LEADS]
    texts += list(SOLID_BACKGROUNDS) + list(SHAPES)
    words = " ".join(texts).replace("{}", " ").replace(":", " ").replace(",", " ").split()
    return frozenset(words)


#: Every word a caption can contain (punctuation ":" and "," aside).
VOCABULARY: frozenset[str] = _caption_words()


# --------------------------------------------------------------------------- datasets

def eval_prompts(n: int = 256, mode: str = "t2i", seed: int = 0) -> list[tuple[str, SceneSpec]]:
    """The evaluation prompts: single-object scenes built from held-out triples.

    The held-out triples are cycled through (each pass in a fresh random order), so every
    triple appears about equally often; size, position and (for ``"t2v"``) motion are random.

    Args:
        n: number of prompts.
        mode: ``"t2i"`` (image specs) or ``"t2v"`` (clip specs, ``video=True``).
        seed: the same seed gives the same prompts.
    Returns:
        A list of ``(caption, spec)`` pairs.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}")
    video = mode == "t2v"
    rng = np.random.default_rng([seed, 2024, int(video)])
    # each caption draws from rng before the next scene does (the generator is lazy)
    return [(caption(spec, rng), spec) for spec in _held_out_scenes(rng, n, video)]


def _held_out_scenes(rng: np.random.Generator, n: int, video: bool) -> Iterator[SceneSpec]:
    """``n`` single-object scenes of the held-out triples, cycled through (each pass in a
    fresh random order), with random size, position and (clips) motion, drawn from ``rng``
    one scene at a time."""
    triples = held_out_triples()
    order: np.ndarray = np.arange(0)
    for i in range(n):
        if i % len(triples) == 0:
            order = rng.permutation(len(triples))
        colour, shape, background = triples[order[i % len(triples)]]
        obj = ObjectSpec(colour, shape, _pick(rng, SIZES), _pick(rng, POSITIONS),
                         _pick(rng, MOTIONS) if video else "still")
        yield SceneSpec(background, (obj,), video)


#: The unnamed sets :func:`free_eval_prompts` cycles through, in this order.
FREE_EVAL_UNNAMED: tuple[frozenset[str], ...] = (
    frozenset({"position"}), frozenset({"size"}), frozenset({"size", "position"}))


def free_eval_prompts(n: int = 64, mode: str = "t2i",
                      seed: int = 0) -> list[tuple[str, SceneSpec, frozenset[str]]]:
    """Evaluation prompts in the ``free`` forms: held-out single-object scenes whose captions
    leave out the size, the position or both (cycling through :data:`FREE_EVAL_UNNAMED`), as
    a user types "a blue circle slides to the right across a night sky".

    The spec's size and position are drawn at random, but the caption does not say them: a
    generator may draw the object at any size and anywhere, so a scorer must leave the
    unnamed attributes out (``studio.tiny.evaluate.evaluate(..., unscored=...)``). Another
    random stream than :func:`eval_prompts`'s, so those stay draw for draw.

    Args:
        n: number of prompts (>= 0).
        mode: ``"t2i"`` (image specs) or ``"t2v"`` (clip specs).
        seed: the same seed gives the same prompts.
    Returns:
        A list of ``(caption, spec, unnamed)``; ``unnamed`` is what the caption leaves out
        (what :func:`unnamed_attributes` reads from it).
    Raises:
        ValueError: unknown mode or ``n`` below 0.
    """
    if mode not in MODES:
        raise ValueError(f"mode: {mode!r} is not one of {', '.join(MODES)}")
    if n < 0:
        raise ValueError(f"n: {n} is below 0")
    video = mode == "t2v"
    rng = np.random.default_rng([seed, 4048, int(video)])
    out: list[tuple[str, SceneSpec, frozenset[str]]] = []
    for i, spec in enumerate(_held_out_scenes(rng, n, video)):
        unnamed = FREE_EVAL_UNNAMED[i % len(FREE_EVAL_UNNAMED)]
        out.append((caption(spec, rng, unnamed=unnamed), spec, unnamed))
    return out


def batches(rng: np.random.Generator, batch_size: int, *, video: bool = False, frames: int = 9,
            height: int = 64, width: int = 64,
            split: str = "train") -> Iterator[tuple[list[str], np.ndarray]]:
    """Endless training batches of captions and pixels (no torch).

    Yields:
        ``(captions, pixels)``: a list of ``batch_size`` strings and a uint8 array
        ``(batch_size, height, width, 3)`` for images or ``(batch_size, frames, height,
        width, 3)`` for clips, RGB.
    """
    while True:
        specs = [sample_scene(rng, video=video, split=split) for _ in range(batch_size)]
        captions = [caption(s, rng) for s in specs]
        if video:
            pixels = np.stack([render_clip(s, frames, height, width, rng) for s in specs])
        else:
            pixels = np.stack([render_image(s, height, width, rng) for s in specs])
        yield captions, pixels
