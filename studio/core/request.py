"""The generation request: everything that decides the output of one generation.

A :class:`GenerationRequest` is a frozen value. The engine receives nothing else (apart from
the pixels of the input images it names by content id), so the request's canonical JSON,
stored in every variant and embedded in every exported file, is enough to reproduce a result.

Content ids are blake2b digests of canonical JSON (sorted keys, no whitespace, UTF-8), never
Python's ``hash()``, which is salted per process.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

from studio.core.capabilities import MODES, VIDEO_MODES, ModelCapabilities

SCHEMA_VERSION = 1
PROFILES = ("exact", "quality", "balanced", "fast")
MAX_SEED = 2**63 - 1
MAX_PROMPT_CHARS = 10_000


def _is_unicode(text: str) -> bool:
    """Whether ``text`` encodes to UTF-8 (no lone surrogates: the bytes of a non-UTF-8
    terminal or file name that Python's ``surrogateescape`` carries through)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def canonical_json(value: Any) -> str:
    """Serialises ``value`` as canonical JSON: sorted keys, no spaces, UTF-8, no NaN/inf.

    Raises:
        ValueError: a float is NaN or infinite (not representable in canonical JSON).
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def content_id_of(value: Any) -> str:
    """Stable 32-hex-digit id of a JSON-able value: blake2b-128 of its canonical JSON."""
    return hashlib.blake2b(canonical_json(value).encode("utf-8"), digest_size=16).hexdigest()


@dataclass(frozen=True)
class MediaRef:
    """An input image named by the content id of its pixels.

    Attributes:
        content_id: blake2b-128 hex of the converted 8-bit RGB pixels (see
            :func:`studio.core.media.pixels_content_id`); the engine checks the pixels it is
            given against it.
        source: the file name the user gave (informational, not part of the pixels).
        conversion: how the file was turned into 8-bit RGB (e.g. "RGBA composited on white
            #FFFFFF; 16-bit scaled to 8-bit"), recorded so the result can be explained.
    """

    content_id: str
    source: str = ""
    conversion: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"content_id": self.content_id, "source": self.source,
                "conversion": self.conversion}

    @classmethod
    def from_dict(cls, data: Any, field_name: str) -> MediaRef:
        if not isinstance(data, dict) or not isinstance(data.get("content_id"), str):
            raise ValueError(f"{field_name}: expected an object with a 'content_id' string")
        return cls(str(data["content_id"]), str(data.get("source", "")),
                   str(data.get("conversion", "")))


@dataclass(frozen=True)
class OptimizationSettings:
    """The optimization levers of a request. ``profile='exact'`` is numerically stock.

    Attributes:
        profile: one of ``exact``, ``quality``, ``balanced``, ``fast``; each names the levers
            it turns on per device (docs/PERFORMANCE.md).
    """

    profile: str = "exact"

    def to_dict(self) -> dict[str, Any]:
        return {"profile": self.profile}


@dataclass(frozen=True)
class RequestProblem:
    """One problem of a request: the field, the value given and the allowed range or rule."""

    field: str
    value: Any
    rule: str

    def __str__(self) -> str:
        if self.value is None or self.value == () or self.value == []:
            return f"{self.field}: {self.rule}"  # nothing was given: no "=None"
        return f"{self.field}={_shown(self.value)}: {self.rule}"


def _shown(value: Any) -> str:
    """A value as a person reads it: input images by file name, long text cut."""
    if isinstance(value, MediaRef):
        return repr(value.source or value.content_id[:12])
    if isinstance(value, tuple) and value and all(isinstance(v, MediaRef) for v in value):
        return "[" + ", ".join(_shown(v) for v in value) + "]"
    if isinstance(value, str):
        return repr(value[:60] + ("..." if len(value) > 60 else ""))
    return repr(value)


class RequestError(ValueError):
    """A request was refused; ``problems`` lists every problem found at once."""

    def __init__(self, problems: list[RequestProblem]):
        self.problems = list(problems)
        super().__init__("; ".join(str(p) for p in self.problems))


@dataclass(frozen=True)
class GenerationRequest:
    """Everything that decides the output of one generation.

    Units: ``width``/``height`` in pixels, ``num_frames`` in frames (1 for images), ``fps`` in
    frames per second, ``strength`` in [0, 1] (the fraction of the noise schedule re-run for
    image-to-image: 1 ignores the init image), ``guidance_scale`` is the classifier-free
    guidance scale (1 disables CFG).

    Modes: ``t2i`` text-to-image, ``i2i`` image-to-image (``init_image``, optional ``mask``:
    white = repaint), ``t2v`` text-to-video, ``i2v`` image-to-video (``first_frame``), ``r2v``
    reference-to-video (``references``).

    Use :meth:`validate` against a model's :class:`ModelCapabilities` before running it.
    """

    mode: str
    model: str
    prompt: str
    seed: int
    steps: int
    guidance_scale: float
    width: int
    height: int
    num_frames: int = 1
    fps: float = 16.0
    model_hash: str = ""
    negative_prompt: str = ""
    init_image: MediaRef | None = None
    strength: float = 0.8
    mask: MediaRef | None = None
    first_frame: MediaRef | None = None
    references: tuple[MediaRef, ...] = ()
    optimization: OptimizationSettings = field(default_factory=OptimizationSettings)

    # -- identity -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The request as JSON-able data (including ``schema``)."""
        out: dict[str, Any] = {"schema": SCHEMA_VERSION}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, MediaRef | OptimizationSettings):
                value = value.to_dict()
            elif f.name == "references":
                value = [ref.to_dict() for ref in value]
            out[f.name] = value
        return out

    def to_json(self) -> str:
        """Canonical JSON (sorted keys, no whitespace)."""
        return canonical_json(self.to_dict())

    @property
    def content_id(self) -> str:
        """blake2b-128 hex of the canonical JSON: equal requests have equal ids everywhere."""
        return content_id_of(self.to_dict())

    @classmethod
    def from_json(cls, text: str | bytes) -> GenerationRequest:
        """Parses canonical (or any) JSON made by :meth:`to_json`.

        Raises:
            ValueError: not JSON, a newer schema, an unknown field, or a field of the wrong
                type (the message names the field).
        """
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"request: not valid JSON ({exc})") from None
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Any) -> GenerationRequest:
        """Builds a request from :meth:`to_dict` output. Missing optional fields get defaults.

        Raises:
            ValueError: as :meth:`from_json`.
        """
        if not isinstance(data, dict):
            raise ValueError("request: expected a JSON object")
        data = dict(data)
        schema = data.pop("schema", SCHEMA_VERSION)
        if not isinstance(schema, int) or schema > SCHEMA_VERSION:
            raise ValueError(f"schema={schema!r}: this version reads schema <= {SCHEMA_VERSION}")
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown request field")
        kwargs: dict[str, Any] = {}
        for name, value in data.items():
            if name in ("init_image", "mask", "first_frame"):
                kwargs[name] = None if value is None else MediaRef.from_dict(value, name)
            elif name == "references":
                if not isinstance(value, list):
                    raise ValueError("references: expected a list")
                kwargs[name] = tuple(MediaRef.from_dict(v, f"references[{i}]")
                                     for i, v in enumerate(value))
            elif name == "optimization":
                if not isinstance(value, dict):
                    raise ValueError("optimization: expected an object")
                bad = sorted(set(value) - {"profile"})
                if bad:
                    raise ValueError(f"optimization.{bad[0]}: unknown setting")
                kwargs[name] = OptimizationSettings(**value)
            else:
                kwargs[name] = value
        missing = [f.name for f in known.values()
                   if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
                   and f.name not in kwargs]
        if missing:
            raise ValueError(f"{missing[0]}: required request field is missing")
        return cls(**kwargs)

    def replace(self, **changes: Any) -> GenerationRequest:
        """A copy with ``changes`` applied (a new request, new content id)."""
        return dataclasses.replace(self, **changes)

    # -- checks ---------------------------------------------------------------------------
    @property
    def is_video(self) -> bool:
        return self.mode in VIDEO_MODES

    def media_refs(self) -> list[tuple[str, MediaRef]]:
        """Every input image this request names, as (field name, ref) pairs."""
        refs = [(name, getattr(self, name)) for name in ("init_image", "mask", "first_frame")]
        out = [(name, ref) for name, ref in refs if ref is not None]
        out += [(f"references[{i}]", ref) for i, ref in enumerate(self.references)]
        return out

    def validate(self, caps: ModelCapabilities | None = None) -> list[RequestProblem]:
        """Every problem of this request at once (empty when it can run).

        Args:
            caps: the model's capabilities; without them only model-independent rules run.
        """
        problems: list[RequestProblem] = []

        def bad(name: str, rule: str) -> None:
            problems.append(RequestProblem(name, getattr(self, name), rule))

        def check_int(name: str, lo: int, hi: int) -> bool:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                bad(name, f"must be a whole number in [{lo}, {hi}]")
                return False
            if not lo <= value <= hi:
                bad(name, f"must be in [{lo}, {hi}]")
                return False
            return True

        def check_float(name: str, lo: float, hi: float) -> bool:
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
                bad(name, f"must be a number in [{lo:g}, {hi:g}]")
                return False
            if not lo <= value <= hi:
                bad(name, f"must be in [{lo:g}, {hi:g}]")
                return False
            return True

        if self.mode not in MODES:
            bad("mode", f"must be one of {', '.join(MODES)}")
        if not isinstance(self.model, str) or not self.model:
            bad("model", "must name a model (see `studio models`)")
        if not isinstance(self.model_hash, str):
            bad("model_hash", "must be text (the model's content hash, or empty)")
        for name in ("prompt", "negative_prompt"):
            value = getattr(self, name)
            if not isinstance(value, str):
                bad(name, "must be text")
            elif len(value) > MAX_PROMPT_CHARS:
                bad(name, f"must be at most {MAX_PROMPT_CHARS} characters")
            elif not _is_unicode(value):
                bad(name, "must be valid Unicode text: it holds bytes that are not UTF-8 "
                          "(from a terminal or file in another encoding); retype it")
        if isinstance(self.prompt, str) and not self.prompt.strip() and self.mode in ("t2i", "t2v"):
            bad("prompt", "must not be empty for text-to-image/video")
        check_int("seed", 0, MAX_SEED)
        max_steps = caps.max_steps if caps else 1000
        steps_ok = check_int("steps", 1, max_steps)
        g_lo, g_hi = (caps.guidance_range if caps else (0.0, 100.0))
        check_float("guidance_scale", g_lo, g_hi)
        check_float("fps", 1.0, 120.0)
        if not isinstance(self.optimization, OptimizationSettings) or \
                self.optimization.profile not in PROFILES:
            problems.append(RequestProblem("optimization.profile",
                                           getattr(self.optimization, "profile", None),
                                           f"must be one of {', '.join(PROFILES)}"))
        if not isinstance(self.references, tuple):
            bad("references", "must be a tuple of media references")

        # Inputs each mode needs, and inputs it does not use.
        needs = {"i2i": "init_image", "i2v": "first_frame"}
        for mode, name in needs.items():
            if self.mode == mode and getattr(self, name) is None:
                bad(name, f"is required in mode {mode}")
        if self.mode != "i2i":
            for name in ("init_image", "mask"):
                if getattr(self, name) is not None:
                    bad(name, "is only used in mode i2i")
        if self.mode != "i2v" and self.first_frame is not None:
            bad("first_frame", "is only used in mode i2v")
        if self.mode == "r2v" and not self.references:
            bad("references", "at least one reference image is required in mode r2v")
        if self.mode != "r2v" and self.references:
            bad("references", "are only used in mode r2v")
        if self.mode == "i2i" and check_float("strength", 0.0, 1.0):
            if steps_ok and int(self.steps * self.strength) < 1:
                least_steps = math.ceil(1 / self.strength) if self.strength > 0 else None
                bad("strength", f"steps x strength must run at least one step: at {self.steps} "
                                f"steps strength must be >= {1 / self.steps:.3g}"
                                + (f", or at this strength steps must be >= {least_steps}"
                                   if least_steps else " (strength 0 runs no step)"))

        lo_size, hi_size = (caps.min_size, caps.max_size) if caps else (8, 16384)
        size_ok = check_int("width", lo_size, hi_size) & check_int("height", lo_size, hi_size)
        video = self.mode in VIDEO_MODES
        if caps is not None and video and self.mode in caps.modes:
            frames_ok = check_int("num_frames", caps.min_video_frames, caps.max_frames)
        else:
            frames_ok = check_int("num_frames", 1, 10_000)
        if frames_ok and self.mode in MODES:
            if video and self.num_frames < 2:
                bad("num_frames", f"must be at least 2 in video mode {self.mode}")
            if not video and self.num_frames != 1:
                bad("num_frames", f"must be 1 in image mode {self.mode}")

        if caps is None:
            return problems
        if self.mode in MODES and self.mode not in caps.modes:
            bad("mode", f"model {caps.name} supports {', '.join(sorted(caps.modes))}")
        if self.mask is not None and not caps.supports_mask:
            bad("mask", f"model {caps.name} has no inpainting")
        if self.references and len(self.references) > caps.max_references:
            bad("references", f"model {caps.name} takes at most {caps.max_references}")
        if size_ok:
            m = caps.spatial_multiple
            for name in ("width", "height"):
                value = getattr(self, name)
                if value % m:
                    lo = max(m, value // m * m)
                    hint = f"{lo}" if lo + m > caps.max_size else f"{lo} or {lo + m}"
                    bad(name, f"must be a multiple of {m} (nearest: {hint})")
            if self.width * self.height > caps.max_pixels:
                problems.append(RequestProblem(
                    "width x height", f"{self.width}x{self.height}",
                    f"at most {caps.max_pixels} pixels for model {caps.name}"))
        if frames_ok and video and self.mode in caps.modes:
            k = caps.frame_multiple
            if k > 1 and (self.num_frames - 1) % k:
                lo = (self.num_frames - 1) // k * k + 1
                options = sorted({n for n in (lo, lo + k)
                                  if caps.min_video_frames <= n <= caps.max_frames})
                bad("num_frames", f"must be {k}k+1 (nearest: "
                                  f"{' or '.join(map(str, options))})")
        return problems

    def check(self, caps: ModelCapabilities | None = None) -> None:
        """Raises :class:`RequestError` listing every problem, if any."""
        problems = self.validate(caps)
        if problems:
            raise RequestError(problems)


@dataclass(frozen=True)
class EngineEnvironment:
    """What of the engine's environment affects pixels, recorded beside each request.

    Attributes:
        device: e.g. ``cpu`` or ``cuda:0 (NVIDIA H200)``.
        dtype: compute dtype of the denoiser, e.g. ``float32``.
        torch_threads: ``torch.get_num_threads()`` during the run.
        versions: package name -> version (torch, diffusers, transformers, studio).
        deterministic: whether bit-exact reruns are expected on this device.
        parallel: the multi-device plan the job ran under, e.g. ``"single device"`` or
            ``"ulysses 2 × cfg 2 (4 ranks)"``.
    """

    device: str
    dtype: str
    torch_threads: int
    versions: dict[str, str]
    deterministic: bool = True
    parallel: str = "single device"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EngineEnvironment:
        return cls(str(data["device"]), str(data["dtype"]), int(data["torch_threads"]),
                   {str(k): str(v) for k, v in dict(data["versions"]).items()},
                   bool(data.get("deterministic", True)),
                   str(data.get("parallel", "single device")))
