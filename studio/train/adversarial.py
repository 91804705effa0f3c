"""Adversarial training pieces for autoencoder decoders: a patch discriminator, the hinge
losses and the adaptive weight that balances the adversarial term against reconstruction.

Why: a decoder trained on pixel losses alone (L1, L2) returns the average of what a latent
could mean, so small details come back blurred (the embedded model's small stars decode as
dots). A discriminator that judges local patches rewards sharp, plausible detail instead.
This is the recipe of the autoencoders behind latent diffusion:

- PatchGAN discriminator: Isola et al., "Image-to-Image Translation with Conditional
  Adversarial Networks" (pix2pix, CVPR 2017): a small convolutional net that outputs one
  real/fake logit per overlapping patch.
- Hinge losses and the adaptive weight ``||grad L_rec|| / ||grad L_adv||`` at the decoder's
  last layer: Esser et al., "Taming Transformers for High-Resolution Image Synthesis"
  (VQGAN, CVPR 2021); the same balance is used by the Stable Diffusion autoencoders
  (Rombach et al., "High-Resolution Image Synthesis with Latent Diffusion Models", 2022).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class PatchDiscriminator(nn.Module):
    """Per-patch real/fake logits of images.

    Input (N, C, H, W) float in [-1, 1]; output (N, 1, H / 4, W / 4) logits (H and W
    multiples of 4). Two stride-2 4x4 convolutions and two 3x3 ones: each logit sees a
    receptive field of 22 x 22 pixels, about the size of the embedded world's objects at 64
    pixels. GroupNorm rather than BatchNorm, so the logits of one image do not depend on
    the rest of the batch.

    Args:
        in_channels: image channels (3 for RGB).
        width: channels of the first layer (doubled after each downsampling).

    Raises:
        ValueError: ``in_channels`` or ``width`` below 1.
    """

    def __init__(self, in_channels: int = 3, width: int = 32):
        super().__init__()
        if in_channels < 1 or width < 1:
            raise ValueError(f"in_channels={in_channels}, width={width}: must be >= 1")
        act = nn.LeakyReLU(0.2)
        self.net = nn.Sequential(
            nn.Conv2d(in_channels, width, 4, 2, 1), act,
            nn.Conv2d(width, 2 * width, 4, 2, 1), nn.GroupNorm(8, 2 * width), act,
            nn.Conv2d(2 * width, 2 * width, 3, 1, 1), nn.GroupNorm(8, 2 * width), act,
            nn.Conv2d(2 * width, 1, 3, 1, 1),
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if images.ndim != 4 or images.shape[-1] % 4 or images.shape[-2] % 4:
            raise ValueError(f"images: expected (N, C, H, W) with H and W multiples of 4, "
                             f"got {tuple(images.shape)}")
        return self.net(images)


def hinge_discriminator_loss(logits_real: torch.Tensor,
                             logits_fake: torch.Tensor) -> torch.Tensor:
    """Hinge loss of the discriminator: ``mean(relu(1 - D(real))) + mean(relu(1 + D(fake)))``
    (scalar; 0 once every real patch scores >= 1 and every fake <= -1)."""
    return F.relu(1 - logits_real).mean() + F.relu(1 + logits_fake).mean()


def generator_adversarial_loss(logits_fake: torch.Tensor) -> torch.Tensor:
    """The generator's (decoder's) side of the hinge game: ``-mean(D(fake))`` (scalar)."""
    return -logits_fake.mean()


def adaptive_adversarial_weight(reconstruction_loss: torch.Tensor,
                                adversarial_loss: torch.Tensor,
                                last_layer_weight: torch.Tensor, *,
                                max_weight: float = 1e4) -> torch.Tensor:
    """VQGAN's balance: the ratio of the two losses' gradient norms at the decoder's last
    layer, so the adversarial term pushes that layer as hard as reconstruction does
    whatever their raw scales (detached scalar in [0, ``max_weight``]).

    Both losses must depend on ``last_layer_weight``; their graphs are kept for the
    backward pass that follows.
    """
    g_rec = torch.autograd.grad(reconstruction_loss, last_layer_weight, retain_graph=True)[0]
    g_adv = torch.autograd.grad(adversarial_loss, last_layer_weight, retain_graph=True)[0]
    weight = g_rec.norm() / (g_adv.norm() + 1e-4)
    return weight.clamp(0.0, max_weight).detach()


class AdversarialCritic:
    """A discriminator with its own optimiser, stepped by the task that owns it (the shared
    training loop steps only the generator's parameters).

    ``step(real, fake)`` makes one discriminator update on (N, C, H, W) images and returns
    its hinge loss; ``generator_loss(fake)`` is the decoder's adversarial loss with the
    discriminator frozen (its parameters get no gradient). The discriminator's weights are
    a module of the task (saved with each checkpoint); its AdamW moments restart on resume.

    Args:
        discriminator: the module to train (e.g. :class:`PatchDiscriminator`).
        lr: AdamW learning rate; betas (0.5, 0.9) as in VQGAN.
    """

    def __init__(self, discriminator: nn.Module, lr: float = 2e-4):
        if lr <= 0:
            raise ValueError(f"lr={lr}: must be > 0")
        self.discriminator = discriminator
        self.discriminator.requires_grad_(False)  # the loop's optimiser must not take it
        self.opt = torch.optim.AdamW(discriminator.parameters(), lr=lr, betas=(0.5, 0.9),
                                     weight_decay=0.0)

    def step(self, real: torch.Tensor, fake: torch.Tensor) -> float:
        d = self.discriminator
        d.requires_grad_(True)
        try:
            loss = hinge_discriminator_loss(d(real.detach()), d(fake.detach()))
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        finally:
            d.requires_grad_(False)
        return float(loss.detach())

    def generator_loss(self, fake: torch.Tensor) -> torch.Tensor:
        return generator_adversarial_loss(self.discriminator(fake))


__all__ = ["PatchDiscriminator", "AdversarialCritic", "hinge_discriminator_loss",
           "generator_adversarial_loss", "adaptive_adversarial_weight"]
