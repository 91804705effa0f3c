"""AdaLN-modulated LayerNorm / RMSNorm in plain torch (float32 math)."""

from __future__ import annotations

import torch


def as_rows(mod: torch.Tensor) -> torch.Tensor:
    """(batch, dim) -> (batch, 1, dim); (batch, 1 or seq, dim) unchanged."""
    return mod[:, None, :] if mod.dim() == 2 else mod


def adaln_norm_reference(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor,
                         norm: str = "layer", eps: float = 1e-6) -> torch.Tensor:
    """``norm(x) * (1 + scale) + shift`` in float32, returned in x's dtype.

    x: (batch, seq, dim); scale, shift: (batch, dim), (batch, 1, dim) or (batch, seq, dim).
    norm "layer": (x - mean) / sqrt(var + eps) (biased variance, no affine, as
    ``torch.nn.LayerNorm(dim, elementwise_affine=False)``); "rms": x / sqrt(mean(x²) + eps).
    """
    xf = x.float()
    if norm == "rms":
        xn = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    else:
        xn = torch.nn.functional.layer_norm(xf, (x.shape[-1],), eps=eps)
    return (xn * (1.0 + as_rows(scale).float()) + as_rows(shift).float()).to(x.dtype)
