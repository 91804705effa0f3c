"""Triton fused QK RMSNorm + RoPE: one read of q (or k), one write, per row of one head
(norm "head") or of all heads (norm "all")."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def qk_norm_rope_kernel(
    X, W, COS, SIN, Y,
    n_rows, seq, n_sub, row_len, head_dim,  # n_rows = batch * seq * n_sub
    stride_xb, stride_xs,
    stride_cb, stride_cs,  # cos/sin (same layout); stride_cb = 0 when shared by the batch
    stride_yb, stride_ys,
    eps,
    ROWS: tl.constexpr,  # rows per program
    BLOCK_HALF: tl.constexpr,  # next power of two >= row_len / 2
):
    """One program = ROWS rows. A row is one head of one token (n_sub = heads, row_len =
    head_dim) or a whole token (n_sub = 1, row_len = heads * head_dim). Even and odd
    elements are loaded apart so each rotation pair sits in one lane."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)  # [ROWS]
    b = (rows // (seq * n_sub))[:, None]
    s = ((rows // n_sub) % seq)[:, None]
    sub = (rows % n_sub)[:, None]
    j = tl.arange(0, BLOCK_HALF)[None, :]  # pair index in the row
    ok = (rows[:, None] < n_rows) & (j < row_len // 2)
    base = b * stride_xb + s * stride_xs + sub * row_len
    xe = tl.load(X + base + 2 * j, mask=ok, other=0.0).to(tl.float32)
    xo = tl.load(X + base + 2 * j + 1, mask=ok, other=0.0).to(tl.float32)
    inv = tl.rsqrt((tl.sum(xe * xe, 1) + tl.sum(xo * xo, 1)) / row_len + eps)[:, None]
    we = tl.load(W + 2 * j, mask=j < row_len // 2, other=0.0).to(tl.float32)
    wo = tl.load(W + 2 * j + 1, mask=j < row_len // 2, other=0.0).to(tl.float32)
    ne = xe * inv * we
    no = xo * inv * wo
    d = (2 * j) % head_dim  # position of the pair's even element inside its head
    cbase = b * stride_cb + s * stride_cs + d
    ce = tl.load(COS + cbase, mask=ok, other=0.0).to(tl.float32)
    co = tl.load(COS + cbase + 1, mask=ok, other=0.0).to(tl.float32)
    se = tl.load(SIN + cbase, mask=ok, other=0.0).to(tl.float32)
    so = tl.load(SIN + cbase + 1, mask=ok, other=0.0).to(tl.float32)
    ybase = b * stride_yb + s * stride_ys + sub * row_len
    tl.store(Y + ybase + 2 * j, (ne * ce - no * se).to(Y.dtype.element_ty), mask=ok)
    tl.store(Y + ybase + 2 * j + 1, (no * co + ne * so).to(Y.dtype.element_ty), mask=ok)
