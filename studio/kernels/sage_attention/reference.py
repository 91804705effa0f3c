"""SageAttention's quantization recipe in plain torch.

The quantizers here are used by the Triton path too (they prepare its int8/fp8 operands), and
:func:`sage_attention_reference` emulates the whole kernel in torch, so a benchmark can measure
the recipe's quality on a real model without Triton or a GPU.

Recipe: Zhang et al., "SageAttention: Accurate 8-Bit Attention for Plug-and-play Inference
Acceleration", ICLR 2025 (smoothed K, per-block INT8 Q and K); Zhang et al., "SageAttention2:
Efficient Attention with Thorough Outlier Smoothing and Per-thread INT4 Quantization", ICML 2025
(FP8 e4m3 P·V with a static 448 scale on P and per-channel scales on V, two-level accumulation).
"""

from __future__ import annotations

import math

import torch

INT8_MAX = 127.0
FP8_MAX = 448.0  # largest finite float8_e4m3fn
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


def smooth_k(k: torch.Tensor) -> torch.Tensor:
    """k minus its mean over tokens, per (batch, head, channel), in float32.

    Softmax is unchanged (q·(k - μ) = q·k - q·μ shifts each score row by a constant), but the
    channel-wise offset that real models' keys carry no longer dominates the int8 range.
    k: (batch, heads, seq_k, head_dim) -> same shape, float32.
    """
    return k.float() - k_mean(k)[:, :, None, :]


def k_mean(k: torch.Tensor) -> torch.Tensor:
    """K's mean over tokens, (batch, heads, head_dim) float32 (accumulated in float32 without
    materialising a float32 copy of k; the fused quantizer uses the same call)."""
    return k.mean(dim=2, dtype=torch.float32)


def quantize_per_block(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 quantization with one scale per ``block`` consecutive tokens.

    x: (batch, heads, seq, head_dim) float. Returns (x_int8 of x's shape, scales
    (batch, heads, cdiv(seq, block)) float32) with x ≈ x_int8 * scale of the token's block.
    """
    batch, heads, seq, dim = x.shape
    nblocks = -(-seq // block)
    xf = x.float()
    padded = torch.nn.functional.pad(xf, (0, 0, 0, nblocks * block - seq))
    # reshape, not view: q and k arrive as (batch, seq, heads, dim) transposed, and pad is a
    # no-op when seq is a multiple of the block
    amax = padded.reshape(batch, heads, nblocks, block * dim).abs().amax(dim=-1)
    scales = (amax / INT8_MAX).clamp_min(torch.finfo(torch.float32).tiny)
    per_token = scales.repeat_interleave(block, dim=2)[:, :, :seq, None]
    x_int8 = torch.round(xf / per_token).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return x_int8, scales.contiguous()


def quantize_v_fp8(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel float8_e4m3fn quantization of V (SageAttention2).

    v: (batch, heads, seq_k, head_dim). Returns (v_fp8 of v's shape, scales (batch, heads,
    head_dim) float32) with v ≈ v_fp8 * scale of the channel.
    """
    vf = v.float()
    return (vf / (scales := v_fp8_scales(v))[:, :, None, :]).to(torch.float8_e4m3fn), scales


def v_fp8_scales(v: torch.Tensor) -> torch.Tensor:
    """V's per-channel fp8 scales: absmax over tokens / 448, (batch, heads, head_dim) float32
    contiguous (one pass: ``aminmax`` in v's dtype, exact, then float32)."""
    low, high = torch.aminmax(v, dim=2)
    amax = torch.maximum(-low, high).float()
    return (amax / FP8_MAX).clamp_min(torch.finfo(torch.float32).tiny).contiguous()


def pv_dtype_for(dtype: torch.dtype) -> torch.dtype:
    """The 16-bit dtype of the non-fp8 P·V product: the input's, float16 for float32 inputs."""
    return dtype if dtype in (torch.float16, torch.bfloat16) else torch.float16


def quantize_qk(q: torch.Tensor, k: torch.Tensor, scale: float, block_m: int, block_n: int):
    """Q scaled by scale·log2(e) (the kernel works with exp2) then int8 per block_m tokens; K
    smoothed then int8 per block_n tokens. Returns (q_int8, q_scales, k_int8, k_scales)."""
    q_int8, q_scales = quantize_per_block(q.float() * (scale * LOG2E), block_m)
    k_int8, k_scales = quantize_per_block(smooth_k(k), block_n)
    return q_int8, q_scales, k_int8, k_scales


def sage_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             kv_lengths: torch.Tensor | None = None, scale: float | None = None,
                             pv_fp8: bool = False, block_m: int = 128,
                             block_n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's arithmetic in torch: int8 Q·Kᵀ (exact integer products), fp32 softmax,
    P·V in fp8 e4m3 (``pv_fp8``) or in 16-bit (:func:`pv_dtype_for`), fp32 accumulation.

    Shapes and masking as :func:`studio.kernels.attention.reference.attention_reference`.
    Differs from the kernel only in normalising P by the row's final max instead of a running
    max (which changes fp8/16-bit rounding of P, not the recipe). Returns (out in q's dtype,
    log-sum-exp (batch, heads, seq_q) float32 of the dequantized scores, natural log).
    """
    batch, heads, seq_q, head_dim = q.shape
    seq_k = k.shape[2]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    q_int8, q_scales, k_int8, k_scales = quantize_qk(q, k, scale, block_m, block_n)
    qs = q_scales.repeat_interleave(block_m, dim=2)[:, :, :seq_q]  # (b, h, sq)
    ks = k_scales.repeat_interleave(block_n, dim=2)[:, :, :seq_k]  # (b, h, sk)
    # |q_int8·k_int8| <= 127² · 128 < 2**24: exact in float32.
    s2 = torch.matmul(q_int8.float(), k_int8.float().transpose(-1, -2))
    s2 = s2 * qs[..., :, None] * ks[..., None, :]  # log2-domain scores (b, h, sq, sk)
    if kv_lengths is not None:
        cols = torch.arange(seq_k, device=q.device)
        valid = cols[None, :] < kv_lengths.to(q.device, torch.int64).clamp(0, seq_k)[:, None]
        s2 = s2.masked_fill(~valid.view(batch, 1, 1, seq_k), float("-inf"))
    m = s2.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isinf(m), 0.0, m)
    p = torch.exp2(s2 - m)  # (b, h, sq, sk), in [0, 1]
    denom = p.sum(dim=-1, keepdim=True)
    if pv_fp8:
        v_fp8, v_scales = quantize_v_fp8(v)
        p_fp8 = (p * FP8_MAX).to(torch.float8_e4m3fn).float()
        pv = torch.matmul(p_fp8, v_fp8.float()) * (v_scales[:, :, None, :] / FP8_MAX)
    else:
        low = pv_dtype_for(q.dtype)
        pv = torch.matmul(p.to(low).float(), v.to(low).float())
    out = pv / torch.where(denom == 0, 1.0, denom)
    denom = denom[..., 0]
    lse = torch.where(denom == 0, float("-inf"), (m[..., 0] + torch.log2(denom)) * LN2)
    return out.to(q.dtype), lse
