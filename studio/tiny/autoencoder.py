"""The embedded model's autoencoder: diffusers' ``AutoencoderKLWan`` (Wan's causal 3D VAE),
shrunk (4x spatial and 4x temporal compression, 8 latent channels), and its training
objectives (:class:`VaeTask`, :class:`VaeDecoderTask`), run by :mod:`studio.tiny.train`.

Trained with L1 + L2 reconstruction and a small KL term on world images and clips; then
(optional, stage ``decoder``) the decoder alone is trained further for the frozen encoder
with object edges weighted: the denoiser's latent space is unchanged, and export and
sampling use that decoder once it exists.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

from studio.tiny import world
from studio.train.loop import TrainTask

LATENT_CHANNELS = 8
SPATIAL = 4
TEMPORAL = 4
CLIP_FRAMES = 9
SIZE = 64


def device_default() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def build_vae(decoder_base_dim: int | None = None):
    """The embedded model's autoencoder: AutoencoderKLWan, 64x64x9 RGB <-> 16x16x3 x 8.

    ``decoder_base_dim`` widens the decoder alone (diffusers' ``decoder_base_dim``; None: as
    wide as the encoder, 16), so a sharper decoder can be trained for a frozen encoder whose
    latent space the denoiser already knows (:class:`VaeDecoderTask`).
    """
    from diffusers import AutoencoderKLWan

    return AutoencoderKLWan(base_dim=16, decoder_base_dim=decoder_base_dim,
                            z_dim=LATENT_CHANNELS, dim_mult=[1, 2, 4],
                            num_res_blocks=1, temperal_downsample=[True, True],
                            latents_mean=[0.0] * LATENT_CHANNELS,
                            latents_std=[1.0] * LATENT_CHANNELS,
                            scale_factor_spatial=SPATIAL, scale_factor_temporal=TEMPORAL)


def to_tensor(pixels: np.ndarray, device: torch.device) -> torch.Tensor:
    """uint8 (B, H, W, 3) or (B, F, H, W, 3) -> float (B, 3, F, H, W) in [-1, 1]."""
    x = torch.from_numpy(pixels).to(device)
    if x.ndim == 4:
        x = x[:, None]
    return x.permute(0, 4, 1, 2, 3).float() / 127.5 - 1.0


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    """PSNR in dB of two tensors in [-1, 1]."""
    mse = ((a.clamp(-1, 1) - b.clamp(-1, 1)) / 2).pow(2).mean().item()
    return 10 * np.log10(1.0 / max(mse, 1e-12))


class VaeTask(TrainTask):
    """Reconstruction of world images (3 steps in 4) and clips (1 in 4)."""

    def __init__(self, device: torch.device, image_batch: int = 32, clip_batch: int = 4,
                 kl_weight: float = 1e-6):
        self.device = device
        self.vae = build_vae().to(device)
        self.image_batch, self.clip_batch, self.kl_weight = image_batch, clip_batch, kl_weight
        rng = np.random.default_rng(12345)
        self.fixed_images = next(world.batches(rng, 16))[1]
        self.fixed_clips = next(world.batches(rng, 4, video=True))[1]

    def modules(self):
        return {"vae": self.vae}

    def batch(self, rng):
        video = rng.random() < 0.25
        n = self.clip_batch if video else self.image_batch
        return to_tensor(next(world.batches(rng, n, video=video))[1], self.device)

    def loss(self, x, gen):
        post = self.vae.encode(x).latent_dist
        eps = torch.randn(post.mean.shape, generator=gen).to(self.device)
        z = post.mean + post.std * eps
        rec = self.vae.decode(z).sample
        l1 = (rec - x).abs().mean()
        l2 = (rec - x).pow(2).mean()
        kl = post.kl().mean() / x[0].numel()
        return l1 + l2 + self.kl_weight * kl, {"l1": l1.item(), "psnr": psnr(rec.detach(), x)}

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        self.vae.eval()
        out = {}
        for name, pixels in (("image", self.fixed_images), ("clip", self.fixed_clips)):
            x = to_tensor(pixels, self.device)
            rec = self.vae.decode(self.vae.encode(x).latent_dist.mode()).sample
            out[f"psnr_{name}"] = round(float(psnr(rec, x)), 2)
        self.vae.train()
        return out

    def on_checkpoint(self, out_dir, step):
        line = {"step": step, **self.evaluate()}
        with open(out_dir / "eval_log.jsonl", "a") as fh:
            fh.write(json.dumps(line) + "\n")
        print(f"[{type(self).__name__}] step {step}: {line}", file=sys.stderr, flush=True)


class VaeDecoderTask(VaeTask):
    """The decoder trained further on the frozen encoder of a trained VAE, with edges
    weighted: the latent space (and so the denoiser trained on it) stays, the
    reconstructions sharpen. Why: the jointly trained decoder turned small stars, squares and
    triangles into blobs (on 200 held-out renders its reconstructions read as the right
    shape 37 % of the time, which caps the denoiser's shape adherence), while the encoder's
    16x16x8 latents still hold the shape.

    Objective: L1 + L2 as :class:`VaeTask`, each pixel weighted ``1 + edge_weight`` where the
    target's 3x3 neighbourhood spans more than 0.1 (object outlines and texture; flat
    background counts once), plus ``motion_weight`` in clip frames where the target changed
    by more than 0.1 from the frame before or to the frame after (a moving object's leading
    and trailing edges: the motion the 4x temporal compression keeps in the latents, which
    the decoder was giving back as a still object), latents sampled from the encoder's
    posterior. Only the decoder and ``post_quant_conv`` learn. ``decoder_base_dim`` None
    keeps the source's decoder and starts from its weights; a width starts a wider decoder
    from scratch.

    ``adversarial_weight`` > 0 adds a patch discriminator on every frame (hinge losses, the
    adversarial term scaled by VQGAN's adaptive weight at ``decoder.conv_out``; see
    :mod:`studio.train.adversarial`): pixel losses alone return the average of what a latent
    may mean, and a small star's points average away. For its first ``adversarial_warmup``
    steps of a sitting only the discriminator learns (on resume it repeats with the trained
    discriminator: harmless). The discriminator is the task's module ``discriminator``.
    """

    optional_modules = frozenset({"discriminator"})  # a restored decoder has none yet

    def __init__(self, device: torch.device, encoder_vae, image_batch: int = 24,
                 clip_batch: int = 4, decoder_base_dim: int | None = None,
                 edge_weight: float = 4.0, motion_weight: float = 0.0,
                 adversarial_weight: float = 0.0, adversarial_warmup: int = 200):
        super().__init__(device, image_batch=image_batch, clip_batch=clip_batch)
        if motion_weight < 0 or edge_weight < 0 or adversarial_weight < 0 or \
                adversarial_warmup < 0:
            raise ValueError(f"edge_weight={edge_weight}, motion_weight={motion_weight}, "
                             f"adversarial_weight={adversarial_weight}, adversarial_warmup="
                             f"{adversarial_warmup}: must be >= 0")
        self.edge_weight, self.motion_weight = edge_weight, motion_weight
        self.adversarial_weight, self.adversarial_warmup = adversarial_weight, adversarial_warmup
        self.critic = None
        self._steps_this_sitting = 0
        if adversarial_weight > 0:
            from studio.train.adversarial import AdversarialCritic, PatchDiscriminator

            self.critic = AdversarialCritic(PatchDiscriminator().to(device))
        self.vae = build_vae(decoder_base_dim).to(device)
        source = encoder_vae.state_dict()
        if decoder_base_dim is None:
            self.vae.load_state_dict(source)
        else:
            kept = {k: v for k, v in source.items()
                    if k.startswith(("encoder.", "quant_conv."))}
            missing, unexpected = self.vae.load_state_dict(kept, strict=False)
            if unexpected or any(k.startswith(("encoder.", "quant_conv.")) for k in missing):
                raise ValueError("encoder_vae: its encoder does not fit build_vae()'s")
        self.vae.encoder.requires_grad_(False)
        self.vae.quant_conv.requires_grad_(False)

    def modules(self):
        if self.critic is None:
            return {"vae": self.vae}
        return {"vae": self.vae, "discriminator": self.critic.discriminator}

    def pixel_weights(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 1, F, H, W) loss weights of targets x (B, 3, F, H, W) in [-1, 1]."""
        b, c, f, h, w = x.shape
        frames = x.transpose(1, 2).reshape(b * f, c, h, w)
        spread = (torch.nn.functional.max_pool2d(frames, 3, 1, 1)
                  + torch.nn.functional.max_pool2d(-frames, 3, 1, 1)).amax(1, keepdim=True)
        edge = (spread > 0.1).float().view(b, f, 1, h, w).transpose(1, 2)
        weight = 1 + self.edge_weight * edge
        if f > 1 and self.motion_weight:
            step = ((x[:, :, 1:] - x[:, :, :-1]).abs().amax(1, keepdim=True) > 0.1).float()
            moved = torch.zeros_like(weight)
            moved[:, :, 1:] = step  # changed since the frame before
            moved[:, :, :-1] = torch.maximum(moved[:, :, :-1], step)  # ... or to the next
            weight = weight + self.motion_weight * moved
        return weight

    def loss(self, x, gen):
        with torch.no_grad():
            post = self.vae.encode(x).latent_dist
            weight = self.pixel_weights(x)
        eps = torch.randn(post.mean.shape, generator=gen).to(self.device)
        rec = self.vae.decode(post.mean + post.std * eps).sample
        l1 = (weight * (rec - x).abs()).mean()
        l2 = (weight * (rec - x).pow(2)).mean()
        metrics = {"l1": (rec - x).abs().mean().item(), "psnr": psnr(rec.detach(), x)}
        if self.critic is None:
            return l1 + l2, metrics
        from studio.train.adversarial import adaptive_adversarial_weight

        b, c, f, h, w = x.shape
        real = x.transpose(1, 2).reshape(b * f, c, h, w)
        fake = rec.transpose(1, 2).reshape(b * f, c, h, w)
        metrics["d_loss"] = self.critic.step(real, fake)
        self._steps_this_sitting += 1
        if self._steps_this_sitting <= self.adversarial_warmup:
            return l1 + l2, metrics
        g_adv = self.critic.generator_loss(fake)
        lam = self.adversarial_weight * adaptive_adversarial_weight(
            l1 + l2, g_adv, self.vae.decoder.conv_out.weight)
        metrics.update(g_adv=float(g_adv.detach()), adv_lambda=float(lam))
        return l1 + l2 + lam * g_adv, metrics

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """PSNR on the fixed images and clips, and the adherence evaluator's shape and
        colour accuracy on reconstructions of 64 held-out renders (the decoder's ceiling
        for the denoiser)."""
        from studio.tiny import evaluate

        out = super().evaluate()
        self.vae.eval()
        prompts = world.eval_prompts(64, "t2i", 0)
        rng = np.random.default_rng(0)
        pixels = np.stack([world.render_image(spec, SIZE, SIZE, rng) for _, spec in prompts])
        x = to_tensor(pixels, self.device)
        rec = self.vae.decode(self.vae.encode(x).latent_dist.mode()).sample[:, :, 0]
        rec = ((rec.clamp(-1, 1) + 1) * 127.5).round().byte().permute(0, 2, 3, 1).cpu().numpy()
        acc = evaluate.evaluate(list(rec), [spec for _, spec in prompts]).accuracy
        out.update(recon_shape=round(acc["shape"], 3), recon_colour=round(acc["colour"], 3))
        prompts = world.eval_prompts(32, "t2v", 0)
        clips = np.stack([world.render_clip(spec, CLIP_FRAMES, SIZE, SIZE, rng)
                          for _, spec in prompts])
        x = to_tensor(clips, self.device)
        rec = self.vae.decode(self.vae.encode(x).latent_dist.mode()).sample
        rec = ((rec.clamp(-1, 1) + 1) * 127.5).round().byte().permute(0, 2, 3, 4, 1)
        acc = evaluate.evaluate(list(rec.cpu().numpy()), [spec for _, spec in prompts]).accuracy
        out.update(recon_motion=round(acc["motion"], 3))
        self.vae.train()
        return out


def export_vae(vae, mean: torch.Tensor, std: torch.Tensor):
    """A copy of ``vae`` whose config carries the latent statistics the pipelines use."""
    from diffusers import AutoencoderKLWan

    config = dict(vae.config)
    config.update(latents_mean=[float(v) for v in mean], latents_std=[float(v) for v in std])
    config = {k: v for k, v in config.items() if not k.startswith("_")}
    out = AutoencoderKLWan(**config)
    out.load_state_dict(vae.state_dict())
    return out.to(next(vae.parameters()).device).eval()


def load_trained_vae(run: Path, device: torch.device, *, decoder: bool = True):
    """The VAE of ``run``: with the decoder of ``run/decoder/checkpoint`` (stage
    ``decoder``, any width) when it has been trained (and ``decoder``), else
    ``run/vae/checkpoint``'s as trained jointly."""
    from safetensors import safe_open
    from safetensors.torch import load_model

    wide = run / "decoder" / "checkpoint" / "vae.safetensors"
    if decoder and wide.exists():
        with safe_open(str(wide), "pt") as fh:  # the width it was trained with
            width = fh.get_slice("decoder.conv_out.weight").get_shape()[1]
        vae = build_vae(width)
        load_model(vae, str(wide))
    else:
        vae = build_vae()
        load_model(vae, str(run / "vae" / "checkpoint" / "vae.safetensors"))
    return vae.to(device)
