"""Which attention the denoiser runs: :class:`AttentionConfig` and the ``STUDIO_ATTENTION``
override. Torch-free, so the CLI and the studio can check the variable up front, before any
model work (:mod:`studio.engine.attention` routes the calls)."""

from __future__ import annotations

from dataclasses import dataclass

KERNELS = ("sdpa", "flash", "sage", "sparse")
# AttentionConfig's fields and the STUDIO_ATTENTION options that set them
_OPTION_OF_FIELD = {"sparse_window": "window", "sparse_inner": "inner",
                    "sparse_sink_frames": "sink", "sage_tiles": "tiles",
                    "sparse_below_timestep": "below"}


@dataclass(frozen=True)
class AttentionConfig:
    """Which attention the denoiser runs.

    Attributes:
        kernel: ``sdpa`` (PyTorch, i.e. off), ``flash``, ``sage`` or ``sparse``.
        sparse_window: (frames, rows, cols) half-extents in latent tokens of the local window
            each video token attends to (``sparse`` only).
        sparse_inner: ``flash`` or ``sage``: what non-video-self-attention calls run.
        block: the sparse kernel's query/key block size in tokens (16, 32, 64 or 128).
        pv_fp8: ``sage``'s P·V in FP8 e4m3 (True), in 16 bits (False), or the device's
            default (None: FP8 on CUDA compute capability >= 8.9).
        sparse_sink_frames: latent frames at the start every video query attends to whole
            (``sparse`` only; see :func:`~studio.kernels.block_sparse_attention.mask.
            build_video_mask`); clamped to the clip's frames.
        sparse_below_timestep: video self-attention runs sparse only at denoiser timesteps
            below this value (0-1000, the scale of Wan's schedulers; the highest of the
            call's timesteps counts) and dense (``sparse_inner``) above it: the early, noisy
            steps lay out the whole clip's objects and motion, the late ones refine locally.
            The dense warm-up of Sparse VideoGen (Xi et al., 2025) and Radial Attention
            (Li et al., 2025), placed by noise level rather than by step count. 1000: sparse
            at every step.
        sage_tiles: ``sage``'s (block_m, block_n), its quantization blocks too, each one of
            16, 32, 64, 128 (block_n >= 32 with ``pv_fp8``); None: the op's default for the
            device
            (:func:`studio.kernels.sage_attention.op.default_tiles`).

    Raises:
        ValueError: (at construction) a field out of range, naming it.
    """

    kernel: str = "sdpa"
    sparse_window: tuple[int, int, int] = (1, 4, 4)
    sparse_inner: str = "flash"
    block: int = 64
    pv_fp8: bool | None = None
    sparse_sink_frames: int = 1
    sage_tiles: tuple[int, int] | None = None
    sparse_below_timestep: float = 1000.0

    def __post_init__(self):
        if self.sage_tiles is not None and (
                len(self.sage_tiles) != 2
                or any(t not in (16, 32, 64, 128) for t in self.sage_tiles)):
            raise ValueError(f"sage_tiles: {self.sage_tiles!r} must be two of 16, 32, 64, 128")
        if self.pv_fp8 and self.sage_tiles is not None and self.sage_tiles[1] < 32:
            # the fp8 P·V dot's reduction runs over block_n keys: Triton compiles 8-bit dots
            # only with K >= 32 on the GPU (the interpreter takes any)
            raise ValueError(f"sage_tiles: block_n {self.sage_tiles[1]} with pv_fp8 must be "
                             f"32, 64 or 128 (an 8-bit dot needs K >= 32)")
        if self.kernel not in KERNELS:
            raise ValueError(f"kernel: {self.kernel!r} is not one of {', '.join(KERNELS)}")
        if self.sparse_inner not in ("flash", "sage"):
            raise ValueError(f"sparse_inner: {self.sparse_inner!r} is not flash or sage")
        if len(self.sparse_window) != 3 or any(int(w) < 0 for w in self.sparse_window):
            raise ValueError(f"sparse_window: {self.sparse_window!r} must be 3 non-negative "
                             f"half-extents (frames, rows, cols)")
        if self.block not in (16, 32, 64, 128):
            raise ValueError(f"block: {self.block} is not one of 16, 32, 64, 128")
        if not 0.0 <= float(self.sparse_below_timestep) <= 1000.0:
            raise ValueError(f"sparse_below_timestep: {self.sparse_below_timestep!r} must be "
                             f"in [0, 1000]")
        if not isinstance(self.sparse_sink_frames, int) or self.sparse_sink_frames < 0:
            raise ValueError(f"sparse_sink_frames: {self.sparse_sink_frames!r} must be an "
                             f"int >= 0")


ATTENTION_ENV = "STUDIO_ATTENTION"


def attention_override(text: str | None = None) -> AttentionConfig | None:
    """The attention forced by the ``STUDIO_ATTENTION`` environment variable (or ``text``),
    for every profile on any device; None when unset or empty.

    Format: a kernel name, then optional comma-separated options: ``sage``, ``sage,pv_fp8``
    (P·V in FP8 as on Hopper), ``sparse,window=1x4x4``, ``sparse,inner=sage``, ``sparse,sink=0``,
    ``sparse,below=600`` (sparse only below timestep 600),
    ``sage,pv_fp8,tiles=64x128`` (sage's tiles = quantization blocks). On the CPU the
    kernels run their torch emulations (:mod:`studio.kernels`), so their numerics can be
    judged on a real model without a GPU (``python -m bench kernel-quality``).

    Raises:
        ValueError: an unknown kernel or option, naming the variable and the allowed values.
    """
    import os

    text = os.environ.get(ATTENTION_ENV, "") if text is None else text
    text = text.strip()
    if not text:
        return None
    kernel, *options = [part.strip() for part in text.split(",")]
    if not kernel:
        raise ValueError(f"{ATTENTION_ENV}: {text!r} names no kernel before its first comma; "
                         f"start with one of {', '.join(KERNELS)}")
    fields: dict = {"kernel": kernel}
    if kernel == "sparse":
        fields["sparse_inner"] = "sage"
    for option in options:
        name, _, value = option.partition("=")
        if name == "pv_fp8" and not value:
            fields["pv_fp8"] = True
        elif name in ("window", "tiles") and value:
            field, form = (("sparse_window", "FxRxC, e.g. 1x4x4") if name == "window"
                           else ("sage_tiles", "MxN, e.g. 64x128"))
            try:
                fields[field] = tuple(int(x) for x in value.split("x"))
            except ValueError:
                raise ValueError(f"{ATTENTION_ENV}: {name}={value!r} is not {form}") from None
        elif name == "inner" and value:
            fields["sparse_inner"] = value
        elif name == "below" and value:
            try:
                fields["sparse_below_timestep"] = float(value)
            except ValueError:
                raise ValueError(f"{ATTENTION_ENV}: below={value!r} is not a timestep "
                                 f"(0-1000)") from None
        elif name == "sink" and value:
            try:
                fields["sparse_sink_frames"] = int(value)
            except ValueError:
                raise ValueError(f"{ATTENTION_ENV}: sink={value!r} is not a frame count") from None
        else:
            raise ValueError(f"{ATTENTION_ENV}: option {option!r} is not one of pv_fp8, "
                             f"window=FxRxC, inner=flash|sage, sink=N, below=T, tiles=MxN")
    try:
        return AttentionConfig(**fields)
    except ValueError as exc:  # name the option as typed, not the field it fills
        message = str(exc)
        for field, option in _OPTION_OF_FIELD.items():
            if message.startswith(f"{field}:"):
                message = option + message[len(field):]
        raise ValueError(f"{ATTENTION_ENV}: {message}") from None
