"""Attention forward in plain torch: the obviously-right version the Triton kernel must match."""

from __future__ import annotations

import math

import torch


def key_mask(kv_lengths: torch.Tensor | None, batch: int, seq_k: int,
             device: torch.device) -> torch.Tensor | None:
    """(batch, 1, 1, seq_k) bool, True where a key is valid; None when every key is."""
    if kv_lengths is None:
        return None
    cols = torch.arange(seq_k, device=device)
    lengths = kv_lengths.to(device=device, dtype=torch.int64).clamp(0, seq_k)
    return (cols[None, :] < lengths[:, None]).view(batch, 1, 1, seq_k)


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        kv_lengths: torch.Tensor | None = None,
                        scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q kᵀ · scale, masked to the first kv_lengths[b] keys) v, computed in float32
    (float64 for float64 inputs).

    Args:
        q: (batch, heads, seq_q, head_dim). k, v: (batch, heads, seq_k, head_dim).
        kv_lengths: optional (batch,) integer tensor, valid keys per batch item (clamped to
            [0, seq_k]); a batch item with 0 valid keys gets output 0 and log-sum-exp -inf.
        scale: softmax scale, default 1/sqrt(head_dim).

    Returns:
        out (batch, heads, seq_q, head_dim) in q's dtype, and the log-sum-exp of the scaled,
        masked scores (batch, heads, seq_q) float32 (float64 for float64 inputs; natural
        log).
    """
    batch, _, _, head_dim = q.shape
    seq_k = k.shape[2]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    s = torch.matmul(q.to(work), k.to(work).transpose(-1, -2)) * scale  # (b, h, sq, sk)
    mask = key_mask(kv_lengths, batch, seq_k, q.device)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # -inf where a row has no valid key
    p = torch.exp(s - torch.where(torch.isinf(lse), 0.0, lse)[..., None])
    out = torch.matmul(p, v.to(work))
    return out.to(q.dtype), lse
