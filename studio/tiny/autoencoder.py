"""The embedded model's autoencoder: diffusers' ``AutoencoderKLWan`` (Wan's causal 3D VAE),
shrunk (the shipped VAE: 4x spatial and 4x temporal compression, 8 latent channels; the
third VAE in training: 2x spatial, 2x temporal, see :func:`build_vae`), and its training
objectives (:class:`VaeTask`, :class:`VaeDecoderTask`), run by :mod:`studio.tiny.train`.

Trained with L1 + L2 reconstruction and a small KL term on world images and clips, pixels
optionally weighted on object outlines, on the scene's objects and on what moved; then
(optional, stage ``decoder``) the decoder alone is trained further for the frozen encoder:
the denoiser's latent space is unchanged, and export and sampling use that decoder once it
exists. :func:`expand_latent_channels` widens a trained VAE's latent space without changing
its round trip.
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


def build_vae(decoder_base_dim: int | None = None, *, temporal_compression: int = TEMPORAL,
              latent_channels: int = LATENT_CHANNELS, spatial_compression: int = SPATIAL):
    """The embedded model's autoencoder: AutoencoderKLWan, 64x64xF RGB <-> (64/s)x(64/s)xF'
    x C (``spatial_compression`` s, 4 in the shipped VAE: 16x16 latents; ``latent_channels``
    C, 8 in the shipped VAE).

    ``decoder_base_dim`` widens the decoder alone (diffusers' ``decoder_base_dim``; None: as
    wide as the encoder, 16), so a sharper decoder can be trained for a frozen encoder whose
    latent space the denoiser already knows (:class:`VaeDecoderTask`).

    ``spatial_compression`` 4: two down stages (``dim_mult [1, 2, 4]``); 2: one
    (``dim_mult [1, 2]``), 32x32 latents, a round trip that keeps the outline of a 10-pixel
    star the 4x VAEs gave back as a round blob (issue 3's shape bar; training/README.md,
    session 26).

    ``temporal_compression``: 4 (the shipped VAE: both down stages halve time, 9 frames -> 3
    latent frames) or 2 (only the last stage does: 9 -> 5 latent frames, for a VAE that
    keeps more of a clip's motion; the only choice with one down stage). Raises ValueError
    otherwise, for ``spatial_compression`` other than 2 or 4, or for ``latent_channels``
    outside [1, 64].
    """
    from diffusers import AutoencoderKLWan

    if temporal_compression not in (2, 4):
        raise ValueError(f"temporal_compression={temporal_compression!r}: must be 2 or 4")
    if spatial_compression not in (2, 4):
        raise ValueError(f"spatial_compression={spatial_compression!r}: must be 2 or 4")
    if spatial_compression == 2 and temporal_compression != 2:
        raise ValueError(f"temporal_compression={temporal_compression!r}: must be 2 with "
                         "spatial_compression 2 (one down stage halves time at most once)")
    if not 1 <= latent_channels <= 64:
        raise ValueError(f"latent_channels={latent_channels!r}: must be in [1, 64]")
    if spatial_compression == 4:
        dim_mult, temporal = [1, 2, 4], [temporal_compression == 4, True]
    else:
        dim_mult, temporal = [1, 2], [True]
    return AutoencoderKLWan(base_dim=16, decoder_base_dim=decoder_base_dim,
                            z_dim=latent_channels, dim_mult=dim_mult,
                            num_res_blocks=1,
                            temperal_downsample=temporal,
                            latents_mean=[0.0] * latent_channels,
                            latents_std=[1.0] * latent_channels,
                            scale_factor_spatial=spatial_compression,
                            scale_factor_temporal=temporal_compression)


def spatial_compression_of(vae) -> int:
    """Pixels per latent pixel along each side of an AutoencoderKLWan: 2 ** (number of
    down stages)."""
    return 2 ** (len(vae.config.dim_mult) - 1)


def temporal_compression_of(vae) -> int:
    """Frames per latent frame (after the first) of an AutoencoderKLWan: 2 ** (number of
    down stages that halve time)."""
    return 2 ** sum(bool(t) for t in vae.config.temperal_downsample)


def expand_latent_channels(vae, latent_channels: int, *, seed: int = 0,
                           new_logvar: float = -8.0):
    """A copy of a trained AutoencoderKLWan with more latent channels that decodes exactly
    as ``vae`` does: a warm start for a VAE with room for the detail the trained one drops.

    ``vae`` has C latent channels; the copy has ``latent_channels`` C' > C. The encoder's
    head gives 2C' channels laid out ``[mean (C'), log-variance (C')]``: the old means and
    log-variances go to their places, the new means come from small random rows of the
    head (std a tenth of the old rows', drawn from ``seed``), the new log-variances are
    constant ``new_logvar`` (posterior std exp(-4) ~ 0.018 latent units, as the trained
    channels'). ``quant_conv`` / ``post_quant_conv`` (1x1x1) keep their old blocks and pass
    the new channels through (identity); the decoder's ``conv_in`` gets zero weights for
    them. So the copy's round trip equals the original's, and training grows the new
    channels from there (the decoder's new weights get gradients at once; the encoder's new
    rows as soon as those are non-zero). The idea is the function-preserving widening of
    Net2Net (Chen, Goodfellow and Shlens, 2016).

    Returns the new model (float32, on ``vae``'s device, in ``vae``'s train/eval mode; its
    ``latents_mean`` / ``latents_std`` reset to 0 / 1). Raises ValueError when
    ``latent_channels`` is not larger than C.
    """
    from diffusers import AutoencoderKLWan

    old_c = int(vae.config.z_dim)
    if latent_channels <= old_c:
        raise ValueError(f"latent_channels={latent_channels}: must exceed the VAE's {old_c}")
    new_c = latent_channels
    config = {k: v for k, v in dict(vae.config).items() if not k.startswith("_")}
    config.update(z_dim=new_c, latents_mean=[0.0] * new_c, latents_std=[1.0] * new_c)
    new = AutoencoderKLWan(**config)
    old_sd = {k: v.detach().float().cpu() for k, v in vae.state_dict().items()}
    sd = new.state_dict()
    for k, v in old_sd.items():
        if sd[k].shape == v.shape:
            sd[k] = v.clone()
    # old head channel j (mean 0..C-1, log-variance C..2C-1) -> its place among 2C'
    place = list(range(old_c)) + list(range(new_c, new_c + old_c))
    gen = torch.Generator().manual_seed(seed)
    w, b = old_sd["encoder.conv_out.weight"], old_sd["encoder.conv_out.bias"]
    head_w, head_b = torch.zeros_like(sd["encoder.conv_out.weight"]), \
        torch.zeros_like(sd["encoder.conv_out.bias"])
    head_w[place], head_b[place] = w, b
    head_w[old_c:new_c] = torch.randn(head_w[old_c:new_c].shape, generator=gen) * \
        (0.1 * float(w[:old_c].std()))
    head_b[new_c + old_c:] = new_logvar
    sd["encoder.conv_out.weight"], sd["encoder.conv_out.bias"] = head_w, head_b
    q_w = torch.zeros_like(sd["quant_conv.weight"])
    q_b = torch.zeros_like(sd["quant_conv.bias"])
    idx = torch.tensor(place)
    q_w[idx[:, None], idx[None, :]] = old_sd["quant_conv.weight"]
    q_b[idx] = old_sd["quant_conv.bias"]
    fresh = [c for c in range(2 * new_c) if c not in place]
    q_w[fresh, fresh] = 1.0
    sd["quant_conv.weight"], sd["quant_conv.bias"] = q_w, q_b
    p_w = torch.zeros_like(sd["post_quant_conv.weight"])
    p_b = torch.zeros_like(sd["post_quant_conv.bias"])
    p_w[:old_c, :old_c] = old_sd["post_quant_conv.weight"]
    p_b[:old_c] = old_sd["post_quant_conv.bias"]
    new_only = list(range(old_c, new_c))
    p_w[new_only, new_only] = 1.0
    sd["post_quant_conv.weight"], sd["post_quant_conv.bias"] = p_w, p_b
    d_w = torch.zeros_like(sd["decoder.conv_in.weight"])
    d_w[:, :old_c] = old_sd["decoder.conv_in.weight"]
    sd["decoder.conv_in.weight"] = d_w
    new.load_state_dict(sd)
    device = next(vae.parameters()).device
    return new.to(device).train(vae.training)


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
                 reconstruction_metrics: bool = False, object_weight: float = 0.0,
                 latent_channels: int = LATENT_CHANNELS, spatial_compression: int = SPATIAL):
        if not 0.0 <= clip_share <= 1.0:
            raise ValueError(f"clip_share={clip_share!r}: must be in [0, 1]")
        if edge_weight < 0:
            raise ValueError(f"edge_weight={edge_weight!r}: must be >= 0")
        if object_weight < 0:
            raise ValueError(f"object_weight={object_weight!r}: must be >= 0")
        self.device = device
        self.vae = build_vae(temporal_compression=temporal_compression,
                             latent_channels=latent_channels,
                             spatial_compression=spatial_compression).to(device)
        self.image_batch, self.clip_batch, self.kl_weight = image_batch, clip_batch, kl_weight
        self.clip_share, self.edge_weight = clip_share, edge_weight
        self.object_weight = object_weight
        self.motion_weight = 0.0
        self.reconstruction_metrics = reconstruction_metrics
        rng = np.random.default_rng(12345)
        self.fixed_images = next(world.batches(rng, 16))[1]
        self.fixed_clips = next(world.batches(rng, 4, video=True))[1]

    def architecture(self) -> dict:
        """What :func:`load_trained_vae` needs to build this task's VAE."""
        return {"temporal_compression": temporal_compression_of(self.vae),
                "latent_channels": int(self.vae.config.z_dim),
                "spatial_compression": spatial_compression_of(self.vae)}

    def modules(self):
        return {"vae": self.vae}

    def batch(self, rng):
        """Targets ``(B, 3, F, H, W)`` in [-1, 1]; with ``object_weight`` a pair
        ``(targets, objects)``, ``objects`` ``(B, 1, F, H, W)`` in [0, 1]: where the
        scene's objects are (:func:`world.object_coverage`), widened by 2 pixels so their
        outlines count in full."""
        video = rng.random() < self.clip_share
        n = self.clip_batch if video else self.image_batch
        if not self.object_weight:
            return to_tensor(next(world.batches(rng, n, video=video))[1], self.device)
        specs = [world.sample_scene(rng, video=video) for _ in range(n)]
        if video:
            pixels = np.stack([world.render_clip(s, CLIP_FRAMES, SIZE, SIZE, rng) for s in specs])
        else:
            pixels = np.stack([world.render_image(s, SIZE, SIZE, rng) for s in specs])
        cover = np.stack([world.object_coverage(s, CLIP_FRAMES if video else None, SIZE, SIZE)
                          for s in specs])
        cover = torch.from_numpy(cover).to(self.device)
        cover = cover[:, None] if video else cover[:, None, None]  # (B, 1, F, H, W)
        cover = torch.nn.functional.max_pool3d(cover, (1, 5, 5), 1, (0, 2, 2))
        return to_tensor(pixels, self.device), cover

    def pixel_weights(self, x: torch.Tensor, objects: torch.Tensor | None = None) -> torch.Tensor:
        """(B, 1, F, H, W) loss weights of targets x (B, 3, F, H, W) in [-1, 1]: 1, plus
        ``edge_weight`` where the target's 3x3 neighbourhood spans more than 0.1 (object
        outlines and texture), plus ``motion_weight`` in clip frames where the target
        changed by more than 0.1 from the frame before or to the frame after, plus
        ``object_weight`` times ``objects`` (B, 1, F, H, W) when given. Why objects: they
        cover about 3 % of a frame, so plain L1 + L2 spends the model on backgrounds; the
        v2 VAE, trained so, gave small stars back as round blobs (0 of 42 read as stars)."""
        b, c, f, h, w = x.shape
        weight = torch.ones(b, 1, f, h, w, device=x.device)
        if objects is not None and self.object_weight:
            weight = weight + self.object_weight * objects
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

    def loss(self, batch, gen):
        x, objects = batch if isinstance(batch, tuple) else (batch, None)
        post = self.vae.encode(x).latent_dist
        eps = torch.randn(post.mean.shape, generator=gen).to(self.device)
        z = post.mean + post.std * eps
        rec = self.vae.decode(z).sample
        if self.edge_weight or self.motion_weight or objects is not None:
            with torch.no_grad():
                weight = self.pixel_weights(x, objects)
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

    @torch.no_grad()
    def write_reconstruction_grid(self, path: Path, step: int) -> Path:
        """Writes a sample grid of the fixed eval batch (PNG contact sheet, atomically): eight
        images and the four clips' first, middle and last frames, each as the original beside
        its reconstruction (posterior mode)."""
        from studio.store.contact_sheet import SheetItem, key_frame_strip, write_contact_sheet

        self.vae.eval()
        items = []
        for name, pixels in (("image", self.fixed_images[:8]), ("clip", self.fixed_clips[:4])):
            x = to_tensor(pixels, self.device)
            rec = self.vae.decode(self.vae.encode(x).latent_dist.mode()).sample
            # (B, 3, F, H, W) in [-1, 1] -> uint8 (B, F, H, W, 3), as the inputs are laid out
            back = ((rec.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
            back = back.permute(0, 2, 3, 4, 1).cpu().numpy().reshape(
                (len(pixels), -1, *pixels.shape[-3:]))
            for orig, recon in zip(pixels, back, strict=True):
                orig = orig.reshape(-1, *pixels.shape[-3:])
                strip = np.concatenate([key_frame_strip(orig), key_frame_strip(recon)], axis=0)
                lines = (("top: original", "bottom: reconstruction") if len(orig) == 1 else
                         ("top original, bottom rebuilt", "frames: first | middle | last"))
                items.append(SheetItem(strip, (f"{name}, step {step}", *lines),
                                       {"kind": name, "training_step": step}))
        self.vae.train()
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        return write_contact_sheet(path, items, 160)

    def on_checkpoint(self, out_dir, step):
        """Each checkpoint's eval line (``eval_log.jsonl``: :meth:`evaluate`) and sample grid
        (``samples/step_NNNNNN.png``: :meth:`write_reconstruction_grid`)."""
        self.write_architecture(out_dir)
        line = {"step": step, **self.evaluate()}
        with open(out_dir / "eval_log.jsonl", "a") as fh:
            fh.write(json.dumps(line) + "\n")
        self.write_reconstruction_grid(Path(out_dir) / "samples" / f"step_{step:06d}.png", step)
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
                 clip_share: float = 0.25, object_weight: float = 0.0):
        compression = temporal_compression_of(encoder_vae)
        channels, spatial = int(encoder_vae.config.z_dim), spatial_compression_of(encoder_vae)
        super().__init__(device, image_batch=image_batch, clip_batch=clip_batch,
                         temporal_compression=compression, reconstruction_metrics=True,
                         clip_share=clip_share, object_weight=object_weight,
                         latent_channels=channels, spatial_compression=spatial)
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
        self.vae = build_vae(decoder_base_dim, temporal_compression=compression,
                             latent_channels=channels, spatial_compression=spatial).to(device)
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

    def loss(self, batch, gen):
        x, objects = batch if isinstance(batch, tuple) else (batch, None)
        with torch.no_grad():
            post = self.vae.encode(x).latent_dist
            weight = self.pixel_weights(x, objects)
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
    """``run/vae/architecture.json`` (written by :class:`VaeTask`): ``temporal_compression``,
    ``latent_channels`` and ``spatial_compression``, each the shipped VAE's (4, 8, 4) where
    the file (runs that predate it) or the key (runs that predate the key) is missing."""
    arch = Path(run) / "vae" / ARCHITECTURE_FILE
    found = json.loads(arch.read_text()) if arch.exists() else {}
    return {"temporal_compression": int(found.get("temporal_compression", TEMPORAL)),
            "latent_channels": int(found.get("latent_channels", LATENT_CHANNELS)),
            "spatial_compression": int(found.get("spatial_compression", SPATIAL))}


def load_trained_vae(run: Path, device: torch.device, *, decoder: bool = True):
    """The VAE of ``run``: with the decoder of ``run/decoder/checkpoint`` (stage
    ``decoder``, any width) when it has been trained (and ``decoder``), else
    ``run/vae/checkpoint``'s as trained jointly; built with the run's
    :func:`vae_architecture`."""
    from safetensors import safe_open
    from safetensors.torch import load_model

    arch = vae_architecture(run)
    compression, channels = arch["temporal_compression"], arch["latent_channels"]
    spatial = arch["spatial_compression"]
    wide = run / "decoder" / "checkpoint" / "vae.safetensors"
    if decoder and wide.exists():
        with safe_open(str(wide), "pt") as fh:  # the width it was trained with
            width = fh.get_slice("decoder.conv_out.weight").get_shape()[1]
        vae = build_vae(width, temporal_compression=compression, latent_channels=channels,
                        spatial_compression=spatial)
        load_model(vae, str(wide))
    else:
        vae = build_vae(temporal_compression=compression, latent_channels=channels,
                        spatial_compression=spatial)
        load_model(vae, str(run / "vae" / "checkpoint" / "vae.safetensors"))
    return vae.to(device)
