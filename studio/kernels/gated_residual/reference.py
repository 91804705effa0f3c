"""Gated residual ``x + gate * y`` in plain torch (float32 math)."""

from __future__ import annotations

import torch


def gated_residual_reference(x: torch.Tensor, gate: torch.Tensor,
                             y: torch.Tensor) -> torch.Tensor:
    """``x + gate * y`` in float32, returned in x's dtype.

    x, y: (batch, seq, dim); gate: (batch, dim), (batch, 1, dim) or (batch, seq, dim).
    """
    g = gate[:, None, :] if gate.dim() == 2 else gate
    return (x.float() + g.float() * y.float()).to(x.dtype)
