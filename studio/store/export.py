"""Writing results to PNG, MP4, GIF and WebP with the full request embedded, and reading it back.

Every file is written atomically (a temporary file in the same folder, fsynced, renamed).

Metadata:

* PNG: text chunks ``studio:request`` (the request's canonical JSON), ``studio:environment``
  (device, dtype, threads, versions) and an A1111-style ``parameters`` chunk that other tools
  (A1111, ComfyUI's loaders, Civitai) read.
* MP4: H.264, yuv420p (plays in browsers and QuickTime), ``+faststart``; the request and the
  environment as one JSON object in the container's ``comment`` tag.
* GIF: the same JSON object in the comment extension. WebP: in the XMP chunk.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, PngImagePlugin

from studio.paths import atomic_write, expand_path

IMAGE_SUFFIXES = (".png",)
VIDEO_SUFFIXES = (".mp4", ".gif", ".webp")
SUFFIXES = IMAGE_SUFFIXES + VIDEO_SUFFIXES
_XMP_TAG = "studio:metadata"


def a1111_parameters(request: dict[str, Any]) -> str:
    """The request as an A1111-style ``parameters`` text (prompt, negative, settings line)."""
    lines = [request.get("prompt", "")]
    if request.get("negative_prompt"):
        lines.append(f"Negative prompt: {request['negative_prompt']}")
    settings = [
        f"Steps: {request.get('steps')}",
        "Sampler: Euler (flow matching)",
        f"CFG scale: {request.get('guidance_scale')}",
        f"Seed: {request.get('seed')}",
        f"Size: {request.get('width')}x{request.get('height')}",
        f"Model hash: {str(request.get('model_hash', ''))[:10]}",
        f"Model: {request.get('model')}",
    ]
    if request.get("mode") == "i2i":
        settings.append(f"Denoising strength: {request.get('strength')}")
    lines.append(", ".join(settings))
    return "\n".join(lines)


def _metadata_blob(request_json: str, environment: dict[str, Any] | None) -> str:
    return json.dumps(
        {"request": json.loads(request_json), "environment": environment or {}},
        sort_keys=True,
        separators=(",", ":"),
    )


def check_output_path(out: str | Path, inputs: Sequence[str | Path | None] = (),
                      label: str = "out") -> Path:
    """The output file, checked before any work: not empty, not a folder, not a device, pipe
    or socket, not a read-only file, not one of the inputs, not one of a project's own files
    (its database, or anything in its ``media/`` folder: writing there would change another
    variant's stored result) (a link stands for its target, which is what is returned and
    written), and its folder writable (missing folders are not created here, only when the
    result is written: a refused request changes nothing on disk).

    Args:
        label: how messages name the file: ``"out"`` (the CLI's option, ``out='x.png'``) or
            words such as ``"export file"`` (the studio's, ``export file x.png``).
    Raises:
        ValueError: the problem, naming the file as given.
    """
    import os

    if not str(out).strip():
        raise ValueError(f"{_named(label, '')}: give a file name such as result.png")
    path = expand_path(out, "out")
    too_long = [part for part in path.parts if len(os.fsencode(part)) > 255]
    if too_long:
        raise ValueError(f"{_named(label, str(out)[:60] + '...')}: a file or folder name is "
                         f"{len(os.fsencode(too_long[0]))} bytes long; at most 255 are allowed")
    if len(os.fsencode(str(path))) >= 4096:
        raise ValueError(f"{_named(label, str(out)[:60] + '...')}: the path is longer than 4095 bytes")
    if path.is_symlink():  # written through: its target is replaced, the link kept (as cp)
        path = path.resolve()
    if path.is_dir():
        raise ValueError(f"{_named(label, str(out))}: is a folder; give a file name such as "
                         f"{path / 'a.png'}")
    if path.exists() and not path.is_file():
        raise ValueError(f"{_named(label, str(out))}: exists and is not a regular file (a device, a "
                         f"pipe or a socket); choose a file name")
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"{_named(label, str(out))}: the file exists and is read-only; choose another "
                         f"name or make it writable")
    resolved = path.resolve()
    _refuse_project_files(resolved, _named(label, str(out)))
    for given in inputs:
        try:
            same = bool(given) and expand_path(given, "input").resolve() == resolved
        except ValueError:  # a ~user of no user is not the output; its own check names it
            same = False
        if same:
            raise ValueError(f"{_named(label, str(out))}: is also an input file; choose another name")
    # the nearest folder that exists must be writable; missing folders below it are made
    # only when the result is written (a refused request leaves nothing behind)
    existing = next((p for p in (path.parent, *path.parent.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise ValueError(f"{_named(label, str(out))}: {existing} is a file, not a folder; choose "
                         f"another place")
    try:
        if existing is None:
            raise FileNotFoundError(f"no existing folder above {path.parent}")
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".studio-write-check.")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ValueError(f"{_named(label, str(out))}: cannot write in {path.parent} "
                         f"({exc.strerror or exc})") from None
    return path


def _refuse_project_files(resolved: Path, named: str) -> None:
    """Raises ValueError when ``resolved`` is a project's database or lock file or lies in
    its ``media/`` folder (of any project folder above it)."""
    from studio.store.project import DB_NAME, LOCK_NAME, MEDIA_DIR

    for folder in resolved.parents:
        if not (folder / DB_NAME).is_file():
            continue
        inside = resolved.relative_to(folder).parts
        if inside[0] == MEDIA_DIR or (len(inside) == 1 and inside[0] in (
                DB_NAME, f"{DB_NAME}-wal", f"{DB_NAME}-shm", f"{DB_NAME}-journal",
                LOCK_NAME)):
            raise ValueError(f"{named}: is one of the project's own files in {folder} "
                             f"(its database or stored media); choose a place outside "
                             f"{folder / MEDIA_DIR}")


def _named(label: str, shown: str) -> str:
    """A file as messages name it: ``out='x.png'`` for an option's name, else ``export file
    x.png``."""
    return f"{label}={shown!r}" if label.isidentifier() else f"{label} {shown}"


def check_suffix(path: str | Path, num_frames: int, label: str = "out") -> str:
    """The output suffix, checked against the result's frame count.

    Args:
        label: see :func:`check_output_path`.
    Raises:
        ValueError: unknown suffix, or a video asked for as PNG (message names the file).
    """
    suffix = Path(path).suffix.lower()
    if suffix not in SUFFIXES:
        raise ValueError(f"{_named(label, str(path))}: the file must end in "
                         f"{', '.join(SUFFIXES)}")
    if num_frames > 1 and suffix in IMAGE_SUFFIXES:
        raise ValueError(f"{_named(label, str(path))}: a video of {num_frames} frames needs "
                         f"{', '.join(VIDEO_SUFFIXES)}")
    return suffix


#: Shortest GIF frame time written, milliseconds: browsers and most viewers play GIF frame
#: times of 10 ms or less as about 100 ms, so faster GIFs would play ten times too slowly.
GIF_MIN_FRAME_MS = 20


def frame_duration_ms(fps: float, suffix: str = ".webp") -> int:
    """The per-frame duration written to GIF (at least :data:`GIF_MIN_FRAME_MS`, i.e. at most
    50 fps) and WebP (at least 10) files, milliseconds."""
    floor = GIF_MIN_FRAME_MS if suffix.lower() == ".gif" else 10
    return max(floor, round(1000 / fps))


def playback_fps(suffix: str, fps: float) -> float:
    """The rate a video file written at ``fps`` actually plays at, frames per second: GIF
    stores frame times in 1/100 s (Pillow truncates the milliseconds) and is written at most
    at 50 fps (:data:`GIF_MIN_FRAME_MS`), WebP in milliseconds; MP4 keeps the rate."""
    suffix = suffix.lower()
    if suffix == ".gif":
        return 100.0 / max(1, frame_duration_ms(fps, suffix) // 10)
    if suffix == ".webp":
        return 1000.0 / frame_duration_ms(fps)
    return float(fps)


def write_result(
    path: str | Path,
    frames: np.ndarray,
    fps: float,
    request_json: str,
    environment: dict[str, Any] | None = None,
    *,
    replace: bool = True,
) -> Path:
    """Writes ``frames`` (uint8 (F, H, W, 3)) to ``path`` by its suffix, atomically.

    Args:
        fps: frames per second (videos).
        replace: False never replaces an existing file (see :func:`atomic_write`).
    Raises:
        ValueError: see :func:`check_suffix`; or frames of the wrong shape or dtype.
        FileExistsError: ``replace`` is False and ``path`` exists.
    """
    frames = np.asarray(frames)
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3 or not len(frames):
        raise ValueError(f"frames: expected uint8 (F, H, W, 3), got {frames.dtype} {frames.shape}")
    suffix = check_suffix(path, len(frames))
    blob = _metadata_blob(request_json, environment)
    if suffix == ".png":

        def write(tmp: str) -> None:
            info = PngImagePlugin.PngInfo()
            info.add_itxt("studio:request", request_json)
            info.add_itxt("studio:environment", json.dumps(environment or {}, sort_keys=True))
            info.add_text("parameters", a1111_parameters(json.loads(request_json)))
            Image.fromarray(frames[0], "RGB").save(tmp, format="PNG", pnginfo=info)
    elif suffix == ".mp4":

        def write(tmp: str) -> None:
            _write_mp4(tmp, frames, fps, blob)
    else:

        def write(tmp: str) -> None:
            images = [Image.fromarray(f, "RGB") for f in frames]
            duration = frame_duration_ms(fps, suffix)
            if suffix == ".gif":
                images[0].save(
                    tmp,
                    format="GIF",
                    save_all=True,
                    append_images=images[1:],
                    duration=duration,
                    loop=0,
                    comment=blob.encode("utf-8"),
                )
            else:
                xmp = (
                    f'<x:xmpmeta xmlns:x="adobe:ns:meta/"><{_XMP_TAG}><![CDATA[{blob}]]>'
                    f"</{_XMP_TAG}></x:xmpmeta>"
                )
                images[0].save(
                    tmp,
                    format="WEBP",
                    save_all=True,
                    append_images=images[1:],
                    duration=duration,
                    loop=0,
                    lossless=True,
                    xmp=xmp.encode(),
                )

    return atomic_write(path, write, replace=replace)


class H264Writer:
    """Streams RGB frames into an H.264 MP4 (yuv420p, ``+faststart``, one encoder thread so the
    same frames always give the same bytes), with ``comment`` in the container metadata.

    Use as a context manager; :meth:`write` takes uint8 (H, W, 3) frames of the size given
    (odd sides are padded by edge replication to the even size yuv420p needs).
    """

    def __init__(self, path: str, width: int, height: int, fps: float, comment: str, *,
                 crf: int = 16):
        import av

        self.width, self.height = width, height
        self.container = av.open(path, mode="w", format="mp4",
                                 options={"movflags": "+faststart+use_metadata_tags"})
        self.container.metadata["comment"] = comment
        self.stream = self.container.add_stream("libx264",
                                                rate=Fraction(fps).limit_denominator(1001))
        self.stream.width, self.stream.height = width + width % 2, height + height % 2
        self.stream.pix_fmt = "yuv420p"
        # One encoder thread: x264's frame threads can make the bytes depend on timing, and
        # the same request must give the same file (case 003).
        self.stream.options = {"crf": str(crf), "preset": "medium", "threads": "1"}
        self.stream.codec_context.thread_count = 1

    def write(self, frame: np.ndarray) -> None:
        import av

        if frame.shape[:2] != (self.stream.height, self.stream.width):
            frame = np.pad(frame, ((0, self.stream.height - frame.shape[0]),
                                   (0, self.stream.width - frame.shape[1]), (0, 0)),
                           mode="edge")
        for packet in self.stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
            self.container.mux(packet)

    def __enter__(self) -> H264Writer:
        return self

    def __exit__(self, *exc) -> None:
        try:
            if exc[0] is None:
                for packet in self.stream.encode():
                    self.container.mux(packet)
        finally:
            self.container.close()


def _write_mp4(path: str, frames: np.ndarray, fps: float, comment: str) -> None:
    _, h, w, _ = frames.shape
    with H264Writer(path, w, h, fps, comment) as writer:
        for frame in frames:
            writer.write(frame)


def as_stored(frames: np.ndarray, suffix: str, fps: float) -> np.ndarray:
    """``frames`` as a file of ``suffix`` would decode them: unchanged for the lossless PNG
    and WebP, through a temporary file for H.264 MP4 and palette GIF. Lets a re-run be
    compared exactly with the file it was made from, whatever the new file's format.

    Args:
        frames: uint8 (F, H, W, 3).
        suffix: ``.png``, ``.webp``, ``.gif`` or ``.mp4`` (case-insensitive).
        fps: frames per second (MP4 and GIF).
    Returns:
        uint8 (F, H, W, 3).
    Raises:
        ValueError: an unknown suffix (see :func:`check_suffix`).
    """
    suffix = check_suffix(f"x{suffix}", len(frames))
    if suffix in (".png", ".webp"):
        return np.asarray(frames)
    with tempfile.TemporaryDirectory(prefix="studio-as-stored-") as folder:
        path = Path(folder) / f"frames{suffix}"
        write_result(path, np.ascontiguousarray(frames), fps, "{}")
        return read_frames(path)


def read_metadata(path: str | Path) -> dict[str, Any]:
    """The request and environment embedded in a file written by :func:`write_result`.

    Returns:
        ``{"request": dict, "environment": dict}``.
    Raises:
        ValueError: the file cannot be read or carries no studio metadata (names the file).
    """
    path = Path(path)
    suffix = path.suffix.lower()
    try:
        if suffix == ".mp4":
            import av

            with av.open(str(path)) as container:
                text = container.metadata.get("comment", "")
            data = json.loads(text) if text else None
        elif suffix == ".png":
            with Image.open(path) as img:
                img.load()
                raw = img.text.get("studio:request") if hasattr(img, "text") else None
                env = img.text.get("studio:environment", "{}") if raw else "{}"
            data = {"request": json.loads(raw), "environment": json.loads(env)} if raw else None
        elif suffix in (".gif", ".webp"):
            with Image.open(path) as img:
                if suffix == ".gif":
                    raw = img.info.get("comment", b"")
                else:
                    raw = img.info.get("xmp", b"")
                    raw = raw.encode() if isinstance(raw, str) else raw
                    start, end = raw.find(b"<![CDATA["), raw.find(b"]]>")
                    raw = raw[start + 9 : end] if start >= 0 and end > start else b""
            data = json.loads(raw.decode("utf-8")) if raw else None
        else:
            raise ValueError(f"{path}: not a PNG, MP4, GIF or WebP file")
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read its metadata ({exc})") from None
    except Exception as exc:  # PyAV raises its own error types for damaged files
        raise ValueError(
            f"{path}: cannot read its metadata ({type(exc).__name__}: {exc})"
        ) from None
    if not data or "request" not in data:
        raise ValueError(f"{path}: carries no Diffusion Studio request")
    return data


def read_frames(path: str | Path) -> np.ndarray:
    """Decodes a result file back to uint8 (F, H, W, 3) (tests and the compare view)."""
    path = Path(path)
    if path.suffix.lower() == ".mp4":
        import av

        with av.open(str(path)) as container:
            return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
    with Image.open(path) as img:
        out = []
        for i in range(getattr(img, "n_frames", 1)):
            img.seek(i)
            out.append(np.asarray(img.convert("RGB")))
        return np.stack(out)
