"""The storyboard export: the timeline's shots as one H.264 MP4.

No Qt, no torch: the studio gathers the frames of each shot and calls
:func:`render_storyboard`, which streams them through the encoder on whatever thread runs it.
:func:`plan_storyboard` is the frame selection alone (which source frame each film frame
shows); the export encodes it and the studio's storyboard playback shows it, so the two agree.

Rules:

* **Size and frame rate**: one for the whole film; by default the first shot's size and the
  first *video* shot's fps (a video editor's sequence takes its first clip's rate). An image
  request's fps is a field the studio hides in image modes, so it sets the film's rate only
  when there is no video shot at all.
* **Letterboxing**: a shot of another size is scaled to fit inside the film's frame, aspect
  ratio kept (Lanczos), and centred on black bars; nothing is cropped or stretched.
* **Trim**: a video shot uses source frames ``[in_frame, out_frame)`` (``out_frame`` None: to
  the end), clamped to the frames that exist.
* **Duration**: a video shot lasts as long as its trimmed frames at their own fps; an image
  shot lasts ``duration_s`` (None: :data:`~studio.core.document.DEFAULT_IMAGE_DURATION_S`).
  A shot becomes ``max(1, round(seconds * fps_out))`` output frames.
* **Frame-rate conversion** (nearest frame): output frame ``k`` of a shot shows the source
  frame whose display interval contains the middle of the output frame's interval, i.e.
  source index ``floor((k + 0.5) * fps_src / fps_out)``, clamped to the last frame. At equal
  rates this is the identity; going down drops frames evenly, going up repeats them evenly.
  No blending, so every output frame is a frame the model made.
* **Encoding**: H.264 (libx264), yuv420p (plays in browsers and QuickTime), ``+faststart``;
  odd film sides are rounded up to even by the letterbox. The file is written atomically; the
  container's ``comment`` tag holds a JSON description of the shots (their requests).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from studio.core.document import DEFAULT_IMAGE_DURATION_S
from studio.paths import atomic_write
from studio.store.export import H264Writer


@dataclass(frozen=True)
class StoryboardShot:
    """One shot's pixels and timing.

    Attributes:
        frames: uint8 (F, H, W, 3) (a memory map is fine); F = 1 for an image.
        fps: the source frame rate (for images: the request's fps).
        in_frame / out_frame: trim of a video (out exclusive; None = to the end).
        duration_s: length of an image shot in seconds (None: the default).
        info: JSON-able description kept in the file's metadata (e.g. the request).
    """

    frames: np.ndarray
    fps: float
    in_frame: int = 0
    out_frame: int | None = None
    duration_s: float | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def is_image(self) -> bool:
        """Whether the shot is a still image (one frame)."""
        return len(self.frames) == 1


@dataclass(frozen=True)
class StoryboardResult:
    """What :func:`render_storyboard` wrote: the path, frame count, size and frame rate."""

    path: Path
    num_frames: int
    width: int
    height: int
    fps: float


def source_indices(shot: StoryboardShot, fps_out: float) -> list[int]:
    """Index into ``shot.frames`` of every output frame of the shot (the module's rules)."""
    if fps_out <= 0 or not math.isfinite(fps_out):
        raise ValueError(f"fps: expected a positive frame rate, got {fps_out!r}")
    if shot.is_image:
        seconds = DEFAULT_IMAGE_DURATION_S if shot.duration_s is None else shot.duration_s
        return [0] * max(1, round(seconds * fps_out))
    total = len(shot.frames)
    start = min(max(shot.in_frame, 0), total - 1)
    stop = total if shot.out_frame is None else min(max(shot.out_frame, start + 1), total)
    n = stop - start
    fps_src = shot.fps if shot.fps > 0 else fps_out
    count = max(1, round(n * fps_out / fps_src))
    return [start + min(n - 1, math.floor((k + 0.5) * fps_src / fps_out)) for k in range(count)]


def letterbox(frame: np.ndarray, width: int, height: int) -> np.ndarray:
    """``frame`` (H, W, 3) scaled to fit inside ``width`` x ``height`` and centred on black."""
    h, w = frame.shape[:2]
    if (w, h) == (width, height):
        return np.ascontiguousarray(frame)
    scale = min(width / w, height / h)
    new_w, new_h = max(1, round(w * scale)), max(1, round(h * scale))
    image = Image.fromarray(np.ascontiguousarray(frame)).resize(
        (new_w, new_h), Image.Resampling.LANCZOS
    )
    out = np.zeros((height, width, 3), np.uint8)
    top, left = (height - new_h) // 2, (width - new_w) // 2
    out[top : top + new_h, left : left + new_w] = np.asarray(image)
    return out


@dataclass(frozen=True)
class StoryboardPlan:
    """Which source frame every frame of the film shows, by the module's rules.

    The MP4 export encodes exactly these frames and the studio's storyboard playback shows
    exactly these, so what is seen is what is exported.

    Attributes:
        shots: the shots, in order.
        indices: per shot, the source frame index of each of its output frames.
        width, height: the film's size (even).
        fps: the film's frame rate.
    """

    shots: tuple[StoryboardShot, ...]
    indices: tuple[tuple[int, ...], ...]
    width: int
    height: int
    fps: float
    # the last letterboxed source frame: an image shot (or a slowed clip) repeats one source
    # frame for many film frames, and playback must not resize it again each time
    _last: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def num_frames(self) -> int:
        """Frames of the whole film."""
        return sum(len(i) for i in self.indices)

    def entries(self) -> list[tuple[int, int]]:
        """(shot index, source frame index) of every film frame, in order."""
        return [(s, i) for s, indices in enumerate(self.indices) for i in indices]

    def locate(self, k: int) -> tuple[int, int]:
        """(shot index, source frame index) of film frame ``k``.

        Raises:
            IndexError: ``k`` is outside the film.
        """
        if k < 0:
            raise IndexError(f"frame: {k} is outside the film")
        for s, indices in enumerate(self.indices):
            if k < len(indices):
                return s, indices[k]
            k -= len(indices)
        raise IndexError("frame: past the end of the film")

    def frame(self, k: int) -> np.ndarray:
        """Film frame ``k``: uint8 (height, width, 3), letterboxed (do not write to it: a
        repeated source frame is returned again, not made again)."""
        s, i = self.locate(k)
        out = self._last.get((s, i))
        if out is None:
            out = letterbox(np.asarray(self.shots[s].frames[i]), self.width, self.height)
            self._last.clear()
            self._last[(s, i)] = out
        return out


def film_rate(clips: Sequence[tuple[int, float]]) -> float:
    """The frame rate a sequence of clips plays at: the first video's, i.e. the first
    ``(frame_count, fps)`` with more than one frame, else the first one's (stills alone). An
    image request's fps is a field the studio hides in image modes, so it must not set the
    rate of a film or a comparison that has a video in it.

    Raises:
        ValueError: ``clips`` is empty.
    """
    if not clips:
        raise ValueError("clips: expected at least one (frame_count, fps)")
    return float(next((fps for count, fps in clips if count > 1), clips[0][1]))


def plan_storyboard(
    shots: Sequence[StoryboardShot],
    *,
    width: int | None = None,
    height: int | None = None,
    fps: float | None = None,
) -> StoryboardPlan:
    """The film of ``shots`` (see :class:`StoryboardPlan`).

    Args:
        width, height, fps: the film's size and rate (default: the first shot's size and the
            first video shot's fps, or the first shot's without a video shot); odd sides
            are rounded up to even.
    Raises:
        ValueError: no shots, a shot without frames, or a bad size or fps.
    """
    if not shots:
        raise ValueError("shots: the timeline is empty; add shots before exporting")
    for i, shot in enumerate(shots):
        frames = shot.frames
        if frames.ndim != 4 or frames.shape[-1] != 3 or not len(frames):
            raise ValueError(f"shots[{i}]: expected frames (F, H, W, 3), got {frames.shape}")
    first = shots[0]
    width = width or int(first.frames.shape[2])
    height = height or int(first.frames.shape[1])
    fps = float(fps or film_rate([(len(s.frames), s.fps) for s in shots]))
    if width < 2 or height < 2:
        raise ValueError(f"size: {width}x{height} is too small")
    width, height = width + width % 2, height + height % 2
    indices = tuple(tuple(source_indices(shot, fps)) for shot in shots)
    return StoryboardPlan(tuple(shots), indices, width, height, fps)


def render_storyboard(
    path: str | Path,
    shots: Sequence[StoryboardShot],
    *,
    width: int | None = None,
    height: int | None = None,
    fps: float | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> StoryboardResult:
    """Encodes ``shots`` to an MP4 at ``path`` (atomically) by the module's rules
    (the frames of :func:`plan_storyboard`).

    Args:
        width, height, fps: the film's size and rate (default: as :func:`plan_storyboard`).
        progress: called with (frames written, total frames) now and then.
    Raises:
        ValueError: no shots, a shot without frames, or a bad size or fps.
    """
    film = plan_storyboard(shots, width=width, height=height, fps=fps)
    width, height, fps = film.width, film.height, film.fps
    plan = list(zip(film.shots, film.indices, strict=True))
    total = film.num_frames
    comment = json.dumps(
        {
            "storyboard": {
                "width": width,
                "height": height,
                "fps": fps,
                "shots": [
                    {
                        "in_frame": s.in_frame,
                        "out_frame": s.out_frame,
                        "duration_s": s.duration_s,
                        "frames": len(idx),
                        **s.info,
                    }
                    for s, idx in plan
                ],
            }
        },
        sort_keys=True,
        separators=(",", ":"),
    )

    def write(tmp: str) -> None:
        done = 0
        with H264Writer(tmp, width, height, fps, comment, crf=18) as writer:
            for shot, indices in plan:
                last_index, last_frame = -1, None
                for index in indices:
                    if index != last_index:  # repeated frames are boxed once
                        last_frame = letterbox(np.asarray(shot.frames[index]), width, height)
                        last_index = index
                    writer.write(last_frame)
                    done += 1
                    if progress is not None and (done % 16 == 0 or done == total):
                        progress(done, total)

    out = atomic_write(path, write)
    return StoryboardResult(out, total, width, height, fps)
