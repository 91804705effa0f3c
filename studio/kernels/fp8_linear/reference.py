"""fp8 linear with row-wise scales in plain torch: the quantizers and a float32 emulation.

Recipe: per-token (row-wise) dynamic float8 e4m3 activations and per-output-channel float8
weights, as in torchao's ``Float8DynamicActivationFloat8WeightConfig(granularity=PerRow())``
and the fp8 recipes of "FP8 Formats for Deep Learning" (Micikevicius et al., 2022); the
product runs on cuBLASLt/CUTLASS through ``torch._scaled_mm``.
"""

from __future__ import annotations

import torch

FP8_MAX = 448.0  # largest finite float8_e4m3fn
TINY = torch.finfo(torch.float32).tiny


def quantize_rows_fp8_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise float8 e4m3 quantization.

    x: (rows, features) float. Returns (x_fp8 (rows, features) float8_e4m3fn contiguous,
    scales (rows, 1) float32) with x ≈ x_fp8 · scale; scale = max(absmax(row) / 448, fp32 tiny).
    """
    xf = x.float()
    scales = (xf.abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp_min(TINY)
    return (xf / scales).to(torch.float8_e4m3fn).contiguous(), scales


def fp8_linear_reference(x: torch.Tensor, weight_fp8: torch.Tensor, weight_scale: torch.Tensor,
                         bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ (weight_fp8 · weight_scale)ᵀ + bias`` with x quantized per row to fp8 first, in
    float32 (what the fp8 product computes up to its accumulation order).

    x: (..., in_features); weight_fp8: (out_features, in_features) float8_e4m3fn;
    weight_scale: (out_features,) float32; bias: (out_features,) or None. Returns
    (..., out_features) in x's dtype.
    """
    rows = x.reshape(-1, x.shape[-1])
    x8, xs = quantize_rows_fp8_reference(rows)
    out = (x8.float() * xs) @ (weight_fp8.float() * weight_scale.float()[:, None]).t()
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype).reshape(*x.shape[:-1], weight_fp8.shape[0])
