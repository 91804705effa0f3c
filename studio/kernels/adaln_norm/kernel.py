"""Triton fused AdaLN: LayerNorm (no affine) or RMSNorm, then ``* (1 + scale) + shift``, in one
pass over each row. Plain loads/stores with int64 offsets: compiles on Triton 3.6 and 3.9."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def adaln_norm_kernel(
    X, SCALE, SHIFT, Y,
    n_rows, seq, dim,  # n_rows = batch * seq
    stride_xb, stride_xs,
    stride_cb, stride_cs,  # scale; stride_cs = 0 when one scale row serves the whole sequence
    stride_hb, stride_hs,  # shift; likewise
    stride_yb, stride_ys,
    eps,
    RMS: tl.constexpr,
    ROWS: tl.constexpr,  # rows per program
    BLOCK_D: tl.constexpr,  # next power of two >= dim
):
    """One program = ROWS rows (tokens). Grid: (cdiv(batch * seq, ROWS),). All last dims
    contiguous. X, Y: (batch, seq, dim); SCALE, SHIFT: (batch, seq or broadcast, dim)."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)  # [ROWS]
    b = (rows // seq)[:, None]  # [ROWS, 1]
    s = (rows % seq)[:, None]  # [ROWS, 1]
    offs = tl.arange(0, BLOCK_D)[None, :]  # [1, BLOCK_D]
    ok = (rows[:, None] < n_rows) & (offs < dim)  # [ROWS, BLOCK_D]

    x = tl.load(X + b * stride_xb + s * stride_xs + offs, mask=ok, other=0.0).to(tl.float32)
    if RMS:
        inv = tl.rsqrt(tl.sum(x * x, 1) / dim + eps)  # [ROWS]
        xn = x * inv[:, None]  # [ROWS, BLOCK_D]
    else:
        mean = tl.sum(x, 1) / dim  # [ROWS]
        xc = tl.where(ok, x - mean[:, None], 0.0)  # [ROWS, BLOCK_D]
        inv = tl.rsqrt(tl.sum(xc * xc, 1) / dim + eps)  # [ROWS]; biased variance
        xn = xc * inv[:, None]  # [ROWS, BLOCK_D]

    sc = tl.load(SCALE + b * stride_cb + s * stride_cs + offs, mask=ok, other=0.0)
    sh = tl.load(SHIFT + b * stride_hb + s * stride_hs + offs, mask=ok, other=0.0)
    y = xn * (1.0 + sc.to(tl.float32)) + sh.to(tl.float32)  # [ROWS, BLOCK_D]
    tl.store(Y + b * stride_yb + s * stride_ys + offs, y.to(Y.dtype.element_ty), mask=ok)
