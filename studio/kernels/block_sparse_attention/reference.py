"""Block-sparse attention and video masks, the obvious dense way (token-level masks)."""

from __future__ import annotations

import math

import torch


def video_token_mask(frames: int, height: int, width: int, text_len: int,
                     window: tuple[int, int, int], sink_frames: int = 0) -> torch.Tensor:
    """(L, L) bool, L = frames·height·width + text_len: True where query i may see key j.

    Video tokens (frame-major, then rows, then columns) see each other within the window
    half-extents (t, h, w), and every video token of the first ``sink_frames`` frames; text
    tokens see and are seen by everything.
    """
    n_video = frames * height * width
    idx = torch.arange(n_video)
    f, r, c = idx // (height * width), (idx // width) % height, idx % width
    t, h, w = window
    video = (((f[:, None] - f[None, :]).abs() <= t) & ((r[:, None] - r[None, :]).abs() <= h)
             & ((c[:, None] - c[None, :]).abs() <= w)) | (f[None, :] < sink_frames)
    total = n_video + text_len
    mask = torch.ones(total, total, dtype=torch.bool)
    mask[:n_video, :n_video] = video
    return mask


def block_reduce(token_mask: torch.Tensor, block_m: int, block_n: int) -> torch.Tensor:
    """(cdiv(Lq, block_m), cdiv(Lk, block_n)) bool: a block is kept iff any token pair is."""
    lq, lk = token_mask.shape
    nq, nk = -(-lq // block_m), -(-lk // block_n)
    padded = torch.zeros(nq * block_m, nk * block_n, dtype=torch.bool)
    padded[:lq, :lk] = token_mask
    return padded.view(nq, block_m, nk, block_n).any(dim=3).any(dim=1)


def expand_block_mask(block_mask: torch.Tensor, block_m: int, block_n: int, seq_q: int,
                      seq_k: int) -> torch.Tensor:
    """(seq_q, seq_k) bool token mask: each token pair takes its block's value."""
    return (block_mask.repeat_interleave(block_m, dim=0)
            .repeat_interleave(block_n, dim=1)[:seq_q, :seq_k])


def block_sparse_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                     block_mask: torch.Tensor, block_m: int, block_n: int,
                                     scale: float | None = None
                                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense attention in float32 with the block mask expanded to tokens.

    q: (batch, heads, seq_q, head_dim), k/v: (batch, heads, seq_k, head_dim), block_mask:
    (cdiv(seq_q, block_m), cdiv(seq_k, block_n)) bool shared by all batch items and heads.
    Rows without a kept key give 0 and log-sum-exp -inf. Returns (out in q's dtype, lse
    (batch, heads, seq_q) float32, natural log).
    """
    seq_q, seq_k = q.shape[2], k.shape[2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    allowed = expand_block_mask(block_mask.cpu(), block_m, block_n, seq_q, seq_k).to(q.device)
    s = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    s = s.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - torch.where(torch.isinf(lse), 0.0, lse)[..., None])
    return torch.matmul(p, v.float()).to(q.dtype), lse
