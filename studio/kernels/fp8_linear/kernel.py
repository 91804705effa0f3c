"""Triton row-wise float8 e4m3 quantization of activations: one program per row, two sweeps
over its features (absmax, then scale and cast; the second sweep reads from L2).

Compiles on Triton 3.6 (the GPU machine) and 3.9: loads, stores, max, abs, fp8 casts.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..sage_attention.kernel import to_e4m3


@triton.jit
def quantize_rows_fp8_kernel(
    X, Out, Scales,
    stride_xm, features,
    BLOCK_K: tl.constexpr,
    EMULATE_RNE: tl.constexpr,  # interpreter only: see sage_attention.kernel.to_e4m3
):
    """X: (rows, features) fp16/bf16/fp32 with unit feature stride; Out: contiguous
    (rows, features) float8 e4m3 = x / scale; Scales: (rows,) fp32 = max(absmax/448, tiny).
    Grid: (rows,)."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_K)  # [BLOCK_K]
    x_row = X + row * stride_xm
    amax = tl.zeros([BLOCK_K], dtype=tl.float32)
    for start in range(0, features, BLOCK_K):
        cols = start + offs
        x = tl.load(x_row + cols, mask=cols < features, other=0.0)  # [BLOCK_K]
        amax = tl.maximum(amax, tl.abs(x.to(tl.float32)))
    scale = tl.maximum(tl.max(amax, 0) / 448.0, 1.1754943508222875e-38)
    tl.store(Scales + row, scale)
    o_row = Out + row * features
    for start in range(0, features, BLOCK_K):
        cols = start + offs
        ok = cols < features
        x = tl.load(x_row + cols, mask=ok, other=0.0)
        tl.store(o_row + cols, to_e4m3(x.to(tl.float32) / scale, EMULATE_RNE), mask=ok)
