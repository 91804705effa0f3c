"""fp8 linear: checks, the ``studio::quantize_rows_fp8`` custom op, ``torch._scaled_mm``.

Public entry points: :func:`fp8_linear`, :func:`quantize_rows_fp8`, :func:`quantize_weight_fp8`.
"""

from __future__ import annotations

from collections import Counter

import torch

from .. import _runtime as rt
from .reference import quantize_rows_fp8_reference

try:  # Triton is optional: without it the torch quantizer runs.
    from . import kernel as _kernel
except ImportError:  # pragma: no cover - depends on the installation
    _kernel = None

OP = "fp8_linear"
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

#: Activation quantizations since import, by path ("triton" or "reference"); tests read it.
LAUNCHES: Counter[str] = Counter()


def fallback_reason(x: torch.Tensor) -> str | None:
    """Why the activations are quantized by the torch reference; None when Triton runs."""
    reason = rt.triton_blocker(_kernel, "quantize_rows_fp8_kernel", x.device)
    if reason is None and x.dtype not in SUPPORTED_DTYPES:
        reason = f"dtype {rt.dtype_name(x.dtype)} (Triton path: float16, bfloat16, float32)"
    return reason


@torch.library.custom_op("studio::quantize_rows_fp8", mutates_args=("out", "scales"))
def quantize_rows_fp8_op(x: torch.Tensor, out: torch.Tensor, scales: torch.Tensor) -> None:
    """Custom op behind :func:`quantize_rows_fp8`: writes ``out`` and ``scales`` in place."""
    if x.numel() == 0:
        return
    reason = fallback_reason(x)
    if reason is not None:
        rt.log_fallback_once(OP, reason)
        LAUNCHES["reference"] += 1
        x8, xs = quantize_rows_fp8_reference(x)
        out.copy_(x8)
        scales.copy_(xs)
        return
    LAUNCHES["triton"] += 1
    rows, features = x.shape
    interpreted = rt.is_interpreted(_kernel.quantize_rows_fp8_kernel)
    block_k = min(rt.next_power_of_2(features), 256 if interpreted else 2048)
    _kernel.quantize_rows_fp8_kernel[(rows,)](
        x, out, scales, x.stride(0), features, BLOCK_K=block_k, EMULATE_RNE=interpreted,
        num_warps=1 if interpreted else (8 if block_k >= 2048 else 4))


@quantize_rows_fp8_op.register_fake
def _quantize_rows_fp8_fake(x, out, scales) -> None:
    return None


def quantize_rows_fp8(x: torch.Tensor, out: torch.Tensor | None = None,
                      scales: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise float8 e4m3 quantization in one Triton pass (the torch reference, logged once,
    where Triton cannot run).

    Args:
        x: (rows, features) float16/bfloat16/float32; a feature stride other than 1 is copied.
        out: optional (rows, features) float8_e4m3fn contiguous buffer.
        scales: optional (rows, 1) float32 contiguous buffer.

    Returns:
        (x_fp8, scales (rows, 1) float32) with x ≈ x_fp8 · scale, scale = absmax(row) / 448
        (at least float32's tiny). Rounding to nearest even, like ``Tensor.to``.

    Raises:
        ValueError: x not a 2-D floating tensor, or buffers of the wrong shape/dtype.
    """
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or not x.is_floating_point():
        raise ValueError(f"x must be a 2-D floating tensor (rows, features), got "
                         f"{getattr(x, 'shape', type(x).__name__)}")
    x = rt.last_dim_contiguous(x)
    rows, features = x.shape
    if out is None:
        out = torch.empty(rows, features, device=x.device, dtype=torch.float8_e4m3fn)
    if scales is None:
        scales = torch.empty(rows, 1, device=x.device, dtype=torch.float32)
    for name, t, shape, dtype in (("out", out, (rows, features), torch.float8_e4m3fn),
                                  ("scales", scales, (rows, 1), torch.float32)):
        if tuple(t.shape) != shape or t.dtype != dtype or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous {shape} {rt.dtype_name(dtype)} "
                             f"tensor, got {tuple(t.shape)} {rt.dtype_name(t.dtype)}")
    torch.ops.studio.quantize_rows_fp8(x, out, scales)
    return out, scales


def quantize_weight_fp8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A linear layer's weight, float8 e4m3 per output channel (once, at load time; torch).

    weight: (out_features, in_features) float. Returns (weight_fp8 (out, in) float8_e4m3fn
    contiguous, scale (out,) float32)."""
    w8, scale = quantize_rows_fp8_reference(weight.detach())
    return w8, scale[:, 0].contiguous()


def fp8_linear(x: torch.Tensor, weight_fp8: torch.Tensor, weight_scale: torch.Tensor,
               bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ wᵀ + bias`` in float8 with row-wise scales: x quantized per token by
    :func:`quantize_rows_fp8` (by its torch reference while torch.compile traces, so that
    inductor fuses the quantization into the producer of x), the product by ``torch._scaled_mm`` (cuBLASLt/CUTLASS on
    Hopper, fp32 accumulation, bf16 output), rescaled by the token and channel scales.

    Args:
        x: (..., in_features) float16/bfloat16/float32; in_features a multiple of 16.
        weight_fp8: (out_features, in_features) float8_e4m3fn contiguous (out_features a
            multiple of 16), from :func:`quantize_weight_fp8`.
        weight_scale: (out_features,) float32.
        bias: optional (out_features,).

    Returns:
        (..., out_features) in x's dtype.

    Raises:
        ValueError: mismatched shapes, or features not multiples of 16 (``_scaled_mm``'s rule).
    """
    features = x.shape[-1]
    out_features = weight_fp8.shape[0]
    if weight_fp8.dim() != 2 or weight_fp8.shape[1] != features:
        raise ValueError(f"weight_fp8 must be (out_features, {features}), got "
                         f"{tuple(weight_fp8.shape)}")
    if features % 16 or out_features % 16:
        raise ValueError(f"in_features and out_features must be multiples of 16 for fp8 "
                         f"matrix multiplies, got {features} and {out_features}")
    if tuple(weight_scale.shape) != (out_features,):
        raise ValueError(f"weight_scale must be ({out_features},), got "
                         f"{tuple(weight_scale.shape)}")
    rows = x.reshape(-1, features)
    if torch.compiler.is_compiling():
        # Under torch.compile the quantizer is traced as torch ops, so inductor fuses the
        # absmax, scale and cast into the kernel that produces x (a norm, a modulation, the
        # attention output's reshape) instead of calling our opaque custom op after it.
        x8, xs = quantize_rows_fp8_reference(rows)
    else:
        x8, xs = quantize_rows_fp8(rows)
    out = torch._scaled_mm(x8, weight_fp8.t(), scale_a=xs, scale_b=weight_scale[None, :],
                           bias=None if bias is None else bias.to(torch.bfloat16),
                           out_dtype=torch.bfloat16)
    return out.to(x.dtype).reshape(*x.shape[:-1], out_features)
