"""Block masks for video diffusion: local spatio-temporal windows plus global text tokens.

Token order (Wan, HunyuanVideo, LTX style joint sequences): the video tokens frame-major,
then rows, then columns (token ``i = f·height·width + r·width + c``), followed by
``text_len`` text tokens. Sliding-tile and radial attention (Zhang et al., "Fast Video Generation with Sliding
Tile Attention", 2025; Li et al., "Radial Attention", 2025) keep such local windows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

BLOCK_SIZES = (16, 32, 64, 128)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _check_layout(frames: int, height: int, width: int, text_len: int, block_m: int,
                  block_n: int, window: tuple[int, int, int]) -> None:
    for name, value in (("frames", frames), ("height", height), ("width", width)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if not isinstance(text_len, int) or text_len < 0:
        raise ValueError(f"text_len must be an int >= 0, got {text_len!r}")
    for name, value in (("block_m", block_m), ("block_n", block_n)):
        if value not in BLOCK_SIZES:
            raise ValueError(f"{name} must be one of {', '.join(map(str, BLOCK_SIZES))}, "
                             f"got {value!r}")
    if (len(window) != 3 or not all(isinstance(w, int) and w >= 0 for w in window)):
        raise ValueError(f"window must be three ints >= 0 (frames, rows, columns), "
                         f"got {window!r}")


def build_video_mask(frames: int, height: int, width: int, text_len: int, block_m: int,
                     block_n: int, window: tuple[int, int, int] = (1, 3, 3),
                     device: torch.device | str = "cpu", sink_frames: int = 0) -> torch.Tensor:
    """The (num_q_blocks, num_k_blocks) bool block mask of a local video window plus text.

    Token level: a video query (f, r, c) sees a video key (f', r', c') iff |f - f'| <= t,
    |r - r'| <= h and |c - c'| <= w for ``window = (t, h, w)`` (half-extents, in latent
    tokens), or f' < ``sink_frames`` (the first latent frames as global keys every query
    sees: an attention sink, after Xiao et al., "Efficient Streaming Language Models with
    Attention Sinks", ICLR 2024; in Wan's causal VAE the first latent frame is the first
    image frame alone, and the embedded model's clips lose their background, colours and sizes
    when later frames cannot see it); every query sees every text key and every text query
    sees every key. A block pair
    (``block_m`` query tokens × ``block_n`` key tokens, blocks cut from the joint sequence of
    length L = frames·height·width + text_len) is kept iff any token pair in it is allowed.

    Computed without the L×L token mask: each query block's tokens are dilated on the
    (frames, height, width) grid by the window (separable max-pooling) and the reached keys are
    reduced per key block. num_q_blocks = cdiv(L, block_m), num_k_blocks = cdiv(L, block_n).

    Raises:
        ValueError: non-positive sizes, negative text_len or window, blocks not in 16..128,
            sink_frames outside [0, frames].
    """
    window = tuple(window)
    _check_layout(frames, height, width, text_len, block_m, block_n, window)
    if not isinstance(sink_frames, int) or not 0 <= sink_frames <= frames:
        raise ValueError(f"sink_frames must be an int in [0, frames={frames}], "
                         f"got {sink_frames!r}")
    n_video = frames * height * width
    total = n_video + text_len
    nqb, nkb = _cdiv(total, block_m), _cdiv(total, block_n)
    mask = torch.zeros(nqb, nkb, dtype=torch.bool, device=device)

    t, h, w = (min(r, size - 1) for r, size in zip(window, (frames, height, width), strict=True))
    video_q_blocks = _cdiv(n_video, block_m)
    owner = (torch.arange(n_video, device=device) // block_m).view(frames, height, width)
    chunk = max(1, (1 << 24) // max(n_video, 1))  # ~64 MB of float32 per chunk
    for lo in range(0, video_q_blocks, chunk):
        ids = torch.arange(lo, min(lo + chunk, video_q_blocks), device=device)
        reach = (owner[None] == ids[:, None, None, None]).float()[:, None]  # (c, 1, F, H, W)
        reach = F.max_pool3d(reach, (2 * t + 1, 1, 1), stride=1, padding=(t, 0, 0))
        reach = F.max_pool3d(reach, (1, 2 * h + 1, 1), stride=1, padding=(0, h, 0))
        reach = F.max_pool3d(reach, (1, 1, 2 * w + 1), stride=1, padding=(0, 0, w))
        keys = torch.zeros(len(ids), nkb * block_n, dtype=torch.bool, device=device)
        keys[:, :n_video] = reach.view(len(ids), n_video) > 0
        mask[lo:lo + len(ids)] = keys.view(len(ids), nkb, block_n).any(dim=-1)
    if sink_frames:
        mask[:, :_cdiv(sink_frames * height * width, block_n)] = True  # sink key blocks
    if text_len:
        mask[:, n_video // block_n:] = True  # key blocks holding a text token
        mask[n_video // block_m:, :] = True  # query blocks holding a text token
    return mask


@dataclass(frozen=True)
class BlockSparseLayout:
    """A block mask in the compact form the kernel iterates over.

    mask: (num_q_blocks, num_k_blocks) bool. kv_indices: (num_q_blocks, max_kept) int32, the
    kept key block indices of each query block in ascending order (padding after ``kv_counts``
    entries is unspecified). kv_counts: (num_q_blocks,) int32.
    """

    mask: torch.Tensor
    kv_indices: torch.Tensor
    kv_counts: torch.Tensor
    block_m: int
    block_n: int

    @classmethod
    def from_mask(cls, mask: torch.Tensor, block_m: int, block_n: int) -> BlockSparseLayout:
        """Compact ``mask`` (a (num_q_blocks, num_k_blocks) bool tensor). One host sync."""
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.dim() != 2:
            got = (f"{mask.dtype} tensor of shape {tuple(mask.shape)}"
                   if isinstance(mask, torch.Tensor) else type(mask).__name__)
            raise ValueError(f"mask must be a 2-D bool tensor (num_q_blocks, num_k_blocks), "
                             f"got {got}")
        for name, value in (("block_m", block_m), ("block_n", block_n)):
            if value not in BLOCK_SIZES:
                raise ValueError(f"{name} must be one of {', '.join(map(str, BLOCK_SIZES))}, "
                                 f"got {value!r}")
        counts = mask.sum(dim=1, dtype=torch.int32)
        # A stable sort of "dropped" flags puts the kept indices first, in ascending order.
        order = torch.sort((~mask).to(torch.int32), dim=1, stable=True).indices
        kept = max(1, int(counts.max())) if mask.numel() else 1
        indices = order[:, :kept].to(torch.int32).contiguous()
        return cls(mask, indices, counts.contiguous(), block_m, block_n)

    @property
    def num_q_blocks(self) -> int:
        return self.mask.shape[0]

    @property
    def num_k_blocks(self) -> int:
        return self.mask.shape[1]

    def density(self) -> float:
        """Fraction of block pairs kept (the compute relative to dense attention)."""
        return float(self.mask.float().mean())

    def to(self, device: torch.device | str) -> BlockSparseLayout:
        return BlockSparseLayout(self.mask.to(device), self.kv_indices.to(device),
                                 self.kv_counts.to(device), self.block_m, self.block_n)
