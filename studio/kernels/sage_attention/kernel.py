"""Triton SageAttention forward: int8 Q·Kᵀ with per-block scales, fp32 online softmax,
P·V in fp8 e4m3 or 16-bit, fp32 accumulation.

Zhang et al., "SageAttention", ICLR 2025; Zhang et al., "SageAttention2", ICML 2025. Only
``tl.load``/``tl.store`` with int64 offsets, ``tl.dot`` on int8 (int32 accumulation) and on
float8e4nv/fp16/bf16 (fp32 accumulation): available since Triton 3.0, so it compiles on the GPU
machine's Triton 3.6 as well as on 3.9 here.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..attention.kernel import finish_rows


@triton.jit
def sage_attention_fwd_kernel(
    Q8, K8, V, QS, KS, VS, Out, LSE, KV_LEN,
    stride_qb, stride_qh, stride_qs,
    stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs, stride_vd,
    stride_ob, stride_oh, stride_os,
    num_heads, seq_q, seq_k, num_q_blocks, num_k_blocks,
    HAS_KV_LEN: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,  # = the quantization block of Q (one scale per BLOCK_M rows)
    BLOCK_N: tl.constexpr,  # = the quantization block of K (one scale per BLOCK_N rows)
    PV_FP8: tl.constexpr,  # V holds float8_e4m3fn values scaled per channel by VS
    DOT_IN_FP32: tl.constexpr,  # interpreter only: its bf16 tl.dot multiplies raw uint16 bits
):
    """One program = BLOCK_M queries of one (batch, head). Grid: (num_q_blocks, batch*heads).

    Q8: (batch, heads, seq_q, HEAD_DIM) int8 of q·scale·log2(e); K8: (batch, heads, seq_k,
    HEAD_DIM) int8 of the smoothed k; QS: (batch*heads, num_q_blocks) and KS: (batch*heads,
    num_k_blocks) float32 scales. V: (batch, heads, seq_k, HEAD_DIM) fp16/bf16, or fp8 (any
    strides; a seq-contiguous layout makes the fp8 operand K-major for Hopper's wgmma) with
    VS: (batch*heads, HEAD_DIM) float32 channel scales. Out like q; LSE (batch*heads, seq_q) fp32.
    """
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    bh = pid_bh.to(tl.int64)
    b = (pid_bh // num_heads).to(tl.int64)
    h = (pid_bh % num_heads).to(tl.int64)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M]
    offs_n = tl.arange(0, BLOCK_N)  # [BLOCK_N]
    offs_d = tl.arange(0, HEAD_DIM)  # [HEAD_DIM]
    row_ok = offs_m < seq_q  # [BLOCK_M]

    kv_len = seq_k
    if HAS_KV_LEN:
        kv_len = tl.minimum(tl.maximum(tl.load(KV_LEN + b), 0), seq_k)

    q_ptrs = (Q8 + b * stride_qb + h * stride_qh
              + offs_m.to(tl.int64)[:, None] * stride_qs + offs_d[None, :])  # [BLOCK_M, HEAD_DIM]
    q = tl.load(q_ptrs, mask=row_ok[:, None], other=0)  # [BLOCK_M, HEAD_DIM] int8
    q_scale = tl.load(QS + bh * num_q_blocks + pid_m)  # scalar fp32
    k_base = K8 + b * stride_kb + h * stride_kh
    ks_base = KS + bh * num_k_blocks
    v_base = V + b * stride_vb + h * stride_vh

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # [BLOCK_M], log2 domain
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # [BLOCK_M]
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)  # [BLOCK_M, HEAD_DIM]

    for start_n in range(0, kv_len, BLOCK_N):
        cols = start_n + offs_n  # [BLOCK_N]
        col_ok = cols < kv_len  # [BLOCK_N]
        cols64 = cols.to(tl.int64)
        k = tl.load(k_base + cols64[:, None] * stride_ks + offs_d[None, :],
                    mask=col_ok[:, None], other=0)  # [BLOCK_N, HEAD_DIM] int8
        k_scale = tl.load(ks_base + start_n // BLOCK_N)  # scalar fp32
        s_int = tl.dot(q, tl.trans(k), out_dtype=tl.int32)  # [BLOCK_M, BLOCK_N] int32
        s = s_int.to(tl.float32) * (q_scale * k_scale)  # [BLOCK_M, BLOCK_N] log2 domain
        s = tl.where(col_ok[None, :], s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, 1))  # [BLOCK_M], finite: the block has a valid key
        alpha = tl.exp2(m_i - m_new)  # [BLOCK_M]
        p = tl.exp2(s - m_new[:, None])  # [BLOCK_M, BLOCK_N] in [0, 1]
        l_i = l_i * alpha + tl.sum(p, 1)

        v = tl.load(v_base + cols64[:, None] * stride_vs + offs_d[None, :] * stride_vd,
                    mask=col_ok[:, None], other=0.0)  # [BLOCK_N, HEAD_DIM]
        if PV_FP8:
            # Static scale 448 on P (its max is 1); the per-block product is accumulated
            # separately, then added in fp32: SageAttention2's two-level accumulation.
            p8 = (p * 448.0).to(tl.float8e4nv)  # [BLOCK_M, BLOCK_N]
            pv = tl.dot(p8, v, out_dtype=tl.float32)  # [BLOCK_M, HEAD_DIM]
        elif DOT_IN_FP32:
            pv = tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32))  # [BLOCK_M, HEAD_DIM]
        else:
            pv = tl.dot(p.to(v.dtype), v)  # [BLOCK_M, HEAD_DIM] fp32
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    if PV_FP8:
        v_scale = tl.load(VS + bh * HEAD_DIM + offs_d)  # [HEAD_DIM]
        acc = acc * (v_scale * (1.0 / 448.0))[None, :]
    finish_rows(acc, m_i, l_i, Out + b * stride_ob + h * stride_oh, stride_os, LSE + bh * seq_q,
                offs_m, seq_q, HEAD_DIM)
