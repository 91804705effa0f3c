"""Headless entry point over the engine API: ``studio render``, ``studio models``.

Exit codes: 0 done, 2 bad input (one line per problem, naming the field; no traceback),
1 internal error (a message and the log file holding the traceback), 130 interrupted (Ctrl+C),
143 terminated (SIGTERM; stopped the same way: nothing half written).
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import secrets
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from studio.paths import expand_path

EXIT_OK, EXIT_INTERNAL, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_TERMINATED = 143  # 128 + SIGTERM


class Terminated(BaseException):
    """Raised in the main thread by SIGTERM (``kill``, a logout): unwinds like Ctrl+C, so
    the engine stops and no temporary file is left (a BaseException: ``except Exception``
    blocks do not swallow it)."""


class BadInput(Exception):
    """A problem the user can fix; printed as ``error: <message>`` with exit code 2."""


FLAGS = {"num_frames": "--frames", "guidance_scale": "--guidance", "init_image": "--init-image",
         "first_frame": "--first-frame", "negative_prompt": "--negative-prompt",
         "references": "--reference", "optimization.profile": "--profile"}


def problem_line(problem) -> str:
    """A request problem with the CLI flag that sets the field, e.g. ``num_frames (--frames)``."""
    text = str(problem)
    base = problem.field.split("[")[0]
    flag = FLAGS.get(base, f"--{base.replace('_', '-')}")
    if base in ("width x height",):
        return text
    return text.replace(problem.field, f"{problem.field} ({flag})", 1)


def check_output_path(out: str, inputs: list[str]) -> Path:
    """:func:`studio.store.export.check_output_path`, its problems as BadInput."""
    from studio.store.export import check_output_path as check

    try:
        return check(out, inputs)
    except ValueError as exc:
        raise BadInput(str(exc)) from None


def check_model_folders(folders: list[str]) -> None:
    """Raises BadInput naming the first ``--model-folder`` that is not a folder."""
    for folder in folders:
        try:
            is_dir = expand_path(folder, "model-folder").is_dir()
        except ValueError as exc:
            raise BadInput(str(exc)) from None
        if not is_dir:
            raise BadInput(f"model-folder={folder!r}: is not a folder")


def _positive_float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


class OneLineErrors(argparse.ArgumentParser):
    """argparse, its errors on one line (``<prog>: error: ...; see <prog> --help``, exit
    status 2) rather than the whole usage first: one line per problem, as every other bad
    input the CLI reports."""

    def error(self, message: str):
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message}; see {self.prog} --help\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrors(prog="studio", allow_abbrev=False,
                           description=__doc__.splitlines()[0].replace("``", "`"))
    sub = parser.add_subparsers(dest="command", required=True)

    r = sub.add_parser("render", help="generate an image or a video", allow_abbrev=False,
                       description="Generate an image or a video; the request is embedded in "
                                   "the output file. Unset values take the model's defaults.")
    r.add_argument("--prompt", default=None, help="what to generate")
    r.add_argument("--negative-prompt", default=None, help="what to avoid")
    r.add_argument("--mode", choices=["t2i", "i2i", "t2v", "i2v", "r2v"], default=None,
                   help="t2i text-to-image (default), i2i image-to-image, t2v text-to-video, "
                        "i2v image-to-video, r2v reference-to-video")
    r.add_argument("--model", default=None, help="model id (default: the embedded model; "
                                                 "see `studio models`)")
    r.add_argument("--model-folder", action="append", default=[],
                   help="a folder of diffusers models to search (repeatable)")
    r.add_argument("--seed", type=int, default=None, help="noise seed (default: random)")
    r.add_argument("--steps", type=int, default=None, help="denoising steps")
    r.add_argument("--guidance", type=_positive_float, default=None,
                   help="classifier-free guidance scale")
    r.add_argument("--width", type=int, default=None, help="width in pixels")
    r.add_argument("--height", type=int, default=None, help="height in pixels")
    r.add_argument("--frames", type=int, default=None, help="video frames")
    r.add_argument("--fps", type=_positive_float, default=None, help="video frames per second")
    r.add_argument("--init-image", default=None, help="image-to-image: the starting image")
    r.add_argument("--strength", type=_positive_float, default=None,
                   help="image-to-image: how much to change, in [0, 1] (default 0.8); "
                        "steps x strength steps are run, and must be at least one")
    r.add_argument("--mask", default=None, help="image-to-image: white = repaint")
    r.add_argument("--first-frame", default=None, help="image-to-video: the first frame")
    r.add_argument("--reference", action="append", default=[],
                   help="reference-to-video: a reference image (repeatable)")
    r.add_argument("--profile", choices=["exact", "quality", "balanced", "fast"], default=None,
                   help="optimization profile (default exact: the stock result)")
    r.add_argument("--from", dest="from_file", default=None, metavar="FILE",
                   help="re-run the request embedded in a PNG/MP4/GIF/WebP made by the studio "
                        "(other options override it; input images must be given again)")
    r.add_argument("--device", default="auto", help="auto, cpu or cuda[:N]")
    r.add_argument("--out", required=True, help="output file: .png, .mp4, .gif or .webp")
    r.add_argument("--overwrite", action="store_true",
                   help="replace --out when it exists (otherwise an existing file is refused: "
                        "a studio output carries the request that made it); a link is "
                        "followed and its target replaced")
    r.add_argument("--quiet", action="store_true", help="no progress bar")

    m = sub.add_parser("models", help="list the models the studio can see", allow_abbrev=False)
    m.add_argument("--model-folder", action="append", default=[])
    m.add_argument("--no-hf-cache", action="store_true", help="skip the Hugging Face cache")
    return parser


# -- request building ---------------------------------------------------------------------
def _load_inputs(args, mode: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Loads the input images; returns (request fields, content id -> pixels)."""
    from studio.core.media import load_user_image
    from studio.core.request import MediaRef

    fields: dict[str, Any] = {}
    pixels: dict[str, Any] = {}

    def load(path: str, field: str, mask: bool = False) -> MediaRef:
        img = load_user_image(path, field, mask=mask)
        pixels[img.content_id] = img.pixels
        return MediaRef(img.content_id, img.source, img.conversion)

    if args.init_image:
        fields["init_image"] = load(args.init_image, "init_image")
    if args.mask:
        fields["mask"] = load(args.mask, "mask", mask=True)
    if args.first_frame:
        fields["first_frame"] = load(args.first_frame, "first_frame")
    if args.reference:
        fields["references"] = tuple(load(p, f"references[{i}]")
                                     for i, p in enumerate(args.reference))
    return fields, pixels


PLAIN_CONVERSIONS = ("8-bit RGB as is", "mask thresholded at 128 (white = repaint)")


def _conversion_notes(fields: dict[str, Any]) -> list[str]:
    """One note per input image that :mod:`studio.core.media` changed on the way in (alpha
    composited on white, grayscale or 16-bit scaled, palette or CMYK converted, EXIF
    orientation, first frame of an animation), named by its field and file; nothing for an
    8-bit RGB image (or a mask) taken as it is."""
    notes = []
    for name, value in fields.items():
        refs = value if isinstance(value, tuple) else (value,)
        for i, ref in enumerate(refs):
            steps = [s for s in ref.conversion.split("; ") if s not in PLAIN_CONVERSIONS]
            if steps:
                label = f"{name}[{i}]" if isinstance(value, tuple) else name
                notes.append(f"{label}: {ref.source}: {'; '.join(steps)}")
    return notes


def build_request(args, registry) -> tuple[Any, dict[str, Any], list[str]]:
    """Turns CLI arguments into a checked request.

    Returns:
        (request, input pixels by content id, notes for the user).
    Raises:
        BadInput: any problem (the message names the field).
    """
    from studio.core.media import InputImageError, fit_size
    from studio.core.request import GenerationRequest, OptimizationSettings
    from studio.engine.models.folders import ModelError
    from studio.store.export import read_metadata

    for name in ("init_image", "mask", "first_frame", "from_file"):
        value = getattr(args, name)
        if value is not None and not value.strip():  # '' would silently change the mode
            flag = {"from_file": "--from", "mask": "--mask"}.get(name) or FLAGS[name]
            raise BadInput(f"{name.removesuffix('_file')} ({flag})='': give an image file")
    for i, value in enumerate(args.reference):
        if not value.strip():
            raise BadInput(f"references[{i}] (--reference)='': give an image file")
    if args.mask and not args.init_image:
        raise BadInput(f"mask (--mask)={args.mask!r}: marks what to repaint in an image; give "
                       f"that image with --init-image")
    base: dict[str, Any] = {}
    notes: list[str] = []
    if args.from_file:
        try:
            given = expand_path(args.from_file, "from")
        except ValueError as exc:
            raise BadInput(str(exc)) from None
        if not given.is_file():
            what = "is a folder" if given.is_dir() else "no such file"
            raise BadInput(f"from={args.from_file!r}: {what} (give an image or video that "
                           f"studio rendered)")
        try:
            recorded = read_metadata(args.from_file)["request"]
            # a malformed or hand-edited request (a field of the wrong type) is refused here
            problems = GenerationRequest.from_dict(recorded).validate(None)
            if problems:
                raise ValueError("; ".join(problem_line(p) for p in problems[:3]))
        except ValueError as exc:
            raise BadInput(f"from: {args.from_file}: the embedded request is not usable "
                           f"({exc})") from None
        base = dict(recorded)
        base.pop("schema", None)
    given = [(flag, flag_mode) for flag, flag_mode, value in (
        ("--init-image", "i2i", args.init_image or args.mask),
        ("--first-frame", "i2v", args.first_frame),
        ("--reference", "r2v", args.reference)) if value]
    if len(given) > 1 and not (args.mode or base.get("mode")):
        raise BadInput(f"mode: {' and '.join(f for f, _ in given)} belong to different modes "
                       f"({', '.join(m for _, m in given)}); pass --mode to choose one")
    mode = args.mode or base.get("mode") or ("i2i" if args.init_image else
                                             "i2v" if args.first_frame else
                                             "r2v" if args.reference else None)
    mode_from_suffix = ""  # the output's suffix when it chose the mode
    if mode is None:  # only a prompt: the output's suffix says image or video
        from studio.store.export import IMAGE_SUFFIXES

        suffix = Path(args.out).suffix.lower()
        frames = args.frames if args.frames is not None else base.get("num_frames")
        # .mp4 and .gif are taken as videos, .webp (a common still format) only with --frames
        # (a frame count below 1 decides nothing: the request's check then names the video
        # range for a video suffix)
        counted = isinstance(frames, int) and frames >= 1
        video = suffix not in IMAGE_SUFFIXES and (
            counted and frames > 1 or not counted and suffix in (".mp4", ".gif"))
        mode = "t2v" if video else "t2i"
        mode_from_suffix = suffix
        if video and not counted:
            notes.append(f"mode: text-to-video for the {suffix} output (pass --mode t2i for "
                         f"a one-frame {suffix})")
    if args.model is not None and not args.model.strip():
        raise BadInput("model='': give a model id or folder (`studio models` lists them), or "
                       "leave --model out for the embedded model")
    model_id = args.model or base.get("model") or "embedded"
    try:
        entry = registry.resolve(model_id)
    except ModelError as exc:
        raise BadInput(str(exc)) from None
    caps = entry.capabilities
    try:
        fields, pixels = _load_inputs(args, mode)
    except InputImageError as exc:
        raise BadInput(str(exc)) from None
    notes.extend(_conversion_notes(fields))
    if base:
        for name in ("init_image", "mask", "first_frame"):
            recorded = base.get(name)
            if recorded and name not in fields:
                raise BadInput(f"{name}: the request in {args.from_file} used an input image "
                               f"(content id {recorded['content_id']}); give it again with "
                               f"--{name.replace('_', '-')}")
            if recorded and fields[name].content_id != recorded["content_id"]:
                raise BadInput(f"{name}: the image given is not the one the request in "
                               f"{args.from_file} used (content id {recorded['content_id']})")
        if base.get("references") and "references" not in fields:
            raise BadInput(f"references: the request in {args.from_file} used reference "
                           f"images; give them again with --reference")
        if "references" in fields and base.get("references"):
            want = [r["content_id"] for r in base["references"]]
            got = [r.content_id for r in fields["references"]]
            if want != got:
                raise BadInput("references: the images given are not the ones the request "
                               "used (content ids differ)")
    video = mode in ("t2v", "i2v", "r2v")

    def pick(cli_value, key, default):
        if cli_value is not None:
            return cli_value
        return base.get(key, default)

    width, height = args.width, args.height
    size_from_input = False  # the output size was derived from the input image (and said)
    if width is None and height is None and "width" not in base:
        source = fields.get("init_image") or fields.get("first_frame")
        if source is not None:
            w0, h0 = pixels[source.content_id].shape[1], pixels[source.content_id].shape[0]
            width, height = fit_size((w0, h0), caps.spatial_multiple, caps.max_pixels,
                                     caps.min_size, caps.max_size)
            if (width, height) != (w0, h0):
                size_from_input = True
                notes.append(f"size: using {width}x{height} for the {w0}x{h0} input image "
                             f"(nearest multiple of {caps.spatial_multiple} within the model's "
                             f"limits; resized to cover and centre-cropped)")
    if "mask" in fields and "init_image" in fields:
        mh, mw = pixels[fields["mask"].content_id].shape[:2]
        ih, iw = pixels[fields["init_image"].content_id].shape[:2]
        if (mw, mh) != (iw, ih):  # resized apart, the mask would cover the wrong area
            raise BadInput(f"mask: {mw}x{mh} does not match the init image's {iw}x{ih}; "
                           f"the mask must be the init image's size (white = repaint)")
    out_w = width if width is not None else base.get("width", caps.default_width)
    out_h = height if height is not None else base.get("height", caps.default_height)
    for name, ref in list(fields.items()):
        refs = ref if isinstance(ref, tuple) else (ref,)
        fitted = []
        for r in refs:
            h0, w0 = pixels[r.content_id].shape[:2]
            if (w0, h0) != (out_w, out_h) and isinstance(out_w, int) and isinstance(out_h, int):
                r = replace(r, conversion=f"{r.conversion}; {w0}x{h0} resized to cover "
                                          f"{out_w}x{out_h} and centre-cropped")
                if not size_from_input and name != "mask":
                    cropped = "" if w0 * out_h == h0 * out_w else " and centre-cropped"
                    notes.append(f"{name}: the {w0}x{h0} image is resized to cover "
                                 f"{out_w}x{out_h}{cropped} (the output size)")
            fitted.append(r)
        fields[name] = tuple(fitted) if isinstance(ref, tuple) else fitted[0]
    req_fields = dict(
        mode=mode, model=entry.model_id,
        prompt=pick(args.prompt, "prompt", None),
        negative_prompt=pick(args.negative_prompt, "negative_prompt", ""),
        seed=pick(args.seed, "seed", None),
        steps=pick(args.steps, "steps", caps.default_steps),
        guidance_scale=pick(args.guidance, "guidance_scale", caps.default_guidance),
        width=out_w, height=out_h,
        num_frames=pick(args.frames, "num_frames", caps.default_frames if video else 1),
        fps=pick(args.fps, "fps", caps.default_fps),
        strength=pick(args.strength, "strength", 0.8),
        model_hash=registry.content_hash(entry),
        optimization=OptimizationSettings(
            profile=args.profile or base.get("optimization", {}).get("profile", "exact")),
        **fields)
    if args.strength is not None and mode != "i2i":
        raise BadInput(f"strength: only used in mode i2i (with --init-image); this is {mode}")
    if args.fps is not None and not video:
        raise BadInput(f"fps: only used for videos (t2v, i2v, r2v); this is {mode}")
    if not video and args.frames is None:
        req_fields["num_frames"] = 1
    if video and req_fields["num_frames"] == 1 and args.frames is None:
        req_fields["num_frames"] = caps.default_frames
    if req_fields["prompt"] is None:
        if mode in ("t2i", "t2v"):
            raise BadInput("prompt: required for text-to-image/video (--prompt \"...\")")
        req_fields["prompt"] = ""
    if req_fields["seed"] is None:
        req_fields["seed"] = secrets.randbelow(2**32)
        notes.append(f"seed: {req_fields['seed']} (random; pass --seed to choose)")
    if base.get("model_hash") and base["model_hash"] != req_fields["model_hash"] and \
            not args.model:
        notes.append(f"model: the weights of {entry.model_id} changed since the file was made "
                     f"(hash {base['model_hash'][:10]} -> {req_fields['model_hash'][:10]}); "
                     f"pixels may differ")
    request = GenerationRequest(**req_fields)
    problems = request.validate(caps)
    if problems:
        lines = [problem_line(p) for p in problems]
        if args.strength is None:  # say where a strength the user never gave came from
            lines = [line.replace("(--strength)=", "(--strength, the default)=", 1)
                     for line in lines]
        if mode_from_suffix:  # the user never chose the mode: say what did
            lines = [line.replace(f"in image mode {mode}", f"in image mode {mode} (an image, "
                                  f"from the {mode_from_suffix} suffix of --out; use .mp4 "
                                  f"for a video)", 1) for line in lines]
        raise BadInput("\nerror: ".join(lines))
    return request, pixels, notes


# -- commands -----------------------------------------------------------------------------
class ProgressBar:
    """A one-line progress bar on stderr (only when stderr is a terminal, unless forced)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.last = 0.0

    def update(self, step: int, total: int, elapsed: float, eta: float) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self.last < 0.1 and step < total:
            return
        self.last = now
        width = 30
        done = int(width * step / max(total, 1))
        left = f"~{eta:4.1f}s left" if eta >= 0 else "estimating time left"
        sys.stderr.write(f"\r[{'#' * done}{'.' * (width - done)}] step {step}/{total} "
                         f"{elapsed:5.1f}s elapsed, {left}")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


async def _run_job(request, pixels, config, bar: ProgressBar):
    from studio.engine import events as ev
    from studio.engine.api import Engine

    async with Engine(config=config) as engine, engine.events() as stream:
        job = engine.submit(request, pixels)
        try:
            async for event in stream:
                if isinstance(event, ev.Progress):
                    bar.update(event.step, event.total_steps, event.elapsed_s, event.eta_s)
                if event.terminal and event.job_id == job:
                    return event
        except asyncio.CancelledError:
            engine.cancel(job)
            raise
    raise RuntimeError("the engine closed before the job ended")


def cmd_render(args) -> int:
    from studio.engine import events as ev
    from studio.engine.attention_config import attention_override
    from studio.engine.executor import resolve_device
    from studio.engine.models.registry import ModelRegistry
    from studio.engine.worker import WorkerConfig, cpu_threads_auto
    from studio.store.export import check_suffix

    try:
        if not args.device.strip():
            raise ValueError("device='': must be auto, cpu, cuda or cuda:N")
        resolve_device(args.device)
        attention_override()  # a bad STUDIO_ATTENTION is bad input, found before model work
        cpu_threads_auto()  # and a bad STUDIO_CPU_THREADS
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    check_model_folders(args.model_folder)
    out_path = check_output_path(args.out, [args.init_image, args.mask, args.first_frame,
                                            args.from_file, *args.reference])
    if out_path.exists() and not args.overwrite:
        raise BadInput(f"out={args.out!r}: the file exists; pass --overwrite to replace it, "
                       f"or choose another name")
    registry = ModelRegistry(args.model_folder)
    request, pixels, notes = build_request(args, registry)
    try:
        check_suffix(args.out, request.num_frames)
    except ValueError as exc:
        inferred = "" if args.mode else f" (mode {request.mode})"
        raise BadInput(f"{exc}{inferred}") from None
    if Path(out_path).suffix.lower() != Path(args.out).suffix.lower():
        # a link is written through: its target's name decides the format
        try:
            check_suffix(out_path, request.num_frames)
        except ValueError:
            raise BadInput(f"out={args.out!r}: is a link to {str(out_path)!r}, which is what "
                           f"would be written; its name must end in "
                           f"{Path(args.out).suffix.lower()} too") from None
    original = None
    if args.from_file:  # decoded before the job: a damaged file must not cost the render
        from studio.store.export import read_frames, read_metadata

        try:
            original = (read_frames(args.from_file), read_metadata(args.from_file))
        except Exception as exc:  # any decoder error (PIL, PyAV): only the comparison is lost
            notes.append(f"from: cannot decode the frames of {args.from_file} "
                         f"({type(exc).__name__}: {str(exc)[:120]}), so the new result is "
                         f"not compared with it")
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    config = WorkerConfig(model_folders=tuple(args.model_folder), device=args.device)
    bar = ProgressBar(not args.quiet and sys.stderr.isatty())
    try:
        event = asyncio.run(_run_job(request, pixels, config, bar))
    finally:
        bar.close()
    if isinstance(event, ev.Failed):
        if event.kind in (ev.BAD_INPUT, ev.MODEL_ERROR):
            raise BadInput(event.message)
        print(f"error: {event.message}", file=sys.stderr)
        return EXIT_INTERNAL
    if isinstance(event, ev.Cancelled):
        print("cancelled", file=sys.stderr)
        return EXIT_INTERRUPTED
    path = write_new_result(out_path, event, args.overwrite)
    f, h, w, _ = event.frames.shape
    what = f"{w}x{h} image" if f == 1 else f"{w}x{h} video, {f} frames at {event.fps:g} fps"
    t = event.timings
    print(f"wrote {path} ({what}; seed {request.seed}; {t['total']:.2f}s: load "
          f"{t['load']:.2f}s, denoise {t['denoise']:.2f}s, decode {t['decode']:.2f}s)")
    for note in event.notes:
        print(f"note: {note}", file=sys.stderr)
    if f > 1:
        from studio.store.export import playback_fps

        plays = playback_fps(path.suffix, event.fps)
        if abs(plays - event.fps) > 0.01 * event.fps:
            why = ("stores frame times in 1/100 s and viewers slow frames under 20 ms down, "
                   "so it is written to play at" if path.suffix.lower() == ".gif" else
                   "stores frame times in 1/1000 s, so it plays at")
            print(f"note: fps: {path.suffix} {why} {plays:.3g} fps, not {event.fps:g} "
                  f"(.mp4 keeps the exact rate)", file=sys.stderr)
    if original is not None:
        from studio.store.export import read_frames

        print(compare_with_original(args.from_file, original, event, read_frames(path), path))
    return EXIT_OK


def write_new_result(out_path: Path, event, overwrite: bool) -> Path:
    """Writes the job's result to ``out_path``; without ``overwrite`` never over a file that
    appeared there while the job ran (another render, another program): the result then
    goes to the first free ``<stem>-2<suffix>``, ``-3``, ... and a note says so, so neither
    file is lost."""
    from studio.store.export import write_result

    candidates = [out_path] + [out_path.with_name(f"{out_path.stem}-{n}{out_path.suffix}")
                               for n in range(2, 1000)]
    for candidate in candidates:
        try:
            path = write_result(candidate, event.frames, event.fps, event.request_json,
                                event.environment, replace=overwrite)
        except FileExistsError:
            continue
        if candidate != out_path:
            print(f"note: out: {out_path} was created by something else while this job "
                  f"ran; kept it, and wrote this result to {path}", file=sys.stderr)
        return path
    raise BadInput(f"out={str(out_path)!r}: it and {out_path.stem}-2 ... -999 all exist")


def compare_with_original(name: str, original, event, written, new_path) -> str:
    """How a re-run compares with the file it was made from: the fields the options changed,
    or identical pixels, or the PSNR and what of the environment differs (a different device
    or library version explains it)."""
    import json

    import numpy as np

    from studio.store.export import as_stored

    a, meta = original  # decoded before the new file was written (it may replace it)
    old, new = dict(meta["request"]), json.loads(event.request_json)
    changed = sorted(k for k in set(old) | set(new)
                     if k not in ("schema", "model_hash") and old.get(k) != new.get(k))
    if changed:  # a changed request (an image re-run as a video, say) has nothing to compare
        return f"re-ran the request of {name} with changes to: {', '.join(changed)}"
    # the new frames as the original's format stores them (H.264 and GIF are lossy), so the
    # comparison is like for like whatever format the new file has
    b = written if Path(name).suffix.lower() == Path(new_path).suffix.lower() else as_stored(
        event.frames, Path(name).suffix, event.fps)
    environment = event.environment
    if a.shape != b.shape:
        return f"reproduced {name}: different shape {a.shape} -> {b.shape}"
    diff = np.abs(a.astype(np.int16) - b.astype(np.int16))
    if not diff.any():
        return f"reproduced {name}: identical pixels"
    mse = float((diff.astype(np.float64) ** 2).mean())
    psnr = 10 * np.log10(255.0**2 / mse)
    env = meta.get("environment", {})
    diffs = [f"{k}: {env.get(k)} -> {environment.get(k)}" for k in sorted(environment)
             if env.get(k) != environment.get(k)]
    why = "; ".join(diffs) or "same recorded environment"
    return (f"reproduced {name}: pixels differ (max {int(diff.max())}/255, PSNR "
            f"{psnr:.1f} dB; {why})")


def cmd_models(args) -> int:
    from studio.engine.models.registry import ModelRegistry

    check_model_folders(args.model_folder)
    registry = ModelRegistry(args.model_folder, include_hf_cache=not args.no_hf_cache)
    entries = registry.list()
    rows = [("MODEL", "FAMILY", "MODES", "SIZE", "DTYPE", "STATUS")]
    for e in entries:
        modes = ",".join(m for m in ("t2i", "i2i", "t2v", "i2v", "r2v")
                         if e.capabilities and m in e.capabilities.modes)
        rows.append((e.model_id, e.family, modes or "-", _size(e.size_bytes), e.dtype or "-",
                     "ok" if e.usable else f"unusable: {e.error}"))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for r in rows:
        print("  ".join(c.ljust(widths[i]) for i, c in enumerate(r[:5])) + "  " + r[5])
    return EXIT_OK


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The parsed command line; an unknown option is refused by the command's own parser
    (``studio render: error: unrecognized arguments: --Steps 2 (did you mean --steps?); see
    studio render --help``). Options must be spelled whole: an abbreviation of today's
    options could mean another one tomorrow."""
    import difflib

    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        command = sub.choices[args.command]
        options = [o for a in command._actions for o in a.option_strings]
        hints = []
        for word in extra:
            if word.startswith("-"):
                close = difflib.get_close_matches(word.split("=")[0].lower(), options, n=1)
                if close:
                    hints.append(f"{word.split('=')[0]}: did you mean {close[0]}?")
        command.error(f"unrecognized arguments: {' '.join(extra)}"
                      + (f" ({'; '.join(hints)})" if hints else ""))
    return args


def main(argv: list[str] | None = None) -> int:
    import signal
    import threading

    args = parse_args(argv)
    previous = None
    if threading.current_thread() is threading.main_thread():
        def _terminate(_signum, _frame):
            raise Terminated()

        previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return _main(args)
    except Terminated:
        print("terminated", file=sys.stderr)
        return EXIT_TERMINATED
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("diffusers", "transformers"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    try:
        from studio.paths import user_dir

        try:
            user_dir()  # settings and logs: a bad STUDIO_HOME is bad input, not a traceback
        except ValueError as exc:
            raise BadInput(str(exc)) from None
        if args.command == "render":
            return cmd_render(args)
        return cmd_models(args)
    except BadInput as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:  # "^C" was echoed on the terminal: start a new line after it
        print(("\n" if sys.stderr.isatty() else "") + "interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except OSError as exc:  # the machine's, not ours: disk full, quota, read-only disk
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
            where = f" {exc.filename}" if exc.filename else ""
            print(f"error: cannot write{where}: {exc.strerror} (nothing was left half "
                  f"written)", file=sys.stderr)
            return EXIT_BAD_INPUT  # the user can fix it: free space, another folder
        return _internal_error()
    except Exception:
        return _internal_error()


def _internal_error() -> int:
    """Logs the traceback of the exception being handled; prints one line naming the log."""
    import traceback

    from studio.paths import log_dir

    path = Path(log_dir()) / "cli.log"
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {sys.argv}\n"
                 f"{traceback.format_exc()}\n")
    exc = sys.exc_info()[1]
    print(f"error: internal error: {type(exc).__name__}: {exc} (details in {path})",
          file=sys.stderr)
    return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
