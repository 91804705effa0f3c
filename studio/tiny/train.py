"""Training the embedded model on the synthetic world: autoencoder first, then the denoiser.

    python -m studio.tiny.train vae --out runs/tiny --minutes 60      # resumable
    python -m studio.tiny.train decoder --out runs/tiny --minutes 60  # optional, after vae
    python -m studio.tiny.train dit --out runs/tiny --minutes 120     # needs the VAE
    python -m studio.tiny.train export --out runs/tiny                # -> assets/models/tiny-wan
    python -m studio.tiny.train snapshot --out runs/tiny              # -> training/tiny/dit
    python -m studio.tiny.train restore --out runs/tiny               # <- the repository

``snapshot`` and ``restore`` carry a run between machines through the repository alone
(a session's machine keeps only what is committed). ``snapshot`` writes the denoiser's EMA
weights in fp16 (7 MB), its ``state.json`` and its logs into ``training/tiny/dit`` (and the
decoder's, 2 MB, into ``training/tiny/decoder-w16``, which ``restore`` then prefers to the
shipped VAE's decoder).
``restore`` rebuilds ``<out>`` from the committed VAE checkpoint (``training/tiny/vae``), the
shipped model (``--dest``: its VAE decoder) and the newer of the denoiser snapshot and the
shipped denoiser: live and EMA copies both start from those EMA weights (widened to fp32;
AdamW's moments restart) at their training step.

The pieces are separate: the model builders (:func:`build_vae`, :func:`build_denoiser`), the
data (:mod:`studio.tiny.world`), the objectives (:class:`VaeTask`, :class:`DenoiserTask`) and
the generic loop (:mod:`studio.train.loop`). Uses a GPU when there is one.

Autoencoder: diffusers' ``AutoencoderKLWan`` (Wan's causal 3D VAE), shrunk: 4x spatial and
4x temporal compression, 8 latent channels, trained with L1 + L2 reconstruction and a small
KL term on world images and clips. Then (optional, stage ``decoder``) the decoder alone is
trained further for the frozen encoder with object edges weighted (:class:`VaeDecoderTask`):
the denoiser's latent space is unchanged, and export and sampling use that decoder once it
exists.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from studio.tiny import world
from studio.train.loop import TrainConfig, TrainTask, load_checkpoint, train

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


# ------------------------------------------------------------------------------------------
# Denoiser
# ------------------------------------------------------------------------------------------
TEXT_LEN = 32
EXTRA_WORDS = (",", ":", ".", "object", "shape", "reference", "the", "it")
_COLOUR_RE = None


def vocabulary() -> tuple[str, ...]:
    """The word-level vocabulary: every caption word of the world plus a few extras."""
    return tuple(sorted(set(world.VOCABULARY) | set(EXTRA_WORDS)))


def build_text_stack():
    """(tokenizer, text encoder): a word-level tokenizer and a 2-layer UMT5 encoder (d=64)."""
    from transformers import UMT5Config, UMT5EncoderModel

    from studio.testing.tiny_pipelines import make_word_tokenizer

    tokenizer = make_word_tokenizer(TEXT_LEN, vocabulary())
    cfg = UMT5Config(vocab_size=len(tokenizer), d_model=64, d_kv=16, d_ff=128, num_layers=2,
                     num_heads=4, relative_attention_num_buckets=16, dropout_rate=0.0)
    return tokenizer, UMT5EncoderModel(cfg)


def build_denoiser():
    """The embedded denoiser: WanTransformer3DModel, 6 layers, 3 heads of dim 64."""
    from diffusers import WanTransformer3DModel

    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=3, attention_head_dim=64,
        in_channels=LATENT_CHANNELS, out_channels=LATENT_CHANNELS, text_dim=64, freq_dim=64,
        ffn_dim=512, num_layers=6, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32)


def build_reference_encoder():
    """The reference-token encoder (see :func:`studio.engine.pipelines.wan.reference_tokens`):
    a ``transformers`` ``CLIPVisionModel`` over the reference's normalised latents (B, 8,
    16, 16), patches of 4 x 4 latent cells, 2 layers of width 64 (the text embeddings'
    width): 17 tokens appended to the 32 text tokens of a reference-to-video prompt."""
    from transformers import CLIPVisionConfig, CLIPVisionModel

    cfg = CLIPVisionConfig(num_channels=LATENT_CHANNELS, image_size=SIZE // 4, patch_size=4,
                           hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, projection_dim=64)
    return CLIPVisionModel(cfg)


def anonymise(caption: str) -> str:
    """A caption with colour and shape words removed: "a small red star ..." -> "a small object
    ..." (what a reference-to-video prompt says when the reference gives the object)."""
    import re

    global _COLOUR_RE
    if _COLOUR_RE is None:
        colours = "|".join(sorted(set(world.COLOURS) | {"violet", "grey"}))
        _COLOUR_RE = re.compile(rf"\b({colours})\s+(?=(circle|square|triangle|star)\b)")
    text = _COLOUR_RE.sub("", caption)
    return re.sub(r"\b(circle|square|triangle|star)\b(?!ry)", "object", text)


def reference_image(spec, rng: np.random.Generator) -> np.ndarray:
    """The first object of ``spec`` alone, at a random size and position, on a random other
    background: uint8 (64, 64, 3)."""
    obj = spec.objects[0]
    backgrounds = [b for b in world.BACKGROUNDS
                   if b != spec.background and world.is_allowed(obj.colour, b)]
    ref = world.SceneSpec(background=str(rng.choice(backgrounds)), objects=(
        world.ObjectSpec(obj.colour, obj.shape, str(rng.choice(world.SIZES)),
                         str(rng.choice(world.POSITIONS)), "still"),))
    return world.render_image(ref, SIZE, SIZE, rng)


def flow_matching_loss(transformer, x0: torch.Tensor, text: torch.Tensor,
                       noise: torch.Tensor, s: torch.Tensor, *,
                       first_frame: torch.Tensor | None = None,
                       reference: torch.Tensor | None = None) -> torch.Tensor:
    """The denoiser's training loss on one batch (rectified flow, as the Wan pipelines
    sample it): ``x_t = (1 - s) x_0 + s e``, target ``e - x_0``, per-token timesteps
    ``1000 s``.

    Args:
        transformer: a Wan-style denoiser taking per-token timesteps (B, tokens).
        x0: clean normalised latents (B, C, f, h, w), float32.
        text: text embeddings (B, L, D).
        noise: e, the shape of ``x0``.
        s: noise level per item (B,) in [0, 1].
        first_frame: bool (B,): latent frame 0 given clean at timestep 0 (image-to-video)
            and left out of the loss.
        reference: clean latents (B, C, 1, h, w) appended as a last frame at timestep 0
            (reference-to-video), left out of the loss.
    Returns:
        The mean squared error over the frames in the loss (a 0-dim tensor).
    """
    b, _, f, h, w = x0.shape
    _, ph, pw = transformer.config.patch_size
    sv = s.view(b, 1, 1, 1, 1)
    xt = (1 - sv) * x0 + sv * noise
    target = noise - x0
    t_frame = (s * 1000).view(b, 1).expand(b, f).clone()  # per latent frame
    weight = torch.ones(b, 1, f, 1, 1, device=x0.device)
    if first_frame is not None and first_frame.any():
        xt[first_frame, :, 0] = x0[first_frame, :, 0]
        t_frame[first_frame, 0] = 0
        weight[first_frame, :, 0] = 0
    if reference is not None:
        xt = torch.cat([xt, reference], dim=2)
        t_frame = torch.cat([t_frame, torch.zeros(b, 1, device=x0.device)], dim=1)
    timestep = t_frame.repeat_interleave((h // ph) * (w // pw), dim=1)
    pred = transformer(hidden_states=xt, timestep=timestep, encoder_hidden_states=text,
                       return_dict=False)[0][:, :, :f]
    err = (pred - target).pow(2) * weight
    return err.sum() / (weight.sum() * pred.shape[1] * h * w)


def step_mix(reference_share: float = 0.18) -> dict[str, float]:
    """Probabilities of the denoiser's step kinds: ``reference_share`` of reference-to-video
    clips, the rest images and clips 45 : 37 (the mix of steps 0-21036 was 0.45 / 0.37 /
    0.18).

    Raises:
        ValueError: ``reference_share`` outside [0, 1).
    """
    if not 0 <= reference_share < 1:
        raise ValueError(f"reference_share={reference_share}: must be in [0, 1)")
    rest = (1 - reference_share) / 0.82
    return {"image": 0.45 * rest, "clip": 0.37 * rest, "reference": reference_share}


class DenoiserBatch(NamedTuple):
    """One denoiser step's batch (``DenoiserTask.batch``, ``LatentPool.batch``).

    Attributes:
        captions: B captions ("" where dropped for classifier-free guidance).
        pixels: uint8 (B, H, W, 3) images or (B, F, H, W, 3) clips, or, from the latent
            pool, normalised latents (B, C, f, h, w).
        refs: reference-to-video steps: the references as uint8 (B, H, W, 3) or latents
            (B, C, 1, h, w); None on other steps.
        first_frame: bool (B,): image-to-video samples (first latent frame clean).
        ref_objects: reference steps: each reference object's (colour, shape); else None.
    """

    captions: list[str]
    pixels: np.ndarray | torch.Tensor
    refs: np.ndarray | torch.Tensor | None
    first_frame: np.ndarray
    ref_objects: list[tuple[str, str]] | None = None


def reference_word_targets(task: DenoiserTask, objects: list[tuple[str, str]],
                           encoder: torch.nn.Module | None = None) -> torch.Tensor:
    """What the first two reference tokens are trained toward: the text encoder's embeddings
    of the words "<colour> <shape>" (B, 2, text_dim), detached.

    The denoiser already reads colour and shape from those embeddings in its cross-attention;
    a reference encoder whose tokens land on them hands the reference's object over in words
    it knows. After ELITE (Wei et al., ICCV 2023: a reference image mapped into the text
    encoder's word-embedding space) and Wan 2.1 I2V (image tokens beside the text tokens).
    ``encoder``: the text encoder to use (default the task's live one).
    """
    with torch.no_grad():
        return task.encode_text([f"{c} {s}" for c, s in objects], encoder)[:, :2].detach()


def alignment_error(tokens: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Normalised squared error of reference tokens (B, 2, D) against their word targets
    (B, 2, D): the mean squared error over the targets' mean square (1: all-zero tokens)."""
    return (tokens - target).pow(2).mean() / target.pow(2).mean().clamp_min(1e-8)


class DenoiserTask(TrainTask):
    """Flow matching (rectified flow) of the Wan denoiser and the text encoder on VAE latents.

    x_t = (1 - s) x_0 + s e with s ~ sigmoid(N(m, 1)) (logit-normal, as in SD3; ``m``:
    ``noise_level_mean``, 0 by default, > 0 weighs the high noise levels where sampling
    decides the composition more), target
    e - x_0, timestep s * 1000: exactly what ``FlowMatchEulerDiscreteScheduler`` integrates.
    Step kinds: images (one latent frame), clips (three latent frames; 40 % of them
    image-to-video: the first latent frame clean with timestep 0, as Wan 2.2 TI2V's
    ``expand_timesteps``), and reference-to-video clips (a clean reference latent frame
    appended after the clip, timestep 0, the caption without colour and shape, 70 % of the
    time). 10 % of captions are dropped for classifier-free guidance.

    ``reference_alignment`` > 0 adds, on reference steps, that weight times the normalised
    squared error between the first two reference tokens and the text embeddings of the
    reference object's colour and shape words (:func:`reference_word_targets`), so the
    reference encoder speaks the denoiser's language; ``reference_lr_scale`` multiplies the
    reference encoder's learning rate (it trains from far behind the denoiser).

    Reference clips also get the reference's tokens from a small image encoder
    (:func:`build_reference_encoder`, trained with the denoiser, module
    ``reference_encoder``) appended to the text embeddings; 10 % of them are zeroed (the
    unconditional branch's tokens at sampling). Why: in 20,000 steps the denoiser never
    learned to look the object up in the appended frame (its loss was the same with another
    clip's reference), while it reads colour and shape from cross-attention tokens well; Wan
    2.1 I2V likewise gives its image both as latents and as CLIP tokens. The module was added
    at step 20038 and is optional in older checkpoints (it starts fresh).
    """

    optional_modules = frozenset({"reference_encoder", "ema_reference_encoder"})
    step_kinds = step_mix()  # the default mix; an instance's comes from reference_share

    def __init__(self, device: torch.device, vae, *, image_batch: int = 48,
                 clip_batch: int = 12, ema_decay: float = 0.999, pool: bool = False,
                 reference_share: float = 0.18, noise_level_mean: float = 0.0,
                 reference_alignment: float = 0.0, reference_lr_scale: float = 1.0):
        import copy

        step_kinds = step_mix(reference_share)  # bad input fails before anything is built
        if not -3.0 <= noise_level_mean <= 3.0:
            raise ValueError(f"noise_level_mean={noise_level_mean}: must be in [-3, 3]")
        if not 0.0 <= reference_alignment <= 10.0:
            raise ValueError(f"reference_alignment={reference_alignment}: must be in [0, 10]")
        if not 0.0 < reference_lr_scale <= 100.0:
            raise ValueError(f"reference_lr_scale={reference_lr_scale}: must be in (0, 100]")
        self.noise_level_mean = noise_level_mean
        self.reference_alignment, self.reference_lr_scale = reference_alignment, reference_lr_scale
        self.device = device
        self.vae = vae.to(device).eval().requires_grad_(False)
        self.tokenizer, self.text_encoder = build_text_stack()
        self.text_encoder.to(device)
        self.transformer = build_denoiser().to(device)
        self.ema_text = copy.deepcopy(self.text_encoder).requires_grad_(False)
        self.ema_transformer = copy.deepcopy(self.transformer).requires_grad_(False)
        self.reference_encoder = build_reference_encoder().to(device)
        self.ema_reference_encoder = copy.deepcopy(self.reference_encoder).requires_grad_(False)
        self.image_batch, self.clip_batch, self.ema_decay = image_batch, clip_batch, ema_decay
        self.step_kinds = step_kinds
        self.latents_mean, self.latents_std = self.latent_stats()
        self.pool = LatentPool(self) if pool else None

    def modules(self):
        return {"text_encoder": self.text_encoder, "transformer": self.transformer,
                "reference_encoder": self.reference_encoder,
                "ema_text_encoder": self.ema_text, "ema_transformer": self.ema_transformer,
                "ema_reference_encoder": self.ema_reference_encoder}

    def lr_scales(self) -> dict[str, float]:
        return {"reference_encoder": getattr(self, "reference_lr_scale", 1.0)}

    @torch.no_grad()
    def latent_stats(self, batches: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-channel mean and std of the VAE's latents over world images and clips."""
        rng = np.random.default_rng(777)
        zs = []
        for i in range(batches):
            pixels = next(world.batches(rng, 16, video=i % 2 == 1))[1]
            zs.append(self.vae.encode(to_tensor(pixels, self.device)).latent_dist.mode()
                      .transpose(0, 1).flatten(1))
        z = torch.cat(zs, dim=1)
        return z.mean(1), z.std(1)

    @torch.no_grad()
    def encode_pixels(self, pixels: np.ndarray) -> torch.Tensor:
        """uint8 pixels -> normalised latents (B, C, f, h, w), as Wan's pipelines normalise."""
        z = self.vae.encode(to_tensor(pixels, self.device)).latent_dist.mode()
        view = (1, -1, 1, 1, 1)
        return (z - self.latents_mean.view(view)) / self.latents_std.view(view)

    def encode_text(self, captions: list[str], encoder=None) -> torch.Tensor:
        """Text embeddings exactly as WanPipeline computes them (zero after the last token)."""
        from types import SimpleNamespace

        from diffusers import WanPipeline

        host = SimpleNamespace(tokenizer=self.tokenizer,
                               text_encoder=encoder or self.text_encoder)
        return WanPipeline._get_t5_prompt_embeds(host, captions, 1, TEXT_LEN, self.device,
                                                 torch.float32)

    def batch(self, rng):
        if getattr(self, "pool", None) is not None:
            return self.pool.batch(rng)
        kind = rng.choice(list(self.step_kinds), p=list(self.step_kinds.values()))
        video = kind != "image"
        n = self.clip_batch if video else self.image_batch
        specs = [world.sample_scene(rng, video=video) for _ in range(n)]
        captions = [world.caption(s, rng) for s in specs]
        if video:
            pixels = np.stack([world.render_clip(s, CLIP_FRAMES, SIZE, SIZE, rng)
                               for s in specs])
        else:
            pixels = np.stack([world.render_image(s, SIZE, SIZE, rng) for s in specs])
        refs = objects = None
        if kind == "reference":
            refs = np.stack([reference_image(s, rng) for s in specs])
            captions = [anonymise(c) if rng.random() < 0.7 else c for c in captions]
            objects = [(s.objects[0].colour, s.objects[0].shape) for s in specs]
        first_frame = (rng.random(n) < 0.4) if kind == "clip" else np.zeros(n, bool)
        drop = rng.random(n) < 0.1
        captions = ["" if d else c for c, d in zip(captions, drop, strict=True)]
        return DenoiserBatch(captions, pixels, refs, first_frame, objects)

    def loss(self, batch: DenoiserBatch, gen):
        captions, pixels, refs, first_frame, ref_objects = batch
        # pixels (uint8) are encoded here; the latent pool hands latents over directly
        x0 = pixels if torch.is_tensor(pixels) else self.encode_pixels(pixels)  # (B,C,f,h,w)
        b = x0.shape[0]
        s = torch.sigmoid(torch.randn(b, generator=gen) + self.noise_level_mean).to(self.device)
        noise = torch.randn(x0.shape, generator=gen).to(self.device)
        ref = None
        if refs is not None:
            ref = refs if torch.is_tensor(refs) else self.encode_pixels(refs)  # (B,C,1,h,w)
        first = torch.from_numpy(np.asarray(first_frame, dtype=bool)).to(self.device)
        text = self.encode_text(captions)
        if ref is not None:
            from studio.engine.pipelines.wan import reference_tokens

            tokens = reference_tokens(self.reference_encoder, ref)
            keep = (torch.rand(b, generator=gen) >= 0.1).to(tokens).view(b, 1, 1)
            text = torch.cat([text, tokens * keep], dim=1)
        loss = flow_matching_loss(self.transformer, x0, text, noise, s,
                                  first_frame=first, reference=ref)
        metrics = {}
        if ref is not None and getattr(self, "reference_alignment", 0.0) > 0:
            if ref_objects is None:
                raise ValueError("reference_alignment needs the batch's ref_objects")
            target = reference_word_targets(self, ref_objects)
            align = alignment_error(tokens[:, :2], target)
            loss = loss + self.reference_alignment * align
            metrics["ref_align"] = float(align.detach())
        return loss, metrics

    @torch.no_grad()
    def update_ema(self) -> None:
        d = self.ema_decay
        for ema, live in ((self.ema_text, self.text_encoder),
                          (self.ema_transformer, self.transformer),
                          (self.ema_reference_encoder, self.reference_encoder)):
            for pe, pl in zip(ema.parameters(), live.parameters(), strict=True):
                pe.lerp_(pl.detach(), 1 - d)

    def pipeline(self, ema: bool = True):
        """A WanImageToVideoPipeline (TI2V-style) over the current weights."""
        from diffusers import FlowMatchEulerDiscreteScheduler, WanImageToVideoPipeline

        vae = export_vae(self.vae, self.latents_mean, self.latents_std)
        pipe = WanImageToVideoPipeline(
            tokenizer=self.tokenizer, text_encoder=self.ema_text if ema else self.text_encoder,
            vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(shift=SCHEDULER_SHIFT),
            transformer=self.ema_transformer if ema else self.transformer,
            expand_timesteps=True)
        pipe.set_progress_bar_config(disable=True)
        return pipe

    def on_checkpoint(self, out_dir, step):
        from studio.tiny.sampling import adherence_report

        report = adherence_report(self.pipeline(), n=32, steps=20, seed=step)
        line = {"step": step, **report}
        with open(out_dir / "eval_log.jsonl", "a") as fh:
            fh.write(json.dumps(line) + "\n")
        print(f"[dit] step {step}: {line}", file=sys.stderr, flush=True)
        for m in (self.text_encoder, self.transformer, self.reference_encoder):
            m.train()


SCHEDULER_SHIFT = 2.0


class LatentPool:
    """Encoded training samples, reused: the VAE encode costs about a third of a denoiser
    step on the CPU, so each step encodes only a few fresh samples into the pool (growing to
    ``max_images`` / ``max_clips``, then replacing random entries) and draws its batch from
    the pool. Scenes (not captions) are stored; each use draws a fresh caption, reference
    anonymisation, first-frame conditioning and caption dropout, as the pixel path does.
    The batch mix (``DenoiserTask.step_kinds``: by default 45 % images, 37 % clips, 18 %
    reference clips) is the pixel path's.
    """

    def __init__(self, task: DenoiserTask, *, warm_images: int = 1024, warm_clips: int = 256,
                 fresh_images: int = 6, fresh_clips: int = 2, max_images: int = 40_000,
                 max_clips: int = 12_000, seed: int = 4242):
        self.task = task
        self.fresh_images, self.fresh_clips = fresh_images, fresh_clips
        self.max_images, self.max_clips = max_images, max_clips
        self.images: list[tuple] = []  # (spec, latent (C, 1, h, w))
        self.clips: list[tuple] = []  # (spec, latent (C, f, h, w), reference latent (C, 1, h, w))
        rng = np.random.default_rng(seed)
        for _ in range(warm_images // 64):
            self._add_images(rng, 64)
        for _ in range(warm_clips // 16):
            self._add_clips(rng, 16)

    @torch.no_grad()
    def _add_images(self, rng, n: int) -> None:
        specs = [world.sample_scene(rng, video=False) for _ in range(n)]
        pixels = np.stack([world.render_image(s, SIZE, SIZE, rng) for s in specs])
        z = self.task.encode_pixels(pixels)
        self._insert(self.images, self.max_images, rng,
                     [(s, z[i].clone()) for i, s in enumerate(specs)])

    @torch.no_grad()
    def _add_clips(self, rng, n: int) -> None:
        specs = [world.sample_scene(rng, video=True) for _ in range(n)]
        pixels = np.stack([world.render_clip(s, CLIP_FRAMES, SIZE, SIZE, rng) for s in specs])
        refs = np.stack([reference_image(s, rng) for s in specs])
        z, zr = self.task.encode_pixels(pixels), self.task.encode_pixels(refs)
        self._insert(self.clips, self.max_clips, rng,
                     [(s, z[i].clone(), zr[i].clone()) for i, s in enumerate(specs)])

    @staticmethod
    def _insert(items: list, limit: int, rng, new: list) -> None:
        for item in new:
            if len(items) < limit:
                items.append(item)
            else:
                items[int(rng.integers(len(items)))] = item

    def batch(self, rng):
        self._add_images(rng, self.fresh_images)
        self._add_clips(rng, self.fresh_clips)
        kinds = self.task.step_kinds
        kind = rng.choice(list(kinds), p=list(kinds.values()))
        video = kind != "image"
        items = self.clips if video else self.images
        n = self.task.clip_batch if video else self.task.image_batch
        picked = [items[int(i)] for i in rng.integers(len(items), size=n)]
        captions = [world.caption(p[0], rng) for p in picked]
        latents = torch.stack([p[1] for p in picked])
        refs = objects = None
        if kind == "reference":
            refs = torch.stack([p[2] for p in picked])
            captions = [anonymise(c) if rng.random() < 0.7 else c for c in captions]
            objects = [(p[0].objects[0].colour, p[0].objects[0].shape) for p in picked]
        first_frame = (rng.random(n) < 0.4) if kind == "clip" else np.zeros(n, bool)
        drop = rng.random(n) < 0.1
        captions = ["" if d else c for c, d in zip(captions, drop, strict=True)]
        return DenoiserBatch(captions, latents, refs, first_frame, objects)


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


SNAPSHOT_PARTS = (("transformer", "diffusion_pytorch_model.safetensors"),
                  ("text_encoder", "model.safetensors"))
# parts a snapshot or an export may lack (added to a run under way; they then start fresh)
OPTIONAL_SNAPSHOT_PARTS = (("reference_encoder", "model.safetensors"),)
DECODER_KEYS = ("decoder.", "post_quant_conv.")


def snapshot_run(out: Path, committed: Path = Path("training/tiny")) -> dict:
    """Writes the denoiser run's EMA weights (fp16 safetensors, ``ema_transformer`` and
    ``ema_text_encoder``), ``state.json`` and logs from ``out/dit`` into ``committed/dit``,
    and, when ``out/decoder`` has a checkpoint, the decoder's weights (``decoder.*`` and
    ``post_quant_conv.*``, fp16, ``decoder.safetensors``), state and logs into
    ``committed/decoder-w16`` (each file written to a temporary name, then renamed), for
    :func:`restore_run` on the next machine.

    Returns:
        The snapshot's state (``step``, ``elapsed_s``, ``seed``).

    Raises:
        ValueError: ``out/dit`` has no complete checkpoint.
    """
    import os
    import shutil

    from safetensors.torch import load_file, save_file

    ckpt = out / "dit" / "checkpoint"
    if not (ckpt / "state.json").exists() or not all(
            (ckpt / f"ema_{part}.safetensors").exists() for part, _ in SNAPSHOT_PARTS):
        raise ValueError(f"out={str(out)!r}: no complete denoiser checkpoint under {ckpt}")
    dest = committed / "dit" / "checkpoint"
    dest.mkdir(parents=True, exist_ok=True)

    def _replace(tmp: Path, final: Path) -> None:
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, final)

    parts = [part for part, _ in SNAPSHOT_PARTS] + [
        part for part, _ in OPTIONAL_SNAPSHOT_PARTS
        if (ckpt / f"ema_{part}.safetensors").exists()]
    for part in parts:
        weights = {k: v.to(torch.float16).contiguous()
                   for k, v in load_file(str(ckpt / f"ema_{part}.safetensors")).items()}
        tmp = dest / f".ema_{part}.safetensors.tmp"
        save_file(weights, str(tmp))
        _replace(tmp, dest / f"ema_{part}.safetensors")
    copies = [(ckpt / "state.json", dest / "state.json"),
              *((out / "dit" / log, committed / "dit" / log)
                for log in ("train_log.jsonl", "eval_log.jsonl"))]
    decoder = out / "decoder" / "checkpoint"
    if (decoder / "vae.safetensors").exists():  # the decoder export and sampling use
        ddest = committed / "decoder-w16" / "checkpoint"
        ddest.mkdir(parents=True, exist_ok=True)
        weights = {k: v.to(torch.float16).contiguous()
                   for k, v in load_file(str(decoder / "vae.safetensors")).items()
                   if k.startswith(DECODER_KEYS)}
        tmp = ddest / ".decoder.safetensors.tmp"
        save_file(weights, str(tmp))
        _replace(tmp, ddest / "decoder.safetensors")
        copies += [(decoder / "state.json", ddest / "state.json"),
                   *((out / "decoder" / log, committed / "decoder-w16" / log)
                     for log in ("train_log.jsonl", "eval_log.jsonl"))]
    for src, final in copies:
        if src.exists():
            tmp = final.with_name(f".{final.name}.tmp")
            shutil.copyfile(src, tmp)
            _replace(tmp, final)
    return json.loads((ckpt / "state.json").read_text())


def restore_run(out: Path, dest: Path, committed: Path = Path("training/tiny")) -> dict:
    """Rebuilds ``out/{vae,decoder,dit}`` from what the repository holds: the committed VAE
    checkpoint and logs (``committed/vae``), the committed decoder logs and ``state.json``
    (``committed/decoder-w16``), the denoiser's snapshot and logs (``committed/dit``, see
    :func:`snapshot_run`) and an exported model folder ``dest`` (see
    :func:`studio.tiny.sampling.export_pipeline`). The run's decoder is the committed decoder
    snapshot when there is one, else ``dest``'s VAE decoder.

    The denoiser starts from the newer (by training step) of the snapshot's EMA weights and
    the exported (EMA) weights: live and EMA copies alike, cast to fp32; the optimizer state
    is not restored (AdamW restarts its moments). ``elapsed_s`` is the last logged time at or
    before that step in the denoiser's log (0 if none), and a ``restored_from`` line marks the
    restart in that log. Existing checkpoints under ``out`` are kept: restore only fills what
    is missing.

    Returns:
        ``{"vae": ..., "decoder": ..., "dit": ...}``: what each part became ("kept" or
        "restored ...").

    Raises:
        ValueError: ``dest`` is not an exported model folder with a ``training_step``, or
            ``committed/vae`` lacks ``checkpoint/vae.safetensors``.
    """
    import shutil

    from safetensors.torch import load_file, save_file

    meta_path = dest / "studio.json"
    if not meta_path.exists() or not (dest / "transformer").is_dir():
        raise ValueError(f"dest={str(dest)!r}: not an exported model folder (no studio.json "
                         "and transformer/)")
    step = json.loads(meta_path.read_text()).get("training_step")
    if not isinstance(step, int) or step < 0:
        raise ValueError(f"dest={str(dest)!r}: studio.json has no training_step")
    if not (committed / "vae" / "checkpoint" / "vae.safetensors").exists():
        raise ValueError(f"committed={str(committed)!r}: no vae/checkpoint/vae.safetensors")
    done: dict[str, str] = {}

    def _copy_logs(src: Path, dst: Path) -> None:
        dst.mkdir(parents=True, exist_ok=True)
        for log in ("train_log.jsonl", "eval_log.jsonl"):
            if (src / log).exists() and not (dst / log).exists():
                shutil.copy2(src / log, dst / log)

    vae_dir = out / "vae"  # the VAE as trained jointly: its encoder defines the latent space
    if (vae_dir / "checkpoint" / "vae.safetensors").exists():
        done["vae"] = "kept"
    else:
        _copy_logs(committed / "vae", vae_dir)
        shutil.copytree(committed / "vae" / "checkpoint", vae_dir / "checkpoint",
                        dirs_exist_ok=True)
        done["vae"] = f"restored from {committed / 'vae'}"
    dec = out / "decoder"  # the decoder export and sampling use: the shipped VAE's
    if (dec / "checkpoint" / "vae.safetensors").exists():
        done["decoder"] = "kept"
    else:
        _copy_logs(committed / "decoder-w16", dec)
        snapshot = committed / "decoder-w16" / "checkpoint" / "decoder.safetensors"
        source = snapshot if snapshot.exists() else \
            dest / "vae" / "diffusion_pytorch_model.safetensors"
        encoder = load_file(str(vae_dir / "checkpoint" / "vae.safetensors"))
        merged = {k: v.contiguous() for k, v in encoder.items() if not k.startswith(DECODER_KEYS)}
        merged.update({k: v.float().contiguous() for k, v in load_file(str(source)).items()
                       if k.startswith(DECODER_KEYS)})
        (dec / "checkpoint").mkdir(parents=True, exist_ok=True)
        save_file(merged, str(dec / "checkpoint" / "vae.safetensors"))
        state = committed / "decoder-w16" / "checkpoint" / "state.json"
        (dec / "checkpoint").joinpath("state.json").write_text(
            state.read_text() if state.exists() else json.dumps({"step": 0, "elapsed_s": 0.0,
                                                                 "seed": 0}))
        done["decoder"] = f"restored from {source.parent if source == snapshot else dest / 'vae'}"
    dit = out / "dit"  # the denoiser and text encoder: live = EMA
    if (dit / "checkpoint" / "state.json").exists():
        done["dit"] = "kept"
        return done
    snap = committed / "dit" / "checkpoint"
    every = SNAPSHOT_PARTS + OPTIONAL_SNAPSHOT_PARTS
    sources = {part: dest / part / file for part, file in every}
    origin = str(dest)
    if (snap / "state.json").exists() and all(
            (snap / f"ema_{part}.safetensors").exists() for part, _ in SNAPSHOT_PARTS):
        snap_step = json.loads((snap / "state.json").read_text()).get("step")
        if isinstance(snap_step, int) and snap_step > step:
            step, origin = snap_step, str(snap)
            sources = {part: snap / f"ema_{part}.safetensors" for part, _ in every}
    optional = {part for part, _ in OPTIONAL_SNAPSHOT_PARTS}
    sources = {part: src for part, src in sources.items()
               if part not in optional or src.exists()}  # absent: the task starts it fresh
    _copy_logs(committed / "dit", dit)
    elapsed = 0.0
    log = dit / "train_log.jsonl"
    if log.exists():
        for line in log.read_text().splitlines():
            row = json.loads(line)
            if row.get("step", step + 1) <= step and "elapsed_s" in row:
                elapsed = max(elapsed, float(row["elapsed_s"]))
    (dit / "checkpoint").mkdir(parents=True, exist_ok=True)
    for part, source in sources.items():
        weights = {k: v.float().contiguous() for k, v in load_file(str(source)).items()}
        save_file(weights, str(dit / "checkpoint" / f"{part}.safetensors"))
        save_file(weights, str(dit / "checkpoint" / f"ema_{part}.safetensors"))
    (dit / "checkpoint" / "state.json").write_text(
        json.dumps({"step": step, "elapsed_s": elapsed, "seed": 0}, indent=1))
    with open(log, "a") as fh:  # marks where the restored run picks up
        fh.write(json.dumps({"step": step, "elapsed_s": elapsed, "restored_from": origin})
                 + "\n")
    done["dit"] = f"restored from {origin} at step {step}"
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studio.tiny.train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stage", choices=["vae", "decoder", "dit", "align-reference",
                                          "export", "snapshot",
                                                  "restore"])
    parser.add_argument("--out", default="runs/tiny", help="run folder (checkpoints, logs)")
    parser.add_argument("--minutes", type=float, default=None, help="stop after this sitting")
    parser.add_argument("--steps", type=int, default=None, help="stop at this total step")
    parser.add_argument("--total-steps", type=int, default=None, help="schedule length")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=None,
                        help="peak learning rate (default per stage: vae 1e-3, decoder 3e-4, "
                             "dit 6e-4)")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    parser.add_argument("--checkpoint-every", type=float, default=300.0, help="seconds")
    parser.add_argument("--dest", default="assets/models/tiny-wan", help="export folder")
    parser.add_argument("--decoder-base-dim", type=int, default=None,
                        help="decoder: train a decoder this wide from scratch (default: keep "
                             "the VAE's width and start from its decoder)")
    parser.add_argument("--decoder-dir", default="decoder",
                        help="decoder: the run sub-folder to train in (export and sampling "
                             "use <out>/decoder; train a candidate elsewhere, then rename it)")
    parser.add_argument("--motion-weight", type=float, default=0.0,
                        help="decoder: extra loss weight on pixels that change between clip "
                             "frames (default 0)")
    parser.add_argument("--adversarial-weight", type=float, default=0.0,
                        help="decoder: add a patch discriminator, its term scaled by this "
                             "times VQGAN's adaptive weight (default 0: pixel losses only)")
    parser.add_argument("--init-decoder", action="store_true",
                        help="decoder: start from <out>/decoder's trained decoder rather than "
                             "the jointly trained VAE's (to train a candidate in "
                             "--decoder-dir)")
    parser.add_argument("--reference-share", type=float, default=0.18,
                        help="dit: share of steps on reference-to-video clips (default 0.18; "
                             "images and clips share the rest 45 : 37)")
    parser.add_argument("--noise-level-mean", type=float, default=0.0,
                        help="dit: location of the logit-normal noise-level draw (0: s "
                             "centred on 0.5; 1: more high-noise steps)")
    parser.add_argument("--gradient-tilt", type=float, default=None,
                        help="dit: train on a world whose sky gradients put this share of "
                             "their change down the height (world.GRADIENT_TILT, 0.6; lower "
                             "gives columns the stronger cue)")
    parser.add_argument("--reference-alignment", type=float, default=0.0,
                        help="dit: weight of the loss pulling the first two reference tokens "
                             "onto the text embeddings of the object's colour and shape words "
                             "(0: off)")
    parser.add_argument("--reference-lr-scale", type=float, default=1.0,
                        help="dit: learning-rate multiplier of the reference encoder")
    parser.add_argument("--no-pool", action="store_true",
                        help="dit: encode every batch afresh instead of the latent pool")
    args = parser.parse_args(argv)
    if not args.decoder_dir or "/" in args.decoder_dir or "\\" in args.decoder_dir or \
            args.decoder_dir in (".", ".."):
        parser.error(f"--decoder-dir must be a plain folder name, got {args.decoder_dir!r}")
    if args.motion_weight < 0:
        parser.error(f"--motion-weight must be at least 0, got {args.motion_weight}")
    if not 0 <= args.reference_share < 1:
        parser.error(f"--reference-share must be in [0, 1), got {args.reference_share}")
    if not 0 <= args.reference_alignment <= 10:
        parser.error(f"--reference-alignment must be in [0, 10], got {args.reference_alignment}")
    if not 0 < args.reference_lr_scale <= 100:
        parser.error(f"--reference-lr-scale must be in (0, 100], got {args.reference_lr_scale}")
    if args.gradient_tilt is not None and not 0 <= args.gradient_tilt <= 1:
        parser.error(f"--gradient-tilt must be in [0, 1], got {args.gradient_tilt}")
    if args.lr is not None and not 0 < args.lr <= 0.1:
        parser.error(f"--lr must be in (0, 0.1], got {args.lr}")
    if not 0 <= args.adversarial_weight <= 10:
        parser.error(f"--adversarial-weight must be in [0, 10], got {args.adversarial_weight}")
    if args.init_decoder and args.decoder_dir == "decoder":
        parser.error("--init-decoder needs --decoder-dir other than 'decoder' (the trained "
                     "decoder it starts from)")
    if args.decoder_base_dim is not None and args.decoder_base_dim < 8:
        parser.error(f"--decoder-base-dim must be at least 8, got {args.decoder_base_dim}")
    out = Path(args.out)
    if args.stage in ("restore", "snapshot"):
        try:
            print(json.dumps(restore_run(out, Path(args.dest)) if args.stage == "restore"
                             else snapshot_run(out)))
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return 0
    needs_vae = args.stage in ("decoder", "dit", "align-reference", "export")
    if needs_vae and not (out / "vae" / "checkpoint" / "vae.safetensors").exists():
        parser.error(f"no trained VAE under {out / 'vae'}: run the vae stage first "
                     f"(python -m studio.tiny.train vae --out {args.out})")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    # SIGTERM (a session ending, `kill`): finish the step, save a checkpoint, exit
    import signal

    stop = {"asked": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__("asked", True))
    device = device_default()
    if args.stage == "vae":
        task = VaeTask(device)
        config = TrainConfig(lr=args.lr or 1e-3, warmup_steps=100, total_steps=args.total_steps or 8000,
                             seed=args.seed, checkpoint_every_s=args.checkpoint_every,
                             log_every=10)
        state = train(task, out / "vae", config, max_steps=args.steps,
                      max_minutes=args.minutes, should_stop=lambda: stop["asked"],
                      on_log=lambda line: print(f"[vae] {line}", file=sys.stderr, flush=True))
        print(json.dumps({"step": state["step"], **task.evaluate()}))
        return 0
    if args.stage == "decoder":
        task = VaeDecoderTask(device, load_trained_vae(out, device,
                                                       decoder=args.init_decoder),
                              decoder_base_dim=args.decoder_base_dim,
                              motion_weight=args.motion_weight,
                              adversarial_weight=args.adversarial_weight)
        config = TrainConfig(lr=args.lr or 3e-4, warmup_steps=50, total_steps=args.total_steps or 3000,
                             seed=args.seed, checkpoint_every_s=args.checkpoint_every,
                             log_every=10, weight_decay=0.0)
        state = train(task, out / args.decoder_dir, config, max_steps=args.steps,
                      max_minutes=args.minutes, should_stop=lambda: stop["asked"],
                      on_log=lambda line: print(f"[decoder] {line}", file=sys.stderr,
                                                flush=True))
        print(json.dumps({"step": state["step"], **task.evaluate()}))
        return 0
    vae = load_trained_vae(out, device)
    if args.stage == "align-reference":
        return _align_reference_stage(args, out, device, vae, stop)
    tilt = args.gradient_tilt if args.stage == "dit" else None
    with world.gradient_tilt(world.GRADIENT_TILT if tilt is None else tilt):
        if tilt is not None:
            print(f"[dit] world.GRADIENT_TILT = {tilt}", file=sys.stderr, flush=True)
        return _denoiser_stage(args, out, device, vae, stop)


def _align_reference_stage(args, out: Path, device, vae, stop) -> int:
    """Stage ``align-reference`` (:mod:`studio.tiny.align`): the reference encoder of the
    denoiser checkpoint trained alone toward the object's word embeddings, then written back
    into that checkpoint when this sitting finished the schedule."""
    from studio.tiny.align import ReferenceAlignTask, write_into_denoiser_checkpoint

    task = DenoiserTask(device, vae)
    if load_checkpoint(out / "dit", task) is None:
        print(f"error: no denoiser checkpoint under {out / 'dit'}", file=sys.stderr)
        return 2
    align = ReferenceAlignTask(task)
    run = out / "reference-align"
    before = (json.loads((run / "checkpoint" / "state.json").read_text())["step"]
              if (run / "checkpoint" / "state.json").exists() else 0)
    config = TrainConfig(lr=args.lr or 2e-3, warmup_steps=50,
                         total_steps=args.total_steps or 1500, seed=args.seed,
                         checkpoint_every_s=args.checkpoint_every, log_every=50,
                         weight_decay=0.0)
    state = train(align, run, config, max_steps=args.steps, max_minutes=args.minutes,
                  should_stop=lambda: stop["asked"],
                  on_log=lambda line: print(f"[align] {line}", file=sys.stderr, flush=True))
    metrics = {"step": state["step"], **align.evaluate()}
    with open(run / "eval_log.jsonl", "a") as fh:
        fh.write(json.dumps(metrics) + "\n")
    done = state["step"] >= config.total_steps and state["step"] > before
    if done:  # only a schedule finished now replaces the denoiser run's reference encoder
        write_into_denoiser_checkpoint(task.reference_encoder, out / "dit")
    print(json.dumps({**metrics, "written_into": str(out / "dit") if done else None}))
    return 0


def _denoiser_stage(args, out: Path, device, vae, stop) -> int:
    task = DenoiserTask(device, vae, pool=args.stage == "dit" and not args.no_pool,
                        reference_share=args.reference_share,
                        noise_level_mean=args.noise_level_mean,
                        reference_alignment=args.reference_alignment,
                        reference_lr_scale=args.reference_lr_scale)
    if args.stage == "dit":
        config = TrainConfig(lr=args.lr or 6e-4, warmup_steps=300, total_steps=args.total_steps or 30000,
                             seed=args.seed, checkpoint_every_s=args.checkpoint_every,
                             log_every=20, weight_decay=0.0)
        state = train(task, out / "dit", config, max_steps=args.steps, max_minutes=args.minutes,
                      after_step=task.update_ema, should_stop=lambda: stop["asked"],
                      on_log=lambda line: print(f"[dit] {line}", file=sys.stderr, flush=True))
        print(json.dumps({"step": state["step"]}))
        return 0
    state = load_checkpoint(out / "dit", task)
    if state is None:
        print(f"error: no denoiser checkpoint under {out / 'dit'}", file=sys.stderr)
        return 2
    from studio.tiny.sampling import export_pipeline

    print(export_pipeline(task, Path(args.dest), step=state["step"],
                          total_steps=args.total_steps or 30000))
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["build_vae", "VaeTask", "VaeDecoderTask", "flow_matching_loss", "load_checkpoint",
           "restore_run", "snapshot_run"]
