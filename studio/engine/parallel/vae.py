"""Patch-parallel VAE decode for video: the tiles of diffusers' tiled decode split across
ranks, identical to the single-rank tiled decode.

How: every rank runs the VAE's own ``tiled_decode`` (so tile grid, overlaps and blending are
diffusers' exactly), but its decoder computes only the tiles it owns (tile ``t`` belongs to
rank ``t % world``) and returns zeros of the right shape for the others. Everything after the
decoder (blending the overlaps, cropping, concatenating) is linear in the tiles, so summing
the ranks' partial results (one all-reduce) gives the full result; the final clamp to
[-1, 1], the one non-linear step, is held back during the partial decodes and applied after
the sum. Each rank decodes about 1/world of the tiles.

Source: patch-parallel VAE decoding as in xDiT's DistVAE (Fang et al., 2024); tiled decoding
with linear blending of overlaps is diffusers' ``AutoencoderKLWan.tiled_decode``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode


class _KeepUnclamped(TorchFunctionMode):
    """Makes ``torch.clamp(x, min=-1.0, max=1.0)`` the identity (the tiled decode's final
    clamp, applied by the caller after the all-reduce)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.clamp and kwargs.get("min") == -1.0 and kwargs.get("max") == 1.0:
            return args[0]
        return func(*args, **kwargs)


def parallel_tiled_decode(vae, z: torch.Tensor, group=None) -> tuple[torch.Tensor, int]:
    """Decodes latents (B, C, F, h, w) with ``vae.tiled_decode`` split across the ranks of
    ``group`` (default: the world). Every rank gets the full decoded video (B, 3, T, H, W).

    Returns:
        (decoded video, tiles this rank decoded).

    Raises:
        ValueError: the VAE has no ``tiled_decode`` / ``use_tiling`` (a tiled diffusers video
            VAE such as ``AutoencoderKLWan`` is needed).
    """
    if not hasattr(vae, "tiled_decode") or not hasattr(vae, "decoder"):
        raise ValueError(f"parallel decode: {type(vae).__name__} has no tiled decode")
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    decoder = vae.decoder
    original = decoder.forward
    tile = [-1]
    owned = [0]
    patch = vae.config.get("patch_size") or 1
    up = vae.spatial_compression_ratio // patch
    temporal = 2 ** sum(bool(t) for t in vae.config.get("temperal_downsample", []))
    out_channels = decoder.conv_out.out_channels if hasattr(decoder, "conv_out") else 3

    def forward(x, *args, **kwargs):
        first = kwargs.get("first_chunk", False)
        if first:
            tile[0] += 1
            if tile[0] % world == rank:
                owned[0] += 1
        if tile[0] % world == rank:
            return original(x, *args, **kwargs)
        b, _, _, h, w = x.shape
        return torch.zeros(b, out_channels, 1 if first else temporal, h * up, w * up,
                           dtype=x.dtype, device=x.device)

    decoder.forward = forward
    try:
        with _KeepUnclamped():
            partial = vae.tiled_decode(z, return_dict=False)[0]
    finally:
        del decoder.forward
    partial = partial.contiguous()
    dist.all_reduce(partial, group=group)
    return torch.clamp(partial, min=-1.0, max=1.0), owned[0]
