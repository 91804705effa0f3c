"""Step previews: a cheap linear latent-to-RGB projection instead of a VAE decode.

The projection (one 3 x C matrix and a bias) is fitted once per loaded model by least
squares: a few random latents are decoded by the model's own VAE at a tiny size, the decoded
pixels are average-pooled to latent resolution, and RGB is regressed on the latent channels.
This is the same kind of map as the hand-tuned ``latent_rgb_factors`` tables of ComfyUI and
A1111 ("approximate" previews), obtained automatically for any VAE, so a new family or a
retrained VAE needs no table. Cost per step: one (h*w, C) x (C, 3) matmul plus a resize.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from PIL import Image

PREVIEW_MAX_SIDE = 256


class LatentPreview:
    """Projects latents to a small uint8 RGB preview.

    Args:
        weight: float32 (C, 3); bias: float32 (3,). Output ``latents @ weight + bias`` is RGB
            in [0, 1] before clipping.
        spatial_factor: pixels per latent cell (the VAE's spatial factor).
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, spatial_factor: int):
        self.weight = weight.float().cpu()
        self.bias = bias.float().cpu()
        self.spatial_factor = spatial_factor

    @torch.no_grad()
    def __call__(self, latents: torch.Tensor) -> np.ndarray:
        """latents: (B, C, F, h, w) or (B, C, h, w), any dtype/device; the first batch item and
        the middle latent frame are shown. Returns uint8 (H', W', 3), long side <= 256 px."""
        lat = latents[0].detach().float().cpu()
        if lat.ndim == 4:
            lat = lat[:, lat.shape[1] // 2]
        rgb = torch.einsum("chw,ck->hwk", lat, self.weight) + self.bias
        arr = (rgb.clamp(0, 1) * 255).round().to(torch.uint8).numpy()
        h, w = arr.shape[:2]
        scale = min(self.spatial_factor, PREVIEW_MAX_SIDE / max(h, w))
        size = (max(1, round(w * scale)), max(1, round(h * scale)))
        if size != (w, h):
            arr = np.asarray(Image.fromarray(arr).resize(size, Image.Resampling.BILINEAR))
        return arr

    @classmethod
    @torch.no_grad()
    def fit(cls, decode: Callable[[torch.Tensor], torch.Tensor], latent_shape: tuple[int, ...],
            spatial_factor: int, *, samples: int = 4, seed: int = 0,
            device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
            ) -> LatentPreview:
        """Fits the projection against ``decode``.

        Args:
            decode: latents in the pipeline's latent space -> pixels (B, 3, [F,] H, W) in
                [-1, 1], H = h * spatial_factor.
            latent_shape: shape of one latent sample without batch, e.g. (C, 1, 8, 8).
            spatial_factor: the VAE's spatial factor.
        """
        gen = torch.Generator(device="cpu").manual_seed(seed)
        xs, ys = [], []
        for _ in range(samples):
            z = torch.randn((1, *latent_shape), generator=gen)
            img = decode(z.to(device=device, dtype=dtype)).float().cpu()
            if img.ndim == 5:  # (B, 3, F, H, W): the first frame decodes the first latent frame
                img, z = img[:, :, 0], z[:, :, 0]
            pooled = torch.nn.functional.avg_pool2d((img + 1) / 2, spatial_factor)
            xs.append(z[0].flatten(1).T)
            ys.append(pooled[0].flatten(1).T)
        x = torch.cat(xs).double()
        x = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], dim=1)
        y = torch.cat(ys).double()
        sol = torch.linalg.lstsq(x, y).solution
        return cls(sol[:-1].float(), sol[-1].float(), spatial_factor)
