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


def build_vae(decoder_base_dim: int | None = None, *, temporal_compression: int = TEMPORAL):
    """The embedded model's autoencoder: AutoencoderKLWan, 64x64xF RGB <-> 16x16xF' x 8.

    ``decoder_base_dim`` widens the decoder alone (diffusers' ``decoder_base_dim``; None: as
    wide as the encoder, 16), so a sharper decoder can be trained for a frozen encoder whose
    latent space the denoiser already knows (:class:`VaeDecoderTask`).

    ``temporal_compression``: 4 (the shipped VAE: both down stages halve time, 9 frames -> 3
    latent frames) or 2 (only the second does, ``temperal_downsample [False, True]``: 9 -> 5
    latent frames, for a VAE that keeps more of a clip's motion). Raises ValueError otherwise.
    """
    from diffusers import AutoencoderKLWan

    if temporal_compression not in (2, 4):
        raise ValueError(f"temporal_compression={temporal_compression!r}: must be 2 or 4")
    return AutoencoderKLWan(base_dim=16, decoder_base_dim=decoder_base_dim,
                            z_dim=LATENT_CHANNELS, dim_mult=[1, 2, 4],
                            num_res_blocks=1,
                            temperal_downsample=[temporal_compression == 4, True],
                            latents_mean=[0.0] * LATENT_CHANNELS,
                            latents_std=[1.0] * LATENT_CHANNELS,
                            scale_factor_spatial=SPATIAL,
                            scale_factor_temporal=temporal_compression)


def temporal_compression_of(vae) -> int:
    """Frames per latent frame (after the first) of an AutoencoderKLWan: 2 ** (number of
    down stages that halve time)."""
    return 2 ** sum(bool(t) for t in vae.config.temperal_downsample)


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


ARCHITECTURE_FILE = "architecture.json"


def reconstruction_accuracy(vae, device: torch.device, images: int = 64,
                            clips: int = 32) -> dict[str, float]:
    """The adherence evaluator on ``vae``'s round trip (encode, posterior mode, decode) of
    the world's renders of held-out prompts: shape and colour over ``images`` images, motion
    over ``clips`` clips of 9 frames, 64x64 pixels. The ceiling this autoencoder sets for any
    denoiser trained in its latent space. Returns fractions in [0, 1]
    (``recon_shape``, ``recon_colour``, ``recon_motion``)."""
    from studio.tiny import evaluate

    was_training = vae.training
    vae.eval()
    prompts = world.eval_prompts(images, "t2i", 0)
    rng = np.random.default_rng(0)
    pixels = np.stack([world.render_image(spec, SIZE, SIZE, rng) for _, spec in prompts])
    with torch.no_grad():
        rec = vae.decode(vae.encode(to_tensor(pixels, device)).latent_dist.mode()).sample
    rec = ((rec[:, :, 0].clamp(-1, 1) + 1) * 127.5).round().byte().permute(0, 2, 3, 1)
    acc = evaluate.evaluate(list(rec.cpu().numpy()), [spec for _, spec in prompts]).accuracy
    out = {"recon_shape": round(acc["shape"], 3), "recon_colour": round(acc["colour"], 3)}
    prompts = world.eval_prompts(clips, "t2v", 0)
    frames = np.stack([world.render_clip(spec, CLIP_FRAMES, SIZE, SIZE, rng)
                       for _, spec in prompts])
    with torch.no_grad():
        rec = vae.decode(vae.encode(to_tensor(frames, device)).latent_dist.mode()).sample
    rec = ((rec.clamp(-1, 1) + 1) * 127.5).round().byte().permute(0, 2, 3, 4, 1)
    acc = evaluate.evaluate(list(rec.cpu().numpy()), [spec for _, spec in prompts]).accuracy
    out["recon_motion"] = round(acc["motion"], 3)
    vae.train(was_training)
    return out


class VaeTask(TrainTask):
    """Reconstruction of world images and clips: L1 + L2, each pixel weighted
    ``1 + edge_weight`` on object outlines (see :meth:`pixel_weights`), plus a small KL term.
    The weighted errors are weighted means (divided by the batch's mean weight), so the loss
    keeps plain L1 + L2's scale and the logged losses compare across edge weights. (This
    does not change training while every step's gradient norm exceeds the clip at 1.0, as
    it does early on: the clip then divides out the scale, and AdamW is scale-invariant
    anyway; session 23's normalised sitting matched the unnormalised one to six digits.)

    ``clip_share``: the fraction of steps that draw a batch of ``clip_batch`` clips (9
    frames) instead of ``image_batch`` images; the shipped VAE trained with 0.25, and its
    round trip keeps a clip's motion 64 % of the time. ``temporal_compression``: see
    :func:`build_vae`. ``reconstruction_metrics`` adds :func:`reconstruction_accuracy` to
    each checkpoint's eval line. The architecture is written to ``<run>/architecture.json``
    at the first checkpoint, and :func:`load_trained_vae` builds from it. Raises ValueError
    for ``clip_share`` outside [0, 1] or a negative ``edge_weight``.
    """

    def __init__(self, device: torch.device, image_batch: int = 32, clip_batch: int = 4,
                 kl_weight: float = 1e-6, *, clip_share: float = 0.25,
                 temporal_compression: int = TEMPORAL, edge_weight: float = 0.0,
                 reconstruction_metrics: bool = False):
        if not 0.0 <= clip_share <= 1.0:
            raise ValueError(f"clip_share={clip_share!r}: must be in [0, 1]")
        if edge_weight < 0:
            raise ValueError(f"edge_weight={edge_weight!r}: must be >= 0")
        self.device = device
        self.vae = build_vae(temporal_compression=temporal_compression).to(device)
        self.image_batch, self.clip_batch, self.kl_weight = image_batch, clip_batch, kl_weight
        self.clip_share, self.edge_weight = clip_share, edge_weight
        self.motion_weight = 0.0
        self.reconstruction_metrics = reconstruction_metrics
        rng = np.random.default_rng(12345)
        self.fixed_images = next(world.batches(rng, 16))[1]
        self.fixed_clips = next(world.batches(rng, 4, video=True))[1]

    def architecture(self) -> dict:
        """What :func:`load_trained_vae` needs to build this task's VAE."""
        return {"temporal_compression": temporal_compression_of(self.vae)}

    def modules(self):
        return {"vae": self.vae}

    def batch(self, rng):
        video = rng.random() < self.clip_share
        n = self.clip_batch if video else self.image_batch
        return to_tensor(next(world.batches(rng, n, video=video))[1], self.device)

    def pixel_weights(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 1, F, H, W) loss weights of targets x (B, 3, F, H, W) in [-1, 1]: 1, plus
        ``edge_weight`` where the target's 3x3 neighbourhood spans more than 0.1 (object
        outlines and texture), plus ``motion_weight`` in clip frames where the target
        changed by more than 0.1 from the frame before or to the frame after."""
        b, c, f, h, w = x.shape
        weight = torch.ones(b, 1, f, h, w, device=x.device)
        if self.edge_weight:
            frames = x.transpose(1, 2).reshape(b * f, c, h, w)
            spread = (torch.nn.functional.max_pool2d(frames, 3, 1, 1)
                      + torch.nn.functional.max_pool2d(-frames, 3, 1, 1)).amax(1, keepdim=True)
            edge = (spread > 0.1).float().view(b, f, 1, h, w).transpose(1, 2)
            weight = weight + self.edge_weight * edge
        if f > 1 and self.motion_weight:
            step = ((x[:, :, 1:] - x[:, :, :-1]).abs().amax(1, keepdim=True) > 0.1).float()
            moved = torch.zeros_like(weight)
            moved[:, :, 1:] = step  # changed since the frame before
            moved[:, :, :-1] = torch.maximum(moved[:, :, :-1], step)  # ... or to the next
            weight = weight + self.motion_weight * moved
        return weight

    def loss(self, x, gen):
        post = self.vae.encode(x).latent_dist
        eps = torch.randn(post.mean.shape, generator=gen).to(self.device)
        z = post.mean + post.std * eps
        rec = self.vae.decode(z).sample
        if self.edge_weight or self.motion_weight:
            with torch.no_grad():
                weight = self.pixel_weights(x)
                weight = weight / weight.mean()  # a weighted mean: plain L1's scale
            l1 = (weight * (rec - x).abs()).mean()
            l2 = (weight * (rec - x).pow(2)).mean()
        else:
            l1 = (rec - x).abs().mean()
            l2 = (rec - x).pow(2).mean()
        kl = post.kl().mean() / x[0].numel()
        return l1 + l2 + self.kl_weight * kl, {"l1": (rec - x).abs().mean().item(),
                                               "psnr": psnr(rec.detach(), x)}

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        self.vae.eval()
        out = {}
        for name, pixels in (("image", self.fixed_images), ("clip", self.fixed_clips)):
            x = to_tensor(pixels, self.device)
            rec = self.vae.decode(self.vae.encode(x).latent_dist.mode()).sample
            out[f"psnr_{name}"] = round(float(psnr(rec, x)), 2)
        if self.reconstruction_metrics:
            out.update(reconstruction_accuracy(self.vae, self.device))
        self.vae.train()
        return out

    def write_architecture(self, out_dir: Path) -> None:
        """Writes ``out_dir/architecture.json`` (atomically) unless it exists."""
        arch = Path(out_dir) / ARCHITECTURE_FILE
        if not arch.exists():
            arch.parent.mkdir(parents=True, exist_ok=True)
            tmp = arch.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.architecture()) + "\n")
            tmp.replace(arch)

    def on_checkpoint(self, out_dir, step):
        self.write_architecture(out_dir)
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
    ``clip_share``: the share of steps on clips, as :class:`VaeTask`'s.
    """

    optional_modules = frozenset({"discriminator"})  # a restored decoder has none yet

    def __init__(self, device: torch.device, encoder_vae, image_batch: int = 24,
                 clip_batch: int = 4, decoder_base_dim: int | None = None,
                 edge_weight: float = 4.0, motion_weight: float = 0.0,
                 adversarial_weight: float = 0.0, adversarial_warmup: int = 200,
                 clip_share: float = 0.25):
        compression = temporal_compression_of(encoder_vae)
        super().__init__(device, image_batch=image_batch, clip_batch=clip_batch,
                         temporal_compression=compression, reconstruction_metrics=True,
                         clip_share=clip_share)
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
        self.vae = build_vae(decoder_base_dim, temporal_compression=compression).to(device)
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


def export_vae(vae, mean: torch.Tensor, std: torch.Tensor):
    """A copy of ``vae`` whose config carries the latent statistics the pipelines use."""
    from diffusers import AutoencoderKLWan

    config = dict(vae.config)
    config.update(latents_mean=[float(v) for v in mean], latents_std=[float(v) for v in std])
    config = {k: v for k, v in config.items() if not k.startswith("_")}
    out = AutoencoderKLWan(**config)
    out.load_state_dict(vae.state_dict())
    return out.to(next(vae.parameters()).device).eval()


def vae_architecture(run: Path) -> dict:
    """``run/vae/architecture.json`` (written by :class:`VaeTask`), or the shipped VAE's
    architecture for runs that predate it (``{"temporal_compression": 4}``)."""
    arch = Path(run) / "vae" / ARCHITECTURE_FILE
    found = json.loads(arch.read_text()) if arch.exists() else {}
    return {"temporal_compression": int(found.get("temporal_compression", TEMPORAL))}


def load_trained_vae(run: Path, device: torch.device, *, decoder: bool = True):
    """The VAE of ``run``: with the decoder of ``run/decoder/checkpoint`` (stage
    ``decoder``, any width) when it has been trained (and ``decoder``), else
    ``run/vae/checkpoint``'s as trained jointly; built with the run's
    :func:`vae_architecture`."""
    from safetensors import safe_open
    from safetensors.torch import load_model

    compression = vae_architecture(run)["temporal_compression"]
    wide = run / "decoder" / "checkpoint" / "vae.safetensors"
    if decoder and wide.exists():
        with safe_open(str(wide), "pt") as fh:  # the width it was trained with
            width = fh.get_slice("decoder.conv_out.weight").get_shape()[1]
        vae = build_vae(width, temporal_compression=compression)
        load_model(vae, str(wide))
    else:
        vae = build_vae(temporal_compression=compression)
        load_model(vae, str(run / "vae" / "checkpoint" / "vae.safetensors"))
    return vae.to(device)
