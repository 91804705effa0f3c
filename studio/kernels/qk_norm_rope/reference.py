"""QK RMSNorm followed by rotary position embedding, in plain torch (float32 math)."""

from __future__ import annotations

import torch


def rope_tables(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(seq, head_dim), (batch, seq, head_dim) or diffusers' (1, seq, 1, head_dim) tables ->
    (batch or 1, seq, head_dim)."""
    def fix(t):
        if t.dim() == 4 and t.shape[2] == 1:
            t = t[:, :, 0]
        return t[None] if t.dim() == 2 else t
    return fix(cos), fix(sin)


def qk_norm_rope_reference(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor,
                           sin: torch.Tensor, heads: int, eps: float = 1e-6,
                           norm: str = "head") -> torch.Tensor:
    """RMSNorm (with ``weight``) then interleaved-pair RoPE, float32 math, x's dtype out.

    x: (batch, seq, heads * head_dim). norm "head": RMS over each head's head_dim, weight
    (head_dim,) (Flux, SD3, Qwen-Image); "all": RMS over all heads together, weight
    (heads * head_dim,) (Wan's ``rms_norm_across_heads``). cos, sin: (seq, head_dim),
    (batch, seq, head_dim) or (1, seq, 1, head_dim). For each pair (2i, 2i+1) of a head:
    y[2i] = n[2i]·cos[2i] − n[2i+1]·sin[2i]; y[2i+1] = n[2i+1]·cos[2i+1] + n[2i]·sin[2i+1].
    Returns (batch, seq, heads * head_dim).
    """
    batch, seq, inner = x.shape
    head_dim = inner // heads
    xf = x.float()
    if norm == "all":
        n = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
        n = n.view(batch, seq, heads, head_dim)
    else:
        xh = xf.view(batch, seq, heads, head_dim)
        n = xh * torch.rsqrt(xh.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    c, s = (t.float()[:, :, None, :] for t in rope_tables(cos, sin))
    out = torch.empty_like(n)
    out[..., 0::2] = n[..., 0::2] * c[..., 0::2] - n[..., 1::2] * s[..., 0::2]
    out[..., 1::2] = n[..., 1::2] * c[..., 1::2] + n[..., 0::2] * s[..., 1::2]
    return out.reshape(batch, seq, inner).to(x.dtype)
