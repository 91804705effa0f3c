"""Prompt adherence for the tiny world, read back from pixels alone.

``analyze_image`` / ``analyze_clip`` never see a caption: they classify the background among
``world.BACKGROUNDS``, find the objects, and read each object's colour, shape, size, position
and (clips) motion. ``evaluate`` compares such readings with the SceneSpecs the samples were
generated from and reports per-attribute accuracy; ``score_mode`` runs a generator over the
held-out evaluation prompts of a mode.

How the reading works (numpy only; ``scipy.ndimage`` speeds up labelling when installed):

1. Background: every background is a per-pixel colour model (``world.background_segments``:
   RGB segments, constant or per pixel). The background whose model is closest on average
   (distances capped at ``BACKGROUND_CAP``, so objects weigh little) wins.
2. Objects: pixels of a 3x3-smoothed copy farther than ``FOREGROUND_THRESHOLD`` from the
   background model are foreground (smoothing divides noise by three and keeps background
   blends on the model); 8-connected groups of the foreground dilated by one pixel are the
   objects (specks such as stars are dropped: fewer than ``MIN_OBJECT_PIXELS`` foreground
   pixels or a summed colour difference under ``MIN_OBJECT_MASS``, per 64x64 pixels). An
   object's colour is the median of its most distinct pixels, named by the nearest of
   ``world.COLOURS``; its soft mask (coverage ``alpha`` per pixel, from the unsmoothed
   pixels) is the projection of each pixel onto the line from the local background colour to
   the object colour, which gives sub-pixel area and centroid even under blur.
3. Shape: the soft mask is compared (soft IoU) with each shape's template, drawn with the
   world's rasteriser at the same area and centroid (a few scales, crisp and 3x3-blurred);
   the best wins. Size (small/large) is the fitted extent against ``SIZE_THRESHOLD``;
   position (3x3 grid) is the fitted bounding-box centre.
4. Motion (clips): each object of the middle frame is tracked by colour and proximity;
   least-squares slopes over the clip of the centroid (fractions of width/height) and of the
   log area decide between growing/shrinking (``GROWTH_THRESHOLD``), moving
   (``MOVE_THRESHOLD``) and still. Static attributes of clips are read on the middle frame.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache, lru_cache

import numpy as np

from studio.tiny import world

try:  # optional: faster connected components
    from scipy import ndimage as _ndimage
except ImportError:  # pragma: no cover - exercised through _USE_SCIPY in the tests
    _ndimage = None

_USE_SCIPY = _ndimage is not None

#: Cap on per-pixel background distances when scoring backgrounds (RGB units).
BACKGROUND_CAP = 60.0
#: RGB distance from the background model above which a pixel is foreground.
FOREGROUND_THRESHOLD = 36.0
#: Smallest object, in foreground pixels per 64x64 pixels (scaled with the image area).
MIN_OBJECT_PIXELS = 6
#: Smallest object "mass": the norm of the summed colour difference from the background
#: model over the object (RGB units x pixels, per 64x64 pixels, and never under
#: ``MIN_SPECK_MASS``). Blur and noise barely change it; the smallest object of the world has
#: about 2000 at 64x64.
MIN_OBJECT_MASS = 1000.0
#: A one-pixel night-sky star has a mass of at most about 400, at any resolution.
MIN_SPECK_MASS = 600.0
#: Extent fraction (of min(H, W)) between small and large: the geometric mean of the two.
SIZE_THRESHOLD = math.sqrt(world.SIZE_FRACTIONS["small"] * world.SIZE_FRACTIONS["large"])
#: Column/row boundaries of the 3x3 position grid, as fractions of width/height.
POSITION_EDGES = (0.375, 0.625)
#: Change of log area over a clip beyond which an object grows or shrinks.
GROWTH_THRESHOLD = 0.55
#: Travel over a clip (fraction of width/height) beyond which an object moves.
MOVE_THRESHOLD = 0.07

ATTRIBUTES = ("background", "count", "colour", "shape", "size", "position", "motion")
OBJECT_ATTRIBUTES = ("colour", "shape", "size", "position", "motion")

_PALETTE_NAMES = tuple(world.COLOURS)
_PALETTE = np.asarray([world.COLOURS[c] for c in _PALETTE_NAMES], np.float32)


# --------------------------------------------------------------------------- results

@dataclass(frozen=True)
class DetectedObject:
    """One object read from pixels.

    Attributes:
        colour, shape, size, position: canonical names (see ``world``).
        motion: a name from ``world.MOTIONS`` for clips, None for images.
        rgb: median RGB of the object's core pixels (0-255).
        area: soft-mask area as a fraction of ``H * W``.
        extent: fitted extent as a fraction of ``min(H, W)``.
        centre: fitted bounding-box centre ``(x, y)`` as fractions of ``(W, H)``.
        shape_scores: soft IoU of the mask with each shape's template.
        motion_features: for clips, ``(dx, dy, dlog_area)`` over the whole clip (x, y in
            fractions of width/height, y down); None for images.
    """

    colour: str
    shape: str
    size: str
    position: str
    motion: str | None
    rgb: tuple[float, float, float]
    area: float
    extent: float
    centre: tuple[float, float]
    shape_scores: dict[str, float] = field(default_factory=dict)
    motion_features: tuple[float, float, float] | None = None


@dataclass(frozen=True)
class SceneReading:
    """What ``analyze_image`` / ``analyze_clip`` read: the background (with every
    background's score, lower is better) and the objects, largest first."""

    background: str
    background_scores: dict[str, float]
    objects: tuple[DetectedObject, ...]


@dataclass
class EvalReport:
    """Per-attribute adherence.

    Attributes:
        accuracy: attribute -> fraction correct. "background" and "count" (number of objects)
            are per sample; "colour", "shape", "size", "position" and (clips only) "motion"
            are per object of the specs.
        counts: attribute -> number of items scored.
        chance: attribute -> expected accuracy of a reading unrelated to the sample but
            distributed like the specs (sum of squared label frequencies).
        details: one dict per sample: "expected" and "predicted" (lists of per-object attribute
            dicts), "matched" (per expected object, the detection scored against it, or
            None), "background" ``(expected, predicted)`` and "correct" (attribute -> list of
            bools).
    """

    accuracy: dict[str, float]
    counts: dict[str, int]
    chance: dict[str, float]
    details: list[dict] = field(default_factory=list, repr=False)

    def summary(self) -> str:
        """A one-line-per-attribute table: accuracy, chance and count."""
        lines = [f"{'attribute':<11}{'accuracy':>9}{'chance':>8}{'n':>6}"]
        for name, acc in self.accuracy.items():
            lines.append(f"{name:<11}{acc:>9.3f}{self.chance[name]:>8.3f}{self.counts[name]:>6}")
        return "\n".join(lines)


# --------------------------------------------------------------------------- pixels

def _as_float(pixels: np.ndarray) -> np.ndarray:
    arr = np.asarray(pixels)
    if arr.dtype == np.uint8:
        return arr.astype(np.float32)
    if np.issubdtype(arr.dtype, np.floating):
        return (np.clip(arr, 0.0, 1.0) * 255.0).astype(np.float32)
    raise TypeError(f"expected uint8 or float pixels, got {arr.dtype}")


@lru_cache(maxsize=64)
def _segments(name: str, height: int, width: int):
    return world.background_segments(name, height, width)


def _background_fit(img: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Distance ``(H, W)`` of each pixel to the background model and the nearest model
    colour ``(H, W, 3)``."""
    height, width = img.shape[:2]
    best_d = best_q = None
    for p0, p1 in _segments(name, height, width):
        v = p1 - p0
        vv = np.sum(v * v, axis=-1, keepdims=True)
        if np.any(vv > 0):
            t = np.clip(np.sum((img - p0) * v, axis=-1, keepdims=True) / np.maximum(vv, 1e-6),
                        0.0, 1.0)
            q = p0 + t * v
        else:
            q = np.broadcast_to(p0, img.shape)
        d = np.sqrt(np.sum((img - q) ** 2, axis=-1))
        if best_d is None:
            best_d, best_q = d, np.array(q, dtype=np.float32)
        else:
            closer = d < best_d
            best_d = np.where(closer, d, best_d)
            best_q = np.where(closer[..., None], q, best_q)
    return best_d, best_q


def classify_background(frames: np.ndarray) -> tuple[str, dict[str, float]]:
    """Which background a frame (or frames) shows.

    Args:
        frames: uint8 ``(H, W, 3)`` or ``(N, H, W, 3)`` (float in [0, 1] also accepted).
    Returns:
        ``(name, scores)``: the best background and, per background, the mean capped
        distance (RGB units, lower is better) over the pixels of all frames.
    """
    arr = _as_float(frames)
    return _classify(arr[None] if arr.ndim == 3 else arr)


def _classify(arr: np.ndarray) -> tuple[str, dict[str, float]]:
    scores = {}
    for name in world.BACKGROUNDS:
        scores[name] = float(np.mean([np.minimum(_background_fit(f, name)[0],
                                                 BACKGROUND_CAP).mean() for f in arr]))
    return min(scores, key=scores.get), scores


def _smooth3(img: np.ndarray) -> np.ndarray:
    """3x3 box filter of a float ``(H, W, C)`` image, edges replicated."""
    padded = np.pad(img, ((1, 1), (1, 1), (0, 0)), mode="edge")
    h, w = img.shape[:2]
    return sum(padded[dy:dy + h, dx:dx + w] for dy in range(3) for dx in range(3)) / 9.0


def _dilate(mask: np.ndarray) -> np.ndarray:
    padded = np.pad(mask, 1)
    h, w = mask.shape
    out = np.zeros_like(mask)
    for dy in range(3):
        for dx in range(3):
            out |= padded[dy:dy + h, dx:dx + w]
    return out


def _label(mask: np.ndarray) -> tuple[np.ndarray, int]:
    """8-connected components: int32 labels ``(H, W)`` (0 = background) and their count."""
    if _USE_SCIPY:
        labels, n = _ndimage.label(mask, structure=np.ones((3, 3), dtype=int))
        return labels.astype(np.int32), int(n)
    h, w = mask.shape
    big = h * w + 1
    labels = np.where(mask, np.arange(1, h * w + 1, dtype=np.int64).reshape(h, w), big)
    while True:
        padded = np.pad(labels, 1, constant_values=big)
        low = labels.copy()
        for dy in range(3):
            for dx in range(3):
                np.minimum(low, padded[dy:dy + h, dx:dx + w], out=low)
        low = np.where(mask, low, big)
        if np.array_equal(low, labels):
            break
        labels = low
    ids = np.unique(labels[mask])
    out = np.zeros((h, w), dtype=np.int32)
    out[mask] = np.searchsorted(ids, labels[mask]) + 1
    return out, len(ids)


@dataclass
class _Blob:
    rgb: np.ndarray
    colour: str
    area: float  # pixels
    cx: float  # pixels
    cy: float
    alpha: np.ndarray  # crop
    x0: int
    y0: int


def _colour_name(rgb: np.ndarray) -> str:
    return _PALETTE_NAMES[int(np.argmin(np.sum((_PALETTE - rgb) ** 2, axis=1)))]


def _find_blobs(img: np.ndarray, background: str) -> list[_Blob]:
    """Objects of one float frame ``(H, W, 3)`` on a known background, largest first."""
    height, width = img.shape[:2]
    dist, nearest = _background_fit(img, background)
    # Foreground is decided on a 3x3-smoothed copy: a third of the noise, same background
    # model (blends of background colours stay on its segments).
    fg = _background_fit(_smooth3(img), background)[0] > FOREGROUND_THRESHOLD
    if not fg.any():
        return []
    labels, n = _label(_dilate(fg))
    min_px = max(3, round(MIN_OBJECT_PIXELS * height * width / 4096))
    min_mass = max(MIN_OBJECT_MASS * height * width / 4096, MIN_SPECK_MASS)
    sizes = np.bincount(labels[fg], minlength=n + 1)
    blobs = []
    for k in np.nonzero(sizes >= min_px)[0]:
        if k == 0:
            continue
        ys, xs = np.nonzero(labels == k)
        y0, y1, x0, x1 = ys.min(), ys.max() + 1, xs.min(), xs.max() + 1
        region = labels[y0:y1, x0:x1] == k
        pix, d, q = img[y0:y1, x0:x1], dist[y0:y1, x0:x1], nearest[y0:y1, x0:x1]
        fgc = fg[y0:y1, x0:x1] & region
        if np.linalg.norm(np.sum((pix - q)[region], axis=0)) < min_mass:
            continue
        core = fgc & (d >= 0.75 * np.percentile(d[fgc], 90))
        rgb = np.median(pix[core], axis=0)
        v = rgb - q
        alpha = np.sum((pix - q) * v, axis=-1) / np.maximum(np.sum(v * v, axis=-1), 1.0)
        alpha = np.clip(alpha, 0.0, 1.0) * region
        area = float(alpha.sum())
        if area <= 0:
            continue
        cy = float((alpha.sum(axis=1) * (np.arange(y0, y1) + 0.5)).sum() / area)
        cx = float((alpha.sum(axis=0) * (np.arange(x0, x1) + 0.5)).sum() / area)
        blobs.append(_Blob(rgb, _colour_name(rgb), area, cx, cy, alpha, int(x0), int(y0)))
    blobs.sort(key=lambda b: -b.area)
    return blobs


# --------------------------------------------------------------------------- shapes

@cache
def _shape_moments(shape: str) -> tuple[float, float, float]:
    """Area per extent squared, and centroid offset from the bounding-box centre (in
    extents), measured on a large rendering."""
    size, extent = 240, 100.0
    cov = world.shape_coverage(shape, size / 2, size / 2, extent, size, size).astype(np.float64)
    area = cov.sum()
    centres = np.arange(size) + 0.5
    cx = (cov.sum(axis=0) * centres).sum() / area
    cy = (cov.sum(axis=1) * centres).sum() / area
    return (float(area / extent ** 2), float((cx - size / 2) / extent),
            float((cy - size / 2) / extent))


def _box3(a: np.ndarray) -> np.ndarray:
    padded = np.pad(a, 1)
    h, w = a.shape
    return sum(padded[dy:dy + h, dx:dx + w] for dy in range(3) for dx in range(3)) / 9.0


def _fit_shape(blob: _Blob, height: int,
               width: int) -> tuple[str, float, float, float, dict[str, float]]:
    """Best shape, its extent and bounding-box centre (pixels), and every shape's score."""
    scores, fits = {}, {}
    bh, bw = blob.alpha.shape
    for shape in world.SHAPES:
        k, ox, oy = _shape_moments(shape)
        extent = math.sqrt(blob.area / k)
        bx, by = blob.cx - ox * extent, blob.cy - oy * extent
        hx, hy = world.shape_half_extents(shape)
        x0 = max(0, min(blob.x0, int(math.floor(bx - 1.1 * hx * extent))) - 2)
        y0 = max(0, min(blob.y0, int(math.floor(by - 1.1 * hy * extent))) - 2)
        x1 = min(width, max(blob.x0 + bw, int(math.ceil(bx + 1.1 * hx * extent))) + 2)
        y1 = min(height, max(blob.y0 + bh, int(math.ceil(by + 1.1 * hy * extent))) + 2)
        measured = np.zeros((y1 - y0, x1 - x0), np.float32)
        measured[blob.y0 - y0:blob.y0 - y0 + bh, blob.x0 - x0:blob.x0 - x0 + bw] = blob.alpha
        best = 0.0
        for scale in (0.94, 1.0, 1.06):
            tpl = world.shape_coverage(shape, bx - x0, by - y0, extent * scale,
                                       y1 - y0, x1 - x0)
            for t in (tpl, _box3(tpl)):
                union = np.maximum(measured, t).sum()
                if union > 0:
                    best = max(best, float(np.minimum(measured, t).sum() / union))
        scores[shape] = best
        fits[shape] = (extent, bx, by)
    shape = max(scores, key=scores.get)
    extent, bx, by = fits[shape]
    return shape, extent, bx, by, scores


def _position_name(fx: float, fy: float) -> str:
    lo, hi = POSITION_EDGES
    col = "left" if fx < lo else "right" if fx > hi else ""
    row = "top" if fy < lo else "bottom" if fy > hi else ""
    return f"{row} {col}".strip() or "center"


def _describe(blob: _Blob, height: int, width: int, motion: str | None = None,
              motion_features: tuple[float, float, float] | None = None) -> DetectedObject:
    shape, extent, bx, by, scores = _fit_shape(blob, height, width)
    side = min(height, width)
    return DetectedObject(
        colour=blob.colour, shape=shape,
        size="small" if extent / side < SIZE_THRESHOLD else "large",
        position=_position_name(bx / width, by / height), motion=motion,
        rgb=tuple(float(c) for c in blob.rgb), area=blob.area / (height * width),
        extent=extent / side, centre=(bx / width, by / height), shape_scores=scores,
        motion_features=motion_features)


# --------------------------------------------------------------------------- reading

def analyze_image(image: np.ndarray) -> SceneReading:
    """Reads a scene from one image.

    Args:
        image: uint8 ``(H, W, 3)`` RGB (float in [0, 1] also accepted).
    Returns:
        A SceneReading; objects have ``motion=None``.
    """
    img = _as_float(image)
    if img.ndim != 3 or img.shape[-1] != 3:
        raise ValueError(f"expected (H, W, 3), got {img.shape}")
    height, width = img.shape[:2]
    background, scores = _classify(img[None])
    objects = tuple(_describe(b, height, width) for b in _find_blobs(img, background))
    return SceneReading(background, scores, objects)


def _classify_motion(times: np.ndarray, xs: np.ndarray, ys: np.ndarray,
                     log_areas: np.ndarray) -> tuple[str, tuple[float, float, float]]:
    if len(times) < 3:
        return "still", (0.0, 0.0, 0.0)
    tc = times - times.mean()
    var = float(np.sum(tc * tc))
    if var <= 0:
        return "still", (0.0, 0.0, 0.0)

    def change(v: np.ndarray) -> float:  # least-squares slope = change over the whole clip
        return float(np.sum(tc * (v - v.mean())) / var)

    dx, dy, da = change(xs), change(ys), change(log_areas)
    if abs(da) > GROWTH_THRESHOLD:
        motion = "growing" if da > 0 else "shrinking"
    elif max(abs(dx), abs(dy)) > MOVE_THRESHOLD:
        if abs(dx) >= abs(dy):
            motion = "right" if dx > 0 else "left"
        else:
            motion = "down" if dy > 0 else "up"
    else:
        motion = "still"
    return motion, (dx, dy, da)


def analyze_clip(clip: np.ndarray) -> SceneReading:
    """Reads a scene from a clip.

    Colour, shape, size and position are read on the middle frame (``F // 2``); each of its
    objects is tracked through the clip to classify its motion.

    Args:
        clip: uint8 ``(F, H, W, 3)`` RGB (float in [0, 1] also accepted).
    Returns:
        A SceneReading; objects have a motion from ``world.MOTIONS``.
    """
    frames = _as_float(clip)
    if frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"expected (F, H, W, 3), got {frames.shape}")
    n_frames, height, width = frames.shape[:3]
    mid = n_frames // 2
    background, scores = _classify(frames[sorted({0, mid, n_frames - 1})])
    per_frame = [_find_blobs(f, background) for f in frames]
    times = world.frame_times(n_frames)
    side2 = float(min(height, width)) ** 2
    objects = []
    for blob in per_frame[mid]:
        track_t, track_x, track_y, track_a = [], [], [], []
        for f, blobs in enumerate(per_frame):
            same = [b for b in blobs if b.colour == blob.colour] or [
                b for b in blobs if np.linalg.norm(b.rgb - blob.rgb) < 60]
            if not same:
                continue
            b = min(same, key=lambda c: (c.cx - blob.cx) ** 2 + (c.cy - blob.cy) ** 2)
            track_t.append(times[f])
            track_x.append(b.cx / width)
            track_y.append(b.cy / height)
            track_a.append(math.log(b.area / side2))
        motion, features = _classify_motion(np.asarray(track_t), np.asarray(track_x),
                                            np.asarray(track_y), np.asarray(track_a))
        objects.append(_describe(blob, height, width, motion, features))
    return SceneReading(background, scores, tuple(objects))


def analyze(sample: np.ndarray) -> SceneReading:
    """``analyze_image`` for ``(H, W, 3)`` arrays, ``analyze_clip`` for ``(F, H, W, 3)``."""
    return analyze_clip(sample) if np.ndim(sample) == 4 else analyze_image(sample)


# --------------------------------------------------------------------------- scoring

def _object_dict(obj, keys: Sequence[str]) -> dict[str, str | None]:
    return {k: getattr(obj, k) for k in keys}


def _match(expected: Sequence[world.ObjectSpec], found: Sequence[DetectedObject],
           keys: Sequence[str]) -> list[DetectedObject | None]:
    """For each expected object, the detection paired with it: the largest ``len(expected)``
    detections, assigned in the order that agrees on the most attributes."""
    candidates: list[DetectedObject | None] = list(found[:len(expected)])
    candidates += [None] * (len(expected) - len(candidates))
    best, best_hits = candidates, -1
    for perm in itertools.permutations(candidates):
        hits = sum(getattr(e, k) == getattr(p, k) for e, p in zip(expected, perm, strict=True)
                   if p is not None for k in keys)
        if hits > best_hits:
            best, best_hits = list(perm), hits
    return best


def evaluate(samples: Sequence[np.ndarray] | np.ndarray,
             specs: Sequence[world.SceneSpec],
             unscored: Sequence[frozenset[str]] | None = None) -> EvalReport:
    """Scores generated samples against the specs they were generated from.

    Args:
        samples: images uint8 ``(H, W, 3)`` or clips uint8 ``(F, H, W, 3)`` (a stacked array
            or a sequence; float in [0, 1] also accepted), one per spec.
        specs: the SceneSpecs, in the same order.
        unscored: per sample, object attributes its caption did not name (e.g. a ``free``
            caption's ``{"size", "position"}``, ``world.free_eval_prompts``): left out of
            that sample's matching, scores, chance levels and details. None scores all.
    Returns:
        An EvalReport. Motion is scored only for clips (4-D samples); a missing object counts
        as wrong on all its scored attributes.
    Raises:
        ValueError: lengths differ, or ``unscored`` names an attribute that is not one of
            ``OBJECT_ATTRIBUTES``.
    """
    if len(samples) != len(specs):
        raise ValueError(f"{len(samples)} samples for {len(specs)} specs")
    if unscored is None:
        unscored = [frozenset()] * len(specs)
    if len(unscored) != len(specs):
        raise ValueError(f"unscored: {len(unscored)} sets for {len(specs)} specs")
    for left_out in unscored:
        if not set(left_out) <= set(OBJECT_ATTRIBUTES):
            raise ValueError(f"unscored: {sorted(set(left_out) - set(OBJECT_ATTRIBUTES))} "
                             f"not in {OBJECT_ATTRIBUTES}")
    hits: dict[str, list[bool]] = {a: [] for a in ATTRIBUTES}
    labels: dict[str, list] = {a: [] for a in ATTRIBUTES}
    details = []
    for sample, spec, left_out in zip(samples, specs, unscored, strict=True):
        video = np.ndim(sample) == 4
        reading = analyze(sample)
        keys = tuple(k for k in (OBJECT_ATTRIBUTES if video else OBJECT_ATTRIBUTES[:-1])
                     if k not in left_out)
        matched = _match(spec.objects, reading.objects, keys)
        correct = {"background": [reading.background == spec.background],
                   "count": [len(reading.objects) == len(spec.objects)]}
        labels["background"].append(spec.background)
        labels["count"].append(len(spec.objects))
        for key in keys:
            correct[key] = [p is not None and getattr(p, key) == getattr(e, key)
                            for e, p in zip(spec.objects, matched, strict=True)]
            labels[key].extend(getattr(e, key) for e in spec.objects)
        for key, values in correct.items():
            hits[key].extend(values)
        details.append({
            "background": (spec.background, reading.background),
            "expected": [_object_dict(o, keys) for o in spec.objects],
            "predicted": [_object_dict(o, keys) for o in reading.objects],
            "matched": [None if p is None else _object_dict(p, keys) for p in matched],
            "correct": correct,
        })
    accuracy, counts, chance = {}, {}, {}
    for key in ATTRIBUTES:
        if not hits[key]:
            continue
        accuracy[key] = float(np.mean(hits[key]))
        counts[key] = len(hits[key])
        _, freq = np.unique(np.asarray(labels[key], dtype=object).astype(str),
                            return_counts=True)
        chance[key] = float(np.sum((freq / freq.sum()) ** 2))
    return EvalReport(accuracy, counts, chance, details)


def _row(position: str) -> str:
    return "top" if "top" in position else "bottom" if "bottom" in position else "middle"


def _column(position: str) -> str:
    return "left" if "left" in position else "right" if "right" in position else "middle"


def position_axes(report: EvalReport) -> dict[str, float]:
    """Position accuracy split by axis: ``{"row": ..., "column": ...}``, the fraction of
    expected objects whose detection is in the right row (top/middle/bottom) and in the right
    column (left/middle/right) of the 3x3 grid. A missing object is wrong on both. Chance is
    1/3 per axis; a model that ignores one axis shows it here (``position`` is about their
    product)."""
    rows, columns = [], []
    for item in report.details:
        for expected, found in zip(item["expected"], item["matched"], strict=True):
            if "position" not in expected:  # a caption that names no position
                continue
            rows.append(found is not None and _row(found["position"]) == _row(expected["position"]))
            columns.append(found is not None
                           and _column(found["position"]) == _column(expected["position"]))
    if not rows:
        return {}
    return {"row": float(np.mean(rows)), "column": float(np.mean(columns))}


def error_counts(report: EvalReport, attribute: str) -> dict[str, int]:
    """The wrong readings of one object attribute, counted by kind: ``"expected->read"``
    (``"expected->missing"`` when no detection was paired with the object), most frequent
    first. What an accuracy alone hides: e.g. whether wrong clips read "still" (too little
    motion) or the opposite direction.

    Args:
        report: an :func:`evaluate` report (its ``details``).
        attribute: one of ``OBJECT_ATTRIBUTES``; "motion" counts clips only.
    Returns:
        ``{"expected->read": count}``, by count descending, ties by key; empty when every
        reading is right.
    Raises:
        ValueError: ``attribute`` not one of ``OBJECT_ATTRIBUTES``.
    """
    if attribute not in OBJECT_ATTRIBUTES:
        raise ValueError(f"attribute={attribute!r}: must be one of {OBJECT_ATTRIBUTES}")
    counts = Counter(
        f"{expected[attribute]}->{'missing' if found is None else found[attribute]}"
        for item in report.details
        for expected, found in zip(item["expected"], item["matched"], strict=True)
        if attribute in expected  # not the motion of an image
        and (found is None or found[attribute] != expected[attribute]))
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def score_mode(generate: Callable[[list[str]], np.ndarray], mode: str = "t2i", *, n: int = 256,
               seed: int = 0, batch_size: int = 32) -> EvalReport:
    """Scores a generator on the held-out prompts of a mode (``world.eval_prompts``).

    Args:
        generate: maps a list of captions to uint8 pixels ``(B, H, W, 3)`` for ``"t2i"`` or
            ``(B, F, H, W, 3)`` for ``"t2v"``, one per caption (any resolution and frame
            count).
        mode: ``"t2i"`` or ``"t2v"``.
        n, seed: passed to ``world.eval_prompts``.
        batch_size: captions per ``generate`` call.
    Returns:
        An EvalReport over the ``n`` prompts.
    """
    prompts = world.eval_prompts(n, mode, seed)
    want_ndim = 5 if mode == "t2v" else 4
    samples: list[np.ndarray] = []
    for start in range(0, len(prompts), batch_size):
        captions = [c for c, _ in prompts[start:start + batch_size]]
        out = np.asarray(generate(captions))
        if out.ndim != want_ndim or len(out) != len(captions):
            raise ValueError(f"generate returned {out.shape} for {len(captions)} {mode} captions")
        samples.extend(out)
    return evaluate(samples, [s for _, s in prompts])


def oracle_generator(*, frames: int = 9, height: int = 64,
                     width: int = 64) -> Callable[[list[str]], np.ndarray]:
    """A perfect generator: parses each caption and renders it with the world.

    Returns:
        ``generate(captions)`` giving uint8 ``(B, H, W, 3)`` for image captions or
        ``(B, frames, H, W, 3)`` when the captions describe clips.
    """

    def generate(captions: list[str]) -> np.ndarray:
        specs = [world.parse_caption(c) for c in captions]
        if any(s.video for s in specs):
            return np.stack([world.render_clip(s, frames, height, width) for s in specs])
        return np.stack([world.render_image(s, height, width) for s in specs])

    return generate
