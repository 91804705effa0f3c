"""Fused AdaLN norm: checks, launch, ``studio::adaln_norm`` custom op, fallback.

Public entry point: :func:`adaln_norm`.
"""

from __future__ import annotations

from collections import Counter

import torch

from .. import _runtime as rt
from .reference import adaln_norm_reference

try:  # Triton is optional: without it the torch reference runs.
    from . import kernel as _kernel
except ImportError:  # pragma: no cover - depends on the installation
    _kernel = None

OP = "adaln_norm"
NORMS = ("layer", "rms")
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_DIM = 16384

#: Launches since import, by path ("triton" or "reference"); tests read it.
LAUNCHES: Counter[str] = Counter()


def fallback_reason(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> str | None:
    reason = rt.triton_blocker(_kernel, "adaln_norm_kernel", x.device)
    if reason is not None:
        return reason
    for t in (x, scale, shift):
        if t.dtype not in SUPPORTED_DTYPES:
            return f"dtype {rt.dtype_name(t.dtype)} (Triton path: float16, bfloat16, float32)"
    if x.shape[-1] > MAX_DIM:
        return f"dim {x.shape[-1]} > {MAX_DIM} (one row per program)"
    return None


@torch.library.custom_op("studio::adaln_norm", mutates_args=("out",))
def adaln_norm_op(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, rms: bool,
                  eps: float, out: torch.Tensor) -> None:
    """Custom op behind :func:`adaln_norm`: writes ``out`` in place."""
    if x.numel() == 0:
        return
    reason = fallback_reason(x, scale, shift)
    if reason is not None:
        rt.log_fallback_once(OP, reason)
        LAUNCHES["reference"] += 1
        out.copy_(adaln_norm_reference(x, scale, shift, "rms" if rms else "layer", eps))
        return
    LAUNCHES["triton"] += 1
    batch, seq, dim = x.shape
    block_d = rt.next_power_of_2(dim)
    interpreted = rt.is_interpreted(_kernel.adaln_norm_kernel)
    # ~4096 elements per program on the GPU; the interpreter pays per program, not per element.
    rows = max(1, (1 << 16 if interpreted else 4096) // block_d)
    rows = min(rows, rt.next_power_of_2(batch * seq))
    _kernel.adaln_norm_kernel[(-(-(batch * seq) // rows),)](
        x, scale, shift, out, batch * seq, seq, dim,
        x.stride(0), x.stride(1), *rt.row_strides(scale), *rt.row_strides(shift),
        out.stride(0), out.stride(1), eps,
        RMS=rms, ROWS=rows, BLOCK_D=block_d,
        num_warps=1 if interpreted else min(16, max(4, block_d // 512)),
    )


@adaln_norm_op.register_fake
def _adaln_norm_fake(x, scale, shift, rms, eps, out) -> None:
    return None


def adaln_norm(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, *,
               norm: str = "layer", eps: float = 1e-6,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """AdaLN modulation fused with its norm: ``norm(x) * (1 + scale) + shift`` in one pass.

    As in DiT's adaLN (Peebles & Xie, "Scalable Diffusion Models with Transformers", ICCV 2023)
    and Flux/Wan/SD3 blocks. Statistics and modulation in fp32, output in x's dtype.

    Args:
        x: (batch, seq, dim), contiguous last dim (copied otherwise).
        scale, shift: (batch, dim), (batch, 1, dim) or (batch, seq, dim); any float dtype
            (Wan keeps them in float32 while x is bf16).
        norm: "layer" (LayerNorm without affine, biased variance) or "rms" (RMSNorm without
            weight).
        eps: added to the variance / mean square, >= 0.
        out: optional (batch, seq, dim) buffer in x's dtype (must not overlap the inputs).

    Returns:
        (batch, seq, dim) in x's dtype.

    Raises:
        ValueError: x not 3-D, a modulation of another shape, non-float dtypes, devices that
            differ, ``norm`` not "layer"/"rms", negative eps, or a bad ``out``.

    float16/bfloat16/float32 with dim <= 16384 run in Triton; otherwise, or when Triton cannot
    run, the torch reference runs (logged once).
    """
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {', '.join(map(repr, NORMS))}, got {norm!r}")
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x must be 3-D (batch, seq, dim), got {got}")
    rt.check_floating("x", x)
    rt.check_modulation("scale", scale, x)
    rt.check_modulation("shift", shift, x)
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps!r}")
    x, scale, shift = (rt.last_dim_contiguous(t) for t in (x, scale, shift))
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    else:
        rt.check_out("out", out, tuple(x.shape), x.dtype, x.device)
    torch.ops.studio.adaln_norm(x, scale, shift, norm == "rms", float(eps), out)
    return out
