"""Gated residual: checks, launch, ``studio::gated_residual`` custom op, fallback.

Public entry point: :func:`gated_residual`.
"""

from __future__ import annotations

from collections import Counter

import torch

from .. import _runtime as rt
from .reference import gated_residual_reference

try:  # Triton is optional: without it the torch reference runs.
    from . import kernel as _kernel
except ImportError:  # pragma: no cover - depends on the installation
    _kernel = None

OP = "gated_residual"
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

#: Launches since import, by path ("triton" or "reference"); tests read it.
LAUNCHES: Counter[str] = Counter()


def fallback_reason(x: torch.Tensor, gate: torch.Tensor, y: torch.Tensor) -> str | None:
    reason = rt.triton_blocker(_kernel, "gated_residual_kernel", x.device)
    if reason is not None:
        return reason
    for t in (x, gate, y):
        if t.dtype not in SUPPORTED_DTYPES:
            return f"dtype {rt.dtype_name(t.dtype)} (Triton path: float16, bfloat16, float32)"
    return None


@torch.library.custom_op("studio::gated_residual", mutates_args=("out",))
def gated_residual_op(x: torch.Tensor, gate: torch.Tensor, y: torch.Tensor,
                      out: torch.Tensor) -> None:
    """Custom op behind :func:`gated_residual`: writes ``out`` in place."""
    if x.numel() == 0:
        return
    reason = fallback_reason(x, gate, y)
    if reason is not None:
        rt.log_fallback_once(OP, reason)
        LAUNCHES["reference"] += 1
        out.copy_(gated_residual_reference(x, gate, y))
        return
    LAUNCHES["triton"] += 1
    batch, seq, dim = x.shape
    interpreted = rt.is_interpreted(_kernel.gated_residual_kernel)
    block_d = min(rt.next_power_of_2(dim), 4096 if interpreted else 1024)
    rows = max(1, (1 << 16 if interpreted else 2048) // block_d)
    rows = min(rows, rt.next_power_of_2(batch * seq))
    grid = (-(-(batch * seq) // rows), -(-dim // block_d))
    _kernel.gated_residual_kernel[grid](
        x, gate, y, out, batch * seq, seq, dim,
        x.stride(0), x.stride(1), *rt.row_strides(gate), y.stride(0), y.stride(1),
        out.stride(0), out.stride(1),
        ROWS=rows, BLOCK_D=block_d,
        num_warps=1 if interpreted else 4,
    )


@gated_residual_op.register_fake
def _gated_residual_fake(x, gate, y, out) -> None:
    return None


def gated_residual(x: torch.Tensor, gate: torch.Tensor, y: torch.Tensor, *,
                   out: torch.Tensor | None = None) -> torch.Tensor:
    """``x + gate * y``: the gated residual of adaLN-Zero blocks (Peebles & Xie, "Scalable
    Diffusion Models with Transformers", ICCV 2023), fp32 math, output in x's dtype.

    Args:
        x, y: (batch, seq, dim) (the residual stream and the block's output).
        gate: (batch, dim), (batch, 1, dim) or (batch, seq, dim); any float dtype.
        out: optional (batch, seq, dim) buffer in x's dtype (must not overlap the inputs).

    Returns:
        (batch, seq, dim) in x's dtype.

    Raises:
        ValueError: x not 3-D, y not x's shape, a gate of another shape, non-float dtypes,
            devices that differ, or a bad ``out``.

    float16/bfloat16/float32 run in Triton; otherwise, or when Triton cannot run, the torch
    reference runs (logged once).
    """
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x must be 3-D (batch, seq, dim), got {got}")
    if not isinstance(y, torch.Tensor) or y.shape != x.shape:
        got = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
        raise ValueError(f"y must have x's shape {tuple(x.shape)}, got {got}")
    rt.check_floating("x", x)
    rt.check_floating("y", y)
    rt.check_same_device(("x", "y"), (x, y))
    rt.check_modulation("gate", gate, x)
    x, gate, y = (rt.last_dim_contiguous(t) for t in (x, gate, y))
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    else:
        rt.check_out("out", out, tuple(x.shape), x.dtype, x.device)
    torch.ops.studio.gated_residual(x, gate, y, out)
    return out
