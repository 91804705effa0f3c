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
    EMULATE_RNE: tl.constexpr = False,  # interpreter only: see to_e4m3
    FAST_EXP: tl.constexpr = False,  # GPU only: exp2 by ex2.approx.f16x2 (see _exp2_f16x2)
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

    # Whole key blocks first, with no bounds checks; the partial last block (if any) after.
    full_end = (kv_len // BLOCK_N) * BLOCK_N
    for start_n in range(0, full_end, BLOCK_N):
        acc, l_i, m_i = _sage_key_block(
            acc, l_i, m_i, q, q_scale, k_base, ks_base, v_base, stride_ks, stride_vs,
            stride_vd, start_n, kv_len, offs_n, offs_d, BLOCK_N, PV_FP8, DOT_IN_FP32,
            EMULATE_RNE, FAST_EXP, False)
    if full_end < kv_len:
        acc, l_i, m_i = _sage_key_block(
            acc, l_i, m_i, q, q_scale, k_base, ks_base, v_base, stride_ks, stride_vs,
            stride_vd, full_end, kv_len, offs_n, offs_d, BLOCK_N, PV_FP8, DOT_IN_FP32,
            EMULATE_RNE, FAST_EXP, True)

    if PV_FP8:
        # P was computed as 448·p (see _sage_key_block), so l_i is 448·Σp: the ratio acc / l_i
        # needs no 1/448, and the log-sum-exp takes log2(448) off the running max.
        v_scale = tl.load(VS + bh * HEAD_DIM + offs_d)  # [HEAD_DIM]
        acc = acc * v_scale[None, :]
        m_i = m_i - LOG2_FP8_MAX
    finish_rows(acc, m_i, l_i, Out + b * stride_ob + h * stride_oh, stride_os, LSE + bh * seq_q,
                offs_m, seq_q, HEAD_DIM)


LOG2_FP8_MAX = tl.constexpr(8.807354922057604)  # log2(448), e4m3's largest finite value


@triton.jit
def _exp2_f16x2(x):
    """2^x for x <= log2(448) with PTX's ``ex2.approx.f16x2``: two results per special-function
    instruction instead of one (float16 output: 10 mantissa bits, far finer than the e4m3 it
    is cast to). GPU only: the interpreter cannot run inline PTX."""
    return tl.inline_asm_elementwise("ex2.approx.f16x2 $0, $1;", "=r,r", [x.to(tl.float16)],
                                     dtype=tl.float16, is_pure=True, pack=2)


@triton.jit
def _sage_key_block(acc, l_i, m_i, q, q_scale, k_base, ks_base, v_base, stride_ks, stride_vs,
                    stride_vd, start_n, kv_len, offs_n, offs_d,
                    BLOCK_N: tl.constexpr, PV_FP8: tl.constexpr, DOT_IN_FP32: tl.constexpr,
                    EMULATE_RNE: tl.constexpr, FAST_EXP: tl.constexpr, MASKED: tl.constexpr):
    """One key block of the online softmax: returns the updated (acc [BLOCK_M, HEAD_DIM],
    l_i [BLOCK_M], m_i [BLOCK_M]). MASKED: bounds-check keys against kv_len (the partial last
    block); unmasked blocks skip the checks and take the running max from the int32 scores.

    With PV_FP8 the probabilities are produced already scaled by 448 (e4m3's largest value;
    SageAttention2's static P scale) by shifting the exponent by log2(448) instead of a
    multiply, and l_i sums those scaled values."""
    cols64 = (start_n + offs_n).to(tl.int64)  # [BLOCK_N]
    k_ptrs = k_base + cols64[:, None] * stride_ks + offs_d[None, :]  # [BLOCK_N, HEAD_DIM]
    v_ptrs = v_base + cols64[:, None] * stride_vs + offs_d[None, :] * stride_vd
    if MASKED:
        col_ok = (start_n + offs_n) < kv_len  # [BLOCK_N]
        k = tl.load(k_ptrs, mask=col_ok[:, None], other=0)  # [BLOCK_N, HEAD_DIM] int8
    else:
        k = tl.load(k_ptrs)
    qk_scale = q_scale * tl.load(ks_base + start_n // BLOCK_N)  # scalar fp32
    s_int = tl.dot(q, tl.trans(k), out_dtype=tl.int32)  # [BLOCK_M, BLOCK_N] int32
    if MASKED:
        s = tl.where(col_ok[None, :], s_int.to(tl.float32) * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # [BLOCK_M], finite: the block has a valid key
    else:
        # the scale is positive, so the max of the int scores gives the max of the scores;
        # s·scale - m then contracts to one FMA per score
        s = s_int.to(tl.float32)
        m_new = tl.maximum(m_i, tl.max(s_int, 1).to(tl.float32) * qk_scale)
    alpha = tl.exp2(m_i - m_new)  # [BLOCK_M]
    shift = m_new
    if PV_FP8:
        shift = m_new - LOG2_FP8_MAX
    if MASKED:
        x = s - shift[:, None]  # [BLOCK_M, BLOCK_N], <= log2(448) (fp8) or 0
    else:
        x = s * qk_scale - shift[:, None]
    if FAST_EXP:
        p = _exp2_f16x2(x)  # [BLOCK_M, BLOCK_N] float16
    else:
        p = tl.exp2(x)  # [BLOCK_M, BLOCK_N] float32
    l_i = l_i * alpha + tl.sum(p.to(tl.float32), 1)

    if MASKED:
        v = tl.load(v_ptrs, mask=col_ok[:, None], other=0.0)  # [BLOCK_N, HEAD_DIM]
    else:
        v = tl.load(v_ptrs)
    if PV_FP8:
        # the per-block product is accumulated separately, then added in fp32:
        # SageAttention2's two-level accumulation
        if FAST_EXP:
            p8 = p.to(tl.float8e4nv)  # [BLOCK_M, BLOCK_N] from float16 (cvt .f16x2 on sm_89+)
        else:
            p8 = to_e4m3(p, DOT_IN_FP32 or EMULATE_RNE)  # [BLOCK_M, BLOCK_N]
        pv = tl.dot(p8, v, out_dtype=tl.float32)  # [BLOCK_M, HEAD_DIM]
    elif DOT_IN_FP32:
        pv = tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32))  # [BLOCK_M, HEAD_DIM]
    else:
        pv = tl.dot(p.to(v.dtype), v)  # [BLOCK_M, HEAD_DIM] fp32
    return acc * alpha[:, None] + pv, l_i, m_new


@triton.jit
def _round_half_even(y):
    """torch.round's rounding (half to even) on fp32, with floor alone (no libdevice, so the
    interpreter and every Triton version agree)."""
    f = tl.floor(y)
    d = y - f
    odd = f - 2.0 * tl.floor(f * 0.5)  # 1.0 for odd f, 0.0 for even (negative f too)
    return tl.where(d > 0.5, f + 1.0, tl.where(d < 0.5, f, f + odd))


@triton.jit
def to_e4m3(x, EMULATE_RNE: tl.constexpr):
    """fp32 -> float8 e4m3 (finite, |x| <= 448), rounding to nearest even. The GPU's cvt does
    that; Triton's interpreter instead rounds ties away and drops the carry into the exponent
    (125.9 -> 64), so under it (EMULATE_RNE) x is first rounded onto the e4m3 grid here and the
    cast is exact."""
    if EMULATE_RNE:
        a = tl.abs(x)
        e = tl.maximum(tl.floor(tl.log2(tl.maximum(a, 1e-30))), -6.0)  # subnormals: ulp 2^-9
        ulp = tl.exp2(e - 3.0)
        x = tl.where(x < 0, -1.0, 1.0) * _round_half_even(a / ulp) * ulp
    return x.to(tl.float8e4nv)


@triton.jit
def _block_rows(num_heads, seq, BLOCK: tl.constexpr):
    """What every per-(block, batch·head) program here starts from: (bh, b, h) as int64 and
    its BLOCK token rows (int64) with their in-range mask. Grid: (blocks, batch*heads)."""
    pid_bh = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK]
    return (pid_bh.to(tl.int64), (pid_bh // num_heads).to(tl.int64),
            (pid_bh % num_heads).to(tl.int64), rows.to(tl.int64), rows < seq)


@triton.jit
def quantize_int8_per_block_kernel(
    X, MEAN, Out, Scales,
    stride_xb, stride_xh, stride_xs,
    num_heads, seq, num_blocks, pre_scale,
    SUBTRACT_MEAN: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One program = one block of BLOCK tokens of one (batch, head): one read of x, one write
    of int8 (what ``reference.quantize_per_block`` does in ~8 eager passes).

    X: (batch, heads, seq, HEAD_DIM) fp16/bf16/fp32, any batch/head/seq strides (unit channel
    stride). MEAN: (batch*heads, HEAD_DIM) fp32, subtracted when SUBTRACT_MEAN (K smoothing).
    y = x·pre_scale - mean; scale = max(absmax(y over the block)/127, fp32 tiny);
    Out: contiguous (batch, heads, seq, HEAD_DIM) int8 = round_half_even(y / scale);
    Scales: (batch*heads, num_blocks) fp32. Grid: (num_blocks, batch*heads).
    """
    bh, b, h, rows64, ok = _block_rows(num_heads, seq, BLOCK)  # rows64, ok: [BLOCK]
    offs_d = tl.arange(0, HEAD_DIM)  # [HEAD_DIM]
    x = tl.load(X + b * stride_xb + h * stride_xh + rows64[:, None] * stride_xs
                + offs_d[None, :], mask=ok[:, None], other=0.0)  # [BLOCK, HEAD_DIM]
    y = x.to(tl.float32) * pre_scale
    if SUBTRACT_MEAN:
        mean = tl.load(MEAN + bh * HEAD_DIM + offs_d)  # [HEAD_DIM] fp32
        y = tl.where(ok[:, None], y - mean[None, :], 0.0)
    amax = tl.max(tl.max(tl.abs(y), 1), 0)  # scalar
    scale = tl.maximum(amax / 127.0, 1.1754943508222875e-38)
    q = tl.minimum(tl.maximum(_round_half_even(y / scale), -127.0), 127.0)
    tl.store(Out + (bh * seq + rows64)[:, None] * HEAD_DIM + offs_d[None, :],
             q.to(tl.int8), mask=ok[:, None])
    tl.store(Scales + bh * num_blocks + tl.program_id(0), scale)


@triton.jit
def quantize_v_fp8_kernel(
    V, VS, Out,
    stride_vb, stride_vh, stride_vs,
    num_heads, seq, stride_od,
    HEAD_DIM: tl.constexpr,
    BLOCK: tl.constexpr,
    EMULATE_RNE: tl.constexpr,  # interpreter only: see to_e4m3
):
    """V / its channel scale, cast to float8 e4m3 and stored seq-contiguous per channel, the
    K-major operand layout Hopper's fp8 wgmma wants (one read, one write).

    V: (batch, heads, seq, HEAD_DIM) any batch/head/seq strides; VS: (batch*heads, HEAD_DIM)
    fp32 channel scales (absmax/448); Out: (batch, heads, HEAD_DIM, seq) fp8 e4m3, tokens
    contiguous, channel rows stride_od >= seq apart (batch/head strides HEAD_DIM·stride_od).
    Grid: (cdiv(seq, BLOCK), batch*heads).
    """
    bh, b, h, rows64, ok = _block_rows(num_heads, seq, BLOCK)  # rows64, ok: [BLOCK]
    offs_d = tl.arange(0, HEAD_DIM)  # [HEAD_DIM]
    v = tl.load(V + b * stride_vb + h * stride_vh + rows64[:, None] * stride_vs
                + offs_d[None, :], mask=ok[:, None], other=0.0)  # [BLOCK, HEAD_DIM]
    scale = tl.load(VS + bh * HEAD_DIM + offs_d)  # [HEAD_DIM]
    v8 = to_e4m3(v.to(tl.float32) / scale[None, :], EMULATE_RNE)
    tl.store(Out + (bh * HEAD_DIM + offs_d.to(tl.int64)[None, :]) * stride_od + rows64[:, None],
             v8, mask=ok[:, None])
