"""Triton block-sparse attention forward: each query block visits only its kept key blocks.

The per-query-block list of kept key blocks (``kv_indices`` + ``kv_counts``, as in
FlashAttention's block-sparse kernel and FlexAttention's BlockMask) drives the loop, so dropped
blocks are never loaded nor multiplied. The online-softmax step is the dense kernel's. Only
``tl.load``/``tl.store``/``tl.dot``/``tl.atomic_add``: compiles on Triton 3.6 and 3.9.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..attention.kernel import attend_key_block, finish_rows


@triton.jit
def block_sparse_attention_fwd_kernel(
    Q, K, V, Out, LSE, KV_IDX, KV_CNT, VISITS,
    stride_qb, stride_qh, stride_qs,
    stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs,
    stride_ob, stride_oh, stride_os,
    stride_idx,  # row stride of KV_IDX
    num_heads, seq_q, seq_k,
    qk_scale,  # softmax scale * log2(e)
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IEEE_FP32: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,  # interpreter only: its bf16 tl.dot multiplies raw uint16 bits
    COUNT_VISITS: tl.constexpr,  # debug: VISITS[query block] += 1 per visited key block
):
    """One program = query block ``pid_m`` of one (batch, head). Grid: (num_q_blocks, B*H).

    Q/K/V/Out: (batch, heads, seq, HEAD_DIM), any batch/head/seq strides, contiguous head dim.
    LSE: (batch*heads, seq_q) float32. KV_IDX: (num_q_blocks, >= max count) int32 kept key
    block indices; KV_CNT: (num_q_blocks,) int32; VISITS: (num_q_blocks,) int32.
    """
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // num_heads).to(tl.int64)
    h = (pid_bh % num_heads).to(tl.int64)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M]
    offs_d = tl.arange(0, HEAD_DIM)  # [HEAD_DIM]
    row_ok = offs_m < seq_q  # [BLOCK_M]
    q_ptrs = (Q + b * stride_qb + h * stride_qh
              + offs_m.to(tl.int64)[:, None] * stride_qs + offs_d[None, :])  # [BLOCK_M, HEAD_DIM]
    q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0)  # [BLOCK_M, HEAD_DIM]
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # [BLOCK_M]
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # [BLOCK_M]
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)  # [BLOCK_M, HEAD_DIM]

    count = tl.load(KV_CNT + pid_m)
    idx_row = KV_IDX + pid_m.to(tl.int64) * stride_idx
    for i in range(0, count):
        start_n = tl.load(idx_row + i) * BLOCK_N  # a kept block holds >= 1 key < seq_k
        acc, m_i, l_i = attend_key_block(
            acc, m_i, l_i, q, k_base, v_base, start_n, seq_k, stride_ks, stride_vs, qk_scale,
            HEAD_DIM, BLOCK_N, IEEE_FP32, DOT_IN_FP32)
        if COUNT_VISITS:
            tl.atomic_add(VISITS + pid_m, 1)

    finish_rows(acc, m_i, l_i, Out + b * stride_ob + h * stride_oh, stride_os,
                LSE + pid_bh.to(tl.int64) * seq_q, offs_m, seq_q, HEAD_DIM)
