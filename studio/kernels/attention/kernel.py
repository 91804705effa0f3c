"""Triton flash-attention forward (online softmax, no causal mask) for diffusion shapes.

Plain ``tl.load``/``tl.store`` with int64 offsets and ``tl.dot``: nothing newer than Triton 3.0,
so it compiles on Triton 3.6 (the GPU machine) and 3.9 (here, under the interpreter).
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = 1.4426950408889634  # log2(e): softmax is computed with exp2 on log2-scaled scores


@triton.jit
def attend_key_block(acc, m_i, l_i, q, k_base, v_base, start_n, kv_len, stride_ks, stride_vs,
                     qk_scale, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                     IEEE_FP32: tl.constexpr, DOT_IN_FP32: tl.constexpr):
    """One online-softmax step over the keys [start_n, start_n + BLOCK_N) (those >= kv_len
    masked; the block must hold at least one valid key, so the new row max is finite).

    acc: [BLOCK_M, HEAD_DIM] fp32; m_i, l_i: [BLOCK_M] fp32 running max (log2 domain) and sum;
    q: [BLOCK_M, HEAD_DIM]; k_base/v_base point at key/value 0 of this (batch, head), rows
    ``stride_ks``/``stride_vs`` apart, head dim contiguous. Returns the updated (acc, m_i, l_i).
    """
    offs_n = tl.arange(0, BLOCK_N)  # [BLOCK_N]
    offs_d = tl.arange(0, HEAD_DIM)  # [HEAD_DIM]
    cols = start_n + offs_n  # [BLOCK_N]
    col_ok = cols < kv_len  # [BLOCK_N]
    cols64 = cols.to(tl.int64)
    k = tl.load(k_base + cols64[:, None] * stride_ks + offs_d[None, :],
                mask=col_ok[:, None], other=0.0)  # [BLOCK_N, HEAD_DIM]
    if IEEE_FP32:
        s = tl.dot(q, tl.trans(k), input_precision="ieee")  # [BLOCK_M, BLOCK_N]
    elif DOT_IN_FP32:
        s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)))  # [BLOCK_M, BLOCK_N]
    else:
        s = tl.dot(q, tl.trans(k))  # [BLOCK_M, BLOCK_N] fp32
    s = tl.where(col_ok[None, :], s * qk_scale, float("-inf"))  # [BLOCK_M, BLOCK_N]

    m_new = tl.maximum(m_i, tl.max(s, 1))  # [BLOCK_M]
    alpha = tl.exp2(m_i - m_new)  # [BLOCK_M]; exp2(-inf) = 0 on the first block
    p = tl.exp2(s - m_new[:, None])  # [BLOCK_M, BLOCK_N]
    l_i = l_i * alpha + tl.sum(p, 1)

    v = tl.load(v_base + cols64[:, None] * stride_vs + offs_d[None, :],
                mask=col_ok[:, None], other=0.0)  # [BLOCK_N, HEAD_DIM]
    if IEEE_FP32:
        pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")  # [BLOCK_M, HEAD_DIM]
    elif DOT_IN_FP32:  # p rounded to bf16 first, as on the GPU
        pv = tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32))  # [BLOCK_M, HEAD_DIM]
    else:
        pv = tl.dot(p.to(v.dtype), v)  # [BLOCK_M, HEAD_DIM] fp32
    acc = acc * alpha[:, None] + pv
    return acc, m_new, l_i


@triton.jit
def finish_rows(acc, m_i, l_i, o_row_base, stride_os, lse_base, offs_m, seq_q,
                HEAD_DIM: tl.constexpr):
    """Normalise and store BLOCK_M output rows and their natural log-sum-exp.

    Rows with no valid key (l_i == 0) get output 0 and log-sum-exp -inf. ``o_row_base`` points
    at row 0 of this (batch, head) in Out; ``lse_base`` at its row 0 in LSE (contiguous).
    """
    offs_d = tl.arange(0, HEAD_DIM)  # [HEAD_DIM]
    row_ok = offs_m < seq_q  # [BLOCK_M]
    empty = l_i == 0.0  # [BLOCK_M]
    out = acc / tl.where(empty, 1.0, l_i)[:, None]  # [BLOCK_M, HEAD_DIM]
    lse = tl.where(empty, float("-inf"),
                   (m_i + tl.log2(tl.where(empty, 1.0, l_i))) * 0.6931471805599453)  # [BLOCK_M]
    o_ptrs = o_row_base + offs_m.to(tl.int64)[:, None] * stride_os + offs_d[None, :]
    tl.store(o_ptrs, out.to(o_row_base.dtype.element_ty), mask=row_ok[:, None])
    tl.store(lse_base + offs_m, lse, mask=row_ok)


@triton.jit
def attention_fwd_kernel(
    Q, K, V, Out, LSE, KV_LEN,
    stride_qb, stride_qh, stride_qs,
    stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs,
    stride_ob, stride_oh, stride_os,
    num_heads, seq_q, seq_k,
    qk_scale,  # softmax scale * log2(e)
    HAS_KV_LEN: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IEEE_FP32: tl.constexpr,  # fp32 inputs: exact fp32 products instead of TF32
    DOT_IN_FP32: tl.constexpr,  # interpreter only: its bf16 tl.dot multiplies raw uint16 bits
):
    """One program = BLOCK_M queries of one (batch, head); loops over the valid key blocks.

    Grid: (cdiv(seq_q, BLOCK_M), batch * heads). Q/K/V/Out: (batch, heads, seq, HEAD_DIM) with
    any batch/head/seq strides and a contiguous head dim. LSE: (batch, heads, seq_q) float32,
    contiguous. KV_LEN: (batch,) int32, valid keys per batch item (clamped to [0, seq_k]).
    """
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // num_heads).to(tl.int64)
    h = (pid_bh % num_heads).to(tl.int64)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M]
    offs_d = tl.arange(0, HEAD_DIM)  # [HEAD_DIM]
    row_ok = offs_m < seq_q  # [BLOCK_M]

    kv_len = seq_k
    if HAS_KV_LEN:
        kv_len = tl.minimum(tl.maximum(tl.load(KV_LEN + b), 0), seq_k)

    q_ptrs = (Q + b * stride_qb + h * stride_qh
              + offs_m.to(tl.int64)[:, None] * stride_qs + offs_d[None, :])  # [BLOCK_M, HEAD_DIM]
    q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0)  # [BLOCK_M, HEAD_DIM]
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # running max, log2 domain
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # running sum of exp2(s - m_i)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)  # [BLOCK_M, HEAD_DIM]

    # Only blocks holding at least one valid key are visited.
    for start_n in range(0, kv_len, BLOCK_N):
        acc, m_i, l_i = attend_key_block(
            acc, m_i, l_i, q, k_base, v_base, start_n, kv_len, stride_ks, stride_vs, qk_scale,
            HEAD_DIM, BLOCK_N, IEEE_FP32, DOT_IN_FP32)

    finish_rows(acc, m_i, l_i, Out + b * stride_ob + h * stride_oh, stride_os,
                LSE + pid_bh.to(tl.int64) * seq_q, offs_m, seq_q, HEAD_DIM)
