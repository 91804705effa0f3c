"""Block-sparse attention forward: checks, launch, ``studio::block_sparse_attention_fwd``,
fallback. Public entry point: :func:`block_sparse_attention`.
"""

from __future__ import annotations

import math
from collections import Counter

import torch

from .. import _runtime as rt
from ..attention.op import check_inputs as check_attention_inputs
from .mask import BlockSparseLayout
from .reference import block_sparse_attention_reference

try:  # Triton is optional: without it the dense masked reference runs.
    from . import kernel as _kernel
except ImportError:  # pragma: no cover - depends on the installation
    _kernel = None

OP = "block_sparse_attention"
SUPPORTED_DTYPES = rt.FLOAT_DTYPES
HEAD_DIMS = rt.ATTENTION_HEAD_DIMS
LOG2E = 1.4426950408889634

#: Launches since import, by path ("triton" or "reference"); tests read it.
LAUNCHES: Counter[str] = Counter()


def fallback_reason(q: torch.Tensor) -> str | None:
    """Why this call runs the dense reference instead of Triton; None when Triton runs."""
    return rt.attention_fallback_reason(_kernel, "block_sparse_attention_fwd_kernel", q)


def _launch(q, k, v, kv_indices, kv_counts, block_m, block_n, scale, out, lse, visits) -> None:
    batch, heads, seq_q, head_dim = q.shape
    interpreted = rt.is_interpreted(_kernel.block_sparse_attention_fwd_kernel)
    grid = (kv_counts.shape[0], batch * heads)
    _kernel.block_sparse_attention_fwd_kernel[grid](
        q, k, v, out, lse, kv_indices, kv_counts, visits if visits is not None else kv_counts,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        kv_indices.stride(0),
        heads, seq_q, k.shape[2],
        scale * LOG2E,
        HEAD_DIM=head_dim,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        IEEE_FP32=q.dtype == torch.float32,
        DOT_IN_FP32=interpreted and q.dtype == torch.bfloat16,
        COUNT_VISITS=visits is not None,
        num_warps=8 if block_m >= 128 and head_dim >= 128 and not interpreted else 4,
        # Three stages of 128-row bf16 K and V tiles at head dim 128 would fill shared memory.
        num_stages=1 if interpreted else (2 if q.dtype == torch.float32 or block_n >= 128
                                          else 3),
    )


@torch.library.custom_op("studio::block_sparse_attention_fwd",
                         mutates_args=("out", "lse", "visits"))
def block_sparse_attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               block_mask: torch.Tensor, kv_indices: torch.Tensor,
                               kv_counts: torch.Tensor, block_m: int, block_n: int,
                               scale: float, out: torch.Tensor, lse: torch.Tensor,
                               visits: torch.Tensor | None) -> None:
    """Custom op behind :func:`block_sparse_attention`: writes out, lse (and visits)."""
    rt.dispatch_attention(OP, q, out, lse, fallback_reason(q), LAUNCHES,
                          lambda: block_sparse_attention_reference(
                              q, k, v, block_mask, block_m, block_n, scale),
                          lambda: _launch(q, k, v, kv_indices, kv_counts, block_m, block_n, scale,
                                          out, lse, visits))


@block_sparse_attention_fwd.register_fake
def _block_sparse_attention_fwd_fake(q, k, v, block_mask, kv_indices, kv_counts, block_m,
                                     block_n, scale, out, lse, visits) -> None:
    return None


def block_sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           layout: BlockSparseLayout, *, scale: float | None = None,
                           out: torch.Tensor | None = None, lse: torch.Tensor | None = None,
                           visit_counter: torch.Tensor | None = None
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention restricted to the kept (query block, key block) pairs of ``layout``.

    Each query block of ``layout.block_m`` tokens attends, with an online softmax in fp32, to
    the tokens of its kept key blocks only (block granularity: every token pair in a kept block
    counts, no token-level mask). Dropped blocks are never loaded. One layout is shared by all
    batch items and heads; build it with :func:`build_video_mask` and
    :meth:`BlockSparseLayout.from_mask` once per resolution.

    Args:
        q: (batch, heads, seq_q, head_dim); k, v: (batch, heads, seq_k, head_dim); any
            batch/head/seq strides. float16/bfloat16/float32 and head_dim 32/64/128 run in
            Triton; otherwise the dense masked reference runs (logged once).
        layout: mask of (cdiv(seq_q, block_m), cdiv(seq_k, block_n)) blocks, on q's device.
        scale: softmax scale, default 1/sqrt(head_dim).
        out, lse: optional output buffers, as :func:`studio.kernels.attention.attention`.
        visit_counter: optional (num_q_blocks,) int32 debug counter; the Triton kernel adds 1
            per visited key block per (batch, head), so it ends at batch·heads·kv_counts more
            than it started. The reference leaves it alone.

    Returns:
        (out like q in q's dtype, lse (batch, heads, seq_q) float32; rows without kept keys
        get 0 and -inf).

    Raises:
        ValueError: malformed inputs, a layout whose block counts or device do not match q/k,
            or a malformed visit_counter.
    """
    check_attention_inputs(q, k, v, None)
    if not isinstance(layout, BlockSparseLayout):
        raise ValueError(f"layout must be a BlockSparseLayout, got {type(layout).__name__}")
    batch, heads, seq_q, head_dim = q.shape
    seq_k = k.shape[2]
    want = (-(-seq_q // layout.block_m), -(-seq_k // layout.block_n))
    if tuple(layout.mask.shape) != want:
        raise ValueError(f"layout must have (cdiv(seq_q, block_m), cdiv(seq_k, block_n)) = "
                         f"{want} blocks for seq_q={seq_q}, seq_k={seq_k}, "
                         f"block_m={layout.block_m}, block_n={layout.block_n}; "
                         f"got {tuple(layout.mask.shape)}")
    if layout.kv_indices.device != q.device:
        raise ValueError(f"layout must be on q's device {q.device} (layout.to(device)), "
                         f"got {layout.kv_indices.device}")
    if visit_counter is not None:
        rt.check_out("visit_counter", visit_counter, (want[0],), torch.int32, q.device)
    q, k, v = (rt.last_dim_contiguous(t) for t in (q, k, v))
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    out, lse = rt.attention_outputs(q, out, lse)
    torch.ops.studio.block_sparse_attention_fwd(
        q, k, v, layout.mask, layout.kv_indices, layout.kv_counts, layout.block_m,
        layout.block_n, scale, out, lse, visit_counter)
    return out, lse
