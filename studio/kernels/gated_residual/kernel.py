"""Triton gated residual ``out = x + gate * y`` (AdaLN-Zero's gate), fp32 math.
Plain loads/stores with int64 offsets: compiles on Triton 3.6 and 3.9."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def gated_residual_kernel(
    X, GATE, Y, OUT,
    n_rows, seq, dim,  # n_rows = batch * seq
    stride_xb, stride_xs,
    stride_gb, stride_gs,  # stride_gs = 0 when one gate row serves the whole sequence
    stride_yb, stride_ys,
    stride_ob, stride_os,
    ROWS: tl.constexpr,  # rows per program
    BLOCK_D: tl.constexpr,
):
    """Program (i, j) handles channels [j*BLOCK_D, (j+1)*BLOCK_D) of rows [i*ROWS, (i+1)*ROWS)
    (row = b * seq + s). Grid: (cdiv(batch * seq, ROWS), cdiv(dim, BLOCK_D)). Last dims
    contiguous."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)  # [ROWS]
    b = (rows // seq)[:, None]  # [ROWS, 1]
    s = (rows % seq)[:, None]  # [ROWS, 1]
    offs = (tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D))[None, :]  # [1, BLOCK_D]
    ok = (rows[:, None] < n_rows) & (offs < dim)  # [ROWS, BLOCK_D]
    x = tl.load(X + b * stride_xb + s * stride_xs + offs, mask=ok, other=0.0)
    g = tl.load(GATE + b * stride_gb + s * stride_gs + offs, mask=ok, other=0.0)
    y = tl.load(Y + b * stride_yb + s * stride_ys + offs, mask=ok, other=0.0)
    out = x.to(tl.float32) + g.to(tl.float32) * y.to(tl.float32)  # [ROWS, BLOCK_D]
    tl.store(OUT + b * stride_ob + s * stride_os + offs, out.to(OUT.dtype.element_ty), mask=ok)
