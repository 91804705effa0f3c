"""SageAttention forward: checks, quantization, launch, ``studio::sage_attention_fwd``, fallback.

Public entry point: :func:`sage_attention`.
"""

from __future__ import annotations

import contextlib
import math
from collections import Counter
from collections.abc import Iterator

import torch

from .. import _runtime as rt
from ..attention.op import check_inputs as check_attention_inputs
from .reference import (
    LOG2E,
    k_mean,
    pv_dtype_for,
    sage_attention_reference,
    v_fp8_scales,
)

try:  # Triton is optional: without it the torch emulation runs.
    from . import kernel as _kernel
except ImportError:  # pragma: no cover - depends on the installation
    _kernel = None

OP = "sage_attention"
SUPPORTED_DTYPES = rt.FLOAT_DTYPES
HEAD_DIMS = rt.ATTENTION_HEAD_DIMS
BLOCK_SIZES = (16, 32, 64, 128)
FP8_MIN_CAPABILITY = (8, 9)

#: Launches since import, by path ("triton" or "reference"); tests read it.
LAUNCHES: Counter[str] = Counter()


_launch_override: tuple[int, int] | None = None


@contextlib.contextmanager
def use_launch(num_warps: int, num_stages: int) -> Iterator[None]:
    """Force Triton's num_warps / num_stages for the attention kernel in this block (bench/gpu
    sweeps launch configurations with it; the tiles are sage_attention's block_m/block_n).
    Not thread-safe: a process-wide setting."""
    global _launch_override
    previous, _launch_override = _launch_override, (num_warps, num_stages)
    try:
        yield
    finally:
        _launch_override = previous


_fast_exp = False


@contextlib.contextmanager
def use_fast_exp(enabled: bool = True) -> Iterator[None]:
    """Compute the fp8 path's probabilities with PTX ``ex2.approx.f16x2`` (two exponentials
    per special-function instruction; kernel ``_exp2_f16x2``) in this block. Off by default
    until bench/gpu measures it; CUDA with fp8 P·V only (ignored elsewhere: the interpreter
    cannot run inline PTX). Not thread-safe: a process-wide setting."""
    global _fast_exp
    previous, _fast_exp = _fast_exp, bool(enabled)
    try:
        yield
    finally:
        _fast_exp = previous


def device_supports_fp8(device: torch.device) -> bool:
    """True on CUDA devices of compute capability >= 8.9 (Ada, Hopper, Blackwell)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= FP8_MIN_CAPABILITY


def fallback_reason(q: torch.Tensor) -> str | None:
    """Why this call runs the torch emulation instead of Triton; None when Triton runs."""
    return rt.attention_fallback_reason(_kernel, "sage_attention_fwd_kernel", q)


def quantize_int8_fused(x: torch.Tensor, block: int, pre_scale: float = 1.0,
                        mean: torch.Tensor | None = None, out: torch.Tensor | None = None,
                        scales: torch.Tensor | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`reference.quantize_per_block` of ``x·pre_scale - mean`` in one Triton pass.

    x: (batch, heads, seq, head_dim) fp16/bf16/fp32 with a unit channel stride (any other
    strides, e.g. diffusers' transposed (batch, seq, heads, head_dim)); mean: optional
    (batch, heads, head_dim) float32; out, scales: optional contiguous buffers of the results'
    shapes and dtypes (tests poison them). Returns (int8 (batch, heads, seq, head_dim)
    contiguous, scales (batch, heads, cdiv(seq, block)) float32), bit-identical to the
    reference under the interpreter (the GPU's fp32 division may move a value by one step).
    Needs Triton (a CUDA tensor, or TRITON_INTERPRET=1 on the CPU)."""
    batch, heads, seq, head_dim = x.shape
    nblocks = -(-seq // block)
    if out is None:
        out = torch.empty(batch, heads, seq, head_dim, device=x.device, dtype=torch.int8)
    if scales is None:
        scales = torch.empty(batch, heads, nblocks, device=x.device, dtype=torch.float32)
    mean_arg = mean.contiguous() if mean is not None else scales
    _kernel.quantize_int8_per_block_kernel[(nblocks, batch * heads)](
        x, mean_arg, out, scales, x.stride(0), x.stride(1), x.stride(2),
        heads, seq, nblocks, float(pre_scale),
        SUBTRACT_MEAN=mean is not None, HEAD_DIM=head_dim, BLOCK=block,
        num_warps=1 if rt.is_interpreted(_kernel.quantize_int8_per_block_kernel) else 4)
    return out, scales


def quantize_v_fp8_fused(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`reference.quantize_v_fp8` with the cast in one Triton pass, stored
    (batch, heads, head_dim, seq) with each channel's tokens contiguous (rows padded to a
    multiple of 16 tokens) and returned as its (batch, heads, seq, head_dim) transposed view,
    so the fp8 P·V operand is K-major (Hopper's wgmma wants it) and 16-byte aligned. Returns
    (v_fp8 view, scales (batch, heads, head_dim) float32)."""
    batch, heads, seq, head_dim = v.shape
    scales = v_fp8_scales(v)
    interpreted = rt.is_interpreted(_kernel.quantize_v_fp8_kernel)
    # Each channel's row padded to a multiple of 16 tokens (16 bytes): Triton specialises
    # integer arguments divisible by 16 and only then issues 16-byte vector loads of V. An
    # unpadded row of 32,760 tokens (Wan 480p x 81) made the attention kernel 2.2x slower in
    # the model than at 75,600 tokens in isolation (H200 profile, 2026-11-30).
    seq_pad = -(-seq // 16) * 16
    out = torch.empty(batch, heads, head_dim, seq_pad, device=v.device,
                      dtype=torch.float8_e4m3fn)[..., :seq]
    block = 64
    _kernel.quantize_v_fp8_kernel[(-(-seq // block), batch * heads)](
        v, scales, out, v.stride(0), v.stride(1), v.stride(2), heads, seq, out.stride(2),
        HEAD_DIM=head_dim, BLOCK=block, EMULATE_RNE=interpreted,
        num_warps=1 if interpreted else 4)
    return out.transpose(-1, -2), scales


def _launch(q, k, v, kv_lengths, scale, pv_fp8, block_m, block_n, out, lse) -> None:
    batch, heads, seq_q, head_dim = q.shape
    seq_k = k.shape[2]
    # SageAttention's quantizers, fused: one read of q, one of k (plus its mean), one of v.
    q_int8, q_scales = quantize_int8_fused(q, block_m, pre_scale=scale * LOG2E)
    k_int8, k_scales = quantize_int8_fused(k, block_n, mean=k_mean(k))
    if pv_fp8:
        v_op, v_scales = quantize_v_fp8_fused(v)
    else:
        v_op = v.to(pv_dtype_for(q.dtype))
        v_scales = q_scales  # unused by the kernel when PV_FP8 is False
    interpreted = rt.is_interpreted(_kernel.sage_attention_fwd_kernel)
    big = head_dim == 128 and not interpreted
    grid = (q_scales.shape[2], batch * heads)
    _kernel.sage_attention_fwd_kernel[grid](
        q_int8, k_int8, v_op, q_scales, k_scales, v_scales, out, lse,
        kv_lengths if kv_lengths is not None else q_scales,
        q_int8.stride(0), q_int8.stride(1), q_int8.stride(2),
        k_int8.stride(0), k_int8.stride(1), k_int8.stride(2),
        v_op.stride(0), v_op.stride(1), v_op.stride(2), v_op.stride(3),
        out.stride(0), out.stride(1), out.stride(2),
        heads, seq_q, seq_k, q_scales.shape[2], k_scales.shape[2],
        HAS_KV_LEN=kv_lengths is not None,
        HEAD_DIM=head_dim,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        PV_FP8=pv_fp8,
        DOT_IN_FP32=interpreted and v_op.dtype == torch.bfloat16,
        EMULATE_RNE=interpreted,
        FAST_EXP=(_fast_exp and pv_fp8 and not interpreted and q.is_cuda
                  and torch.version.hip is None),  # inline PTX: NVIDIA only
        num_warps=(_launch_override[0] if _launch_override and not interpreted
                   else 8 if big and block_m >= 128 else 4),
        num_stages=(1 if interpreted else _launch_override[1] if _launch_override else 3),
    )


@torch.library.custom_op("studio::sage_attention_fwd", mutates_args=("out", "lse"))
def sage_attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       kv_lengths: torch.Tensor | None, scale: float, pv_fp8: bool,
                       block_m: int, block_n: int, out: torch.Tensor, lse: torch.Tensor) -> None:
    """Custom op behind :func:`sage_attention`: writes ``out`` and ``lse`` in place."""
    rt.dispatch_attention(OP, q, out, lse, fallback_reason(q), LAUNCHES,
                          lambda: sage_attention_reference(
                              q, k, v, kv_lengths, scale, pv_fp8, block_m, block_n),
                          lambda: _launch(q, k, v, kv_lengths, scale, pv_fp8, block_m, block_n,
                                          out, lse))


@sage_attention_fwd.register_fake
def _sage_attention_fwd_fake(q, k, v, kv_lengths, scale, pv_fp8, block_m, block_n, out,
                             lse) -> None:
    return None


def default_tiles(q: torch.Tensor) -> tuple[int, int]:
    """(block_m, block_n) when the caller names none: 64 x 128 for head dim 128 on CUDA (the
    fastest of bench/gpu/kernels.py's launch sweep on the H200 at the Wan 720p shape: 584
    TFLOP/s against 535 for 128 x 64, 2026-11-30), 128 x 64 otherwise (SageAttention's
    Q/K blocks)."""
    if q.device.type == "cuda" and q.shape[-1] == 128:
        return 64, 128
    return 128, 64


def sage_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                   kv_lengths: torch.Tensor | None = None, scale: float | None = None,
                   pv_fp8: bool | None = None, block_m: int | None = None,
                   block_n: int | None = None,
                   out: torch.Tensor | None = None,
                   lse: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Low-precision attention after SageAttention (Zhang et al., ICLR 2025) and, for the fp8
    P·V, SageAttention2 (Zhang et al., ICML 2025).

    K is smoothed (its mean over tokens subtracted per batch/head/channel), Q (times
    scale·log2 e) and K are quantized to int8 with one scale per ``block_m`` rows of Q and per
    ``block_n`` rows of K, Q·Kᵀ runs on int8 with int32 accumulation and is dequantized by the
    two block scales, the softmax is online in fp32, and P·V runs in fp8 e4m3 (P scaled by 448,
    V per channel) or in 16-bit (the input's dtype; float16 for float32 inputs), accumulated in
    fp32.

    Args:
        q, k, v, kv_lengths, scale, out, lse: as :func:`studio.kernels.attention.attention`
            (q, k, v: (batch, heads, seq, head_dim); kv_lengths (batch,) int32).
        pv_fp8: P·V in fp8; None picks it when the device supports fp8 (CUDA compute
            capability >= 8.9). True on an older CUDA device raises ValueError.
        block_m, block_n: quantization blocks = kernel tiles, each one of 16, 32, 64, 128
            (block_n >= 32 with fp8 P·V; pv_fp8=None takes 16-bit P·V for block_n 16);
            None picks :func:`default_tiles`.

    Returns:
        (out like q in q's dtype, lse (batch, heads, seq_q) float32 of the dequantized scores).

    Raises:
        ValueError: malformed inputs (see :func:`attention`), a block size outside
            16/32/64/128, pv_fp8=True with block_n 16, or pv_fp8=True on a CUDA device
            without fp8.

    Runs the torch emulation (:func:`sage_attention_reference`, logged once) when Triton
    cannot: no Triton, CPU tensors without TRITON_INTERPRET=1, float64, other head dims.
    """
    check_attention_inputs(q, k, v, kv_lengths)
    tiles = default_tiles(q)
    block_m = tiles[0] if block_m is None else block_m
    block_n = tiles[1] if block_n is None else block_n
    for name, value in (("block_m", block_m), ("block_n", block_n)):
        if value not in BLOCK_SIZES:
            raise ValueError(f"{name} must be one of {', '.join(map(str, BLOCK_SIZES))}, "
                             f"got {value!r}")
    if pv_fp8 and block_n < 32:
        # P·V's reduction runs over block_n keys, and Triton compiles an 8-bit dot only with
        # K >= 32 on the GPU (the interpreter takes any): refused everywhere, so the CPU
        # tests cannot pass a launch the GPU would not compile
        raise ValueError(f"block_n must be 32, 64 or 128 with pv_fp8=True (an 8-bit dot needs "
                         f"K >= 32), got {block_n}")
    if pv_fp8 is None:
        pv_fp8 = device_supports_fp8(q.device) and block_n >= 32
    elif pv_fp8 and q.device.type == "cuda" and not device_supports_fp8(q.device):
        cap = torch.cuda.get_device_capability(q.device)
        raise ValueError(f"pv_fp8=True needs CUDA compute capability >= 8.9, this device has "
                         f"{cap[0]}.{cap[1]}; use pv_fp8=False or None")
    batch, heads, seq_q, head_dim = q.shape
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    out, lse = rt.attention_outputs(q, out, lse)
    torch.ops.studio.sage_attention_fwd(q, k, v, kv_lengths, scale, bool(pv_fp8), block_m,
                                        block_n, out, lse)
    return out, lse
