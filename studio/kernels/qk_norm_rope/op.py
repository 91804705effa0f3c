"""Fused QK RMSNorm + RoPE: checks, launch, ``studio::qk_norm_rope`` custom op, fallback.

Public entry point: :func:`qk_norm_rope`.
"""

from __future__ import annotations

from collections import Counter

import torch

from .. import _runtime as rt
from .reference import qk_norm_rope_reference, rope_tables

try:  # Triton is optional: without it the torch reference runs.
    from . import kernel as _kernel
except ImportError:  # pragma: no cover - depends on the installation
    _kernel = None

OP = "qk_norm_rope"
NORMS = ("head", "all")
SUPPORTED_DTYPES = rt.FLOAT_DTYPES
MAX_ROW = 16384

#: Launches since import, by path ("triton" or "reference"); tests read it.
LAUNCHES: Counter[str] = Counter()


def fallback_reason(x: torch.Tensor, *others: torch.Tensor) -> str | None:
    reason = rt.triton_blocker(_kernel, "qk_norm_rope_kernel", x.device)
    if reason is not None:
        return reason
    for t in (x, *others):
        if t.dtype not in SUPPORTED_DTYPES:
            return f"dtype {rt.dtype_name(t.dtype)} (Triton path: float16, bfloat16, float32)"
    if x.shape[-1] > MAX_ROW:
        return f"row of {x.shape[-1]} > {MAX_ROW} elements"
    return None


@torch.library.custom_op("studio::qk_norm_rope", mutates_args=("out",))
def qk_norm_rope_op(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor,
                    sin: torch.Tensor, heads: int, all_heads: bool, eps: float,
                    out: torch.Tensor) -> None:
    """Custom op behind :func:`qk_norm_rope`: writes ``out`` in place. cos/sin are
    (batch or 1, seq, head_dim) with contiguous last dims."""
    if x.numel() == 0:
        return
    reason = fallback_reason(x, weight, cos, sin)
    if reason is not None:
        rt.log_fallback_once(OP, reason)
        LAUNCHES["reference"] += 1
        out.copy_(qk_norm_rope_reference(x, weight, cos, sin, heads, eps,
                                         "all" if all_heads else "head"))
        return
    LAUNCHES["triton"] += 1
    batch, seq, inner = x.shape
    head_dim = inner // heads
    n_sub, row_len = (1, inner) if all_heads else (heads, head_dim)
    n_rows = batch * seq * n_sub
    block_half = rt.next_power_of_2(max(row_len // 2, 1))
    interpreted = rt.is_interpreted(_kernel.qk_norm_rope_kernel)
    rows = max(1, (1 << 15 if interpreted else 2048) // block_half)
    rows = min(rows, rt.next_power_of_2(n_rows))
    _kernel.qk_norm_rope_kernel[(-(-n_rows // rows),)](
        x, weight, cos, sin, out, n_rows, seq, n_sub, row_len, head_dim,
        x.stride(0), x.stride(1),
        cos.stride(0) if cos.shape[0] > 1 else 0, cos.stride(1),
        out.stride(0), out.stride(1), eps,
        ROWS=rows, BLOCK_HALF=block_half,
        num_warps=1 if interpreted else min(8, max(1, block_half // 256)),
    )


@qk_norm_rope_op.register_fake
def _qk_norm_rope_fake(x, weight, cos, sin, heads, all_heads, eps, out) -> None:
    return None


def qk_norm_rope(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 *, heads: int, norm: str = "head", eps: float = 1e-6,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """Query/key RMSNorm with its weight, then rotary position embedding, in one pass.

    The QK-norm of Flux, SD3, Qwen-Image (per head) and Wan (across heads, "all"), followed
    by RoPE on interleaved pairs (Su et al., "RoFormer", 2021; the real-valued form diffusers
    uses for Flux and Wan): per pair (2i, 2i+1) of a head, with n the normalised input,
    ``y[2i] = n[2i]·cos[2i] − n[2i+1]·sin[2i]``, ``y[2i+1] = n[2i+1]·cos[2i+1] +
    n[2i]·sin[2i+1]``. Statistics and rotation in fp32.

    Args:
        x: (batch, seq, heads * head_dim), the projection output before the head split;
            contiguous last dim (copied otherwise).
        weight: the RMSNorm weight: (head_dim,) for norm "head", (heads * head_dim,) for "all".
        cos, sin: (seq, head_dim), (batch, seq, head_dim) or diffusers' (1, seq, 1,
            head_dim) tables of the same shape.
        heads: number of heads (>= 1, divides the last dim into even head dims).
        norm: "head" or "all".
        eps: added to the mean square, >= 0.
        out: optional (batch, seq, heads * head_dim) buffer in x's dtype.

    Returns:
        (batch, seq, heads * head_dim) in x's dtype; ``.unflatten(2, (heads, -1))`` for the
        attention layout.

    Raises:
        ValueError: malformed shapes (naming the argument), odd head_dim, non-float dtypes,
            devices that differ, an unknown norm, negative eps, or a bad ``out``.
    """
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {', '.join(map(repr, NORMS))}, got {norm!r}")
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x must be 3-D (batch, seq, heads * head_dim), got {got}")
    batch, seq, inner = x.shape
    if not isinstance(heads, int) or heads < 1 or inner % heads:
        raise ValueError(f"heads must be a positive divisor of x's last dim {inner}, "
                         f"got {heads!r}")
    head_dim = inner // heads
    if head_dim % 2:
        raise ValueError(f"head_dim must be even for rotary pairs, got {head_dim}")
    want_w = (head_dim,) if norm == "head" else (inner,)
    if not isinstance(weight, torch.Tensor) or tuple(weight.shape) != want_w:
        got = tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise ValueError(f"weight must have shape {want_w} for norm {norm!r}, got {got}")
    for name, t in (("cos", cos), ("sin", sin)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a tensor, got {type(t).__name__}")
    cos, sin = rope_tables(cos, sin)
    if cos.shape != sin.shape or cos.dim() != 3 or cos.shape[0] not in (1, batch) or \
            tuple(cos.shape[1:]) != (seq, head_dim):
        raise ValueError(f"cos and sin must both be (seq, head_dim) = {(seq, head_dim)}, "
                         f"(batch, seq, head_dim) or (1, seq, 1, head_dim); got "
                         f"{tuple(cos.shape)} and {tuple(sin.shape)}")
    for name, t in (("x", x), ("weight", weight), ("cos", cos), ("sin", sin)):
        rt.check_floating(name, t)
    rt.check_same_device(("x", "weight", "cos", "sin"), (x, weight, cos, sin))
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps!r}")
    x, cos, sin = (rt.last_dim_contiguous(t) for t in (x, cos, sin))
    weight = weight.contiguous()
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    else:
        rt.check_out("out", out, tuple(x.shape), x.dtype, x.device)
    torch.ops.studio.qk_norm_rope(x, weight, cos, sin, heads, norm == "all", float(eps), out)
    return out
