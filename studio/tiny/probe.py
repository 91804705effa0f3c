"""Which conditioning does the embedded denoiser use? A one-minute probe.

The adherence benchmark (``python -m bench model``) says *whether* generated samples follow
their prompts; this probe says *why not*, directly on the denoiser, in about a minute. For
each conditioning signal it corrupts that signal alone and measures how much the denoiser's
flow-matching loss on world renders rises:

==============  ================================================================================
signal          the corruption (everything else unchanged)
==============  ================================================================================
caption         the caption dropped (empty prompt): the whole text pathway
colour          the object's colour word replaced by another colour's
shape           the shape word replaced by another shape's
row             top <-> bottom (left, centre, right positions keep their row)
column          left <-> right (the same for the column)
motion          left <-> right, up <-> down motion words (clips of moving objects)
first_frame     image-to-video: the clean first latent frame taken from another clip
reference       reference-to-video: the appended reference frame taken from another clip
==============  ================================================================================

The figure per signal is the *relative loss increase* ``(L_corrupted - L) / L`` on the same
latents, noise and noise levels: 0 means the denoiser ignores the signal (the prediction does
not change when the signal lies), tens of percent means it relies on it. On the shipped
weights of step 14672 (48 scenes per signal, seed 0; ``bench/results/2026-12-01-probe.json``):
caption +1.11, colour +0.57, shape +0.14, row +0.69, column +0.004, motion -0.001,
first_frame +2.84, reference -0.0001: the denoiser follows colour, shape and rows and copies
the first frame, and ignores columns, motion words and the reference frame.

    python -m studio.tiny.probe [--model assets/models/tiny-wan] [--scenes 48]

The loss is the trainer's (:func:`studio.tiny.denoiser.flow_matching_loss`), here at fixed noise
levels ``s`` in {0.3, 0.6, 0.9} with a fixed noise draw.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import torch

from studio.tiny import world

SIGNALS = ("caption", "colour", "shape", "row", "column", "motion", "first_frame", "reference")
NOISE_LEVELS = (0.3, 0.6, 0.9)
_ROW_SWAP = {"top": "bottom", "bottom": "top"}
_COLUMN_SWAP = {"left": "right", "right": "left"}
_MOTION_SWAP = {"left": "right", "right": "left", "up": "down", "down": "up"}


def _swap_position(position: str, table: dict[str, str]) -> str:
    return " ".join(table.get(word, word) for word in position.split())


class DenoiserProbe:
    """The exported model's text encoder, VAE and denoiser, with the trainer's loss.

    Args:
        model: an exported model folder (``studio.tiny.train export``: diffusers layout with
            ``transformer``, ``text_encoder``, ``tokenizer``, ``vae``).
        text_len: tokens per caption (the model's ``max_sequence_length``).

    Raises:
        ValueError: ``model`` is not such a folder.
    """

    def __init__(self, model: str | Path, text_len: int = 32):
        from diffusers import DiffusionPipeline

        model = Path(model)
        if not (model / "transformer").is_dir() or not (model / "vae").is_dir():
            raise ValueError(f"model={str(model)!r}: not an exported model folder")
        self.pipe = DiffusionPipeline.from_pretrained(model, local_files_only=True,
                                                      torch_dtype=torch.float32)
        self.text_len = text_len
        vae = self.pipe.vae
        self.mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
        self.std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
        self.reference_encoder = None  # reference-to-video's tokens, when the model has them
        meta = model / "studio.json"
        sub = json.loads(meta.read_text()).get("reference_tokens") if meta.exists() else None
        if sub:
            from studio.engine.pipelines.wan import load_reference_encoder

            self.reference_encoder = load_reference_encoder(model / sub, torch.float32,
                                                            str(model))

    @torch.no_grad()
    def encode_pixels(self, pixels: np.ndarray) -> torch.Tensor:
        """uint8 (B, H, W, 3) or (B, F, H, W, 3) -> normalised latents (B, C, f, h, w)."""
        x = torch.from_numpy(np.ascontiguousarray(pixels)).float() / 127.5 - 1.0
        x = x[:, None] if x.ndim == 4 else x  # images are one-frame videos
        z = self.pipe.vae.encode(x.permute(0, 4, 1, 2, 3)).latent_dist.mode()
        return (z - self.mean) / self.std

    @torch.no_grad()
    def encode_text(self, captions: list[str]) -> torch.Tensor:
        """(B, text_len, dim) text embeddings as the Wan pipelines compute them."""
        embeds, _ = self.pipe.encode_prompt(captions, do_classifier_free_guidance=False,
                                            max_sequence_length=self.text_len,
                                            device=torch.device("cpu"))
        return embeds

    @torch.no_grad()
    def loss(self, captions: list[str], x0: torch.Tensor, *, first_frame: bool = False,
             reference: torch.Tensor | None = None, seed: int = 0) -> float:
        """Mean flow-matching loss over :data:`NOISE_LEVELS` (a fixed noise draw per seed).

        Args:
            captions: one per item.
            x0: clean normalised latents (B, C, f, h, w).
            first_frame: latent frame 0 given clean at timestep 0 (image-to-video) and left
                out of the loss.
            reference: clean latents (B, C, 1, h, w) appended as a last frame at timestep 0
                (reference-to-video), left out of the loss; and, when the model has a
                reference encoder, its tokens appended to the text embeddings.
        """
        from studio.tiny.denoiser import flow_matching_loss

        b = x0.shape[0]
        text = self.encode_text(captions)
        if reference is not None and self.reference_encoder is not None:
            from studio.engine.pipelines.wan import reference_tokens

            text = torch.cat([text, reference_tokens(self.reference_encoder, reference)], 1)
        noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(seed))
        first = torch.full((b,), first_frame)
        total = 0.0
        for s in NOISE_LEVELS:
            total += float(flow_matching_loss(self.pipe.transformer, x0, text, noise,
                                              torch.full((b,), s), first_frame=first,
                                              reference=reference))
        return total / len(NOISE_LEVELS)


def _scenes(rng: np.random.Generator, n: int, *, video: bool, keep) -> list[world.SceneSpec]:
    out = []
    while len(out) < n:
        spec = world.sample_scene(rng, video=video, two_object_prob=0.0)
        if keep(spec.objects[0]):
            out.append(spec)
    return out


def _edit(spec: world.SceneSpec, **changes) -> world.SceneSpec:
    return dataclasses.replace(spec, objects=(dataclasses.replace(spec.objects[0], **changes),
                                              *spec.objects[1:]))


def conditioning_sensitivity(probe: DenoiserProbe, *, scenes: int = 48, seed: int = 0,
                             signals: tuple[str, ...] = SIGNALS) -> dict[str, dict]:
    """Relative loss increase per corrupted signal (see the module docstring).

    Args:
        probe: the model.
        scenes: single-object world scenes per signal (images for caption, colour, shape,
            row and column; clips for motion, first_frame and reference), >= 2.
        seed: scenes, captions and noise.
        signals: a subset of :data:`SIGNALS`.

    Returns:
        ``{signal: {"loss": L, "corrupted": L_c, "relative_increase": (L_c - L) / L}}``.

    Raises:
        ValueError: ``scenes`` below 2 or an unknown signal.
    """
    from studio.tiny.autoencoder import CLIP_FRAMES, SIZE
    from studio.tiny.denoiser import anonymise, reference_image

    if scenes < 2:
        raise ValueError(f"scenes: {scenes} is below 2")
    unknown = [s for s in signals if s not in SIGNALS]
    if unknown:
        raise ValueError(f"signals: {unknown} not in {SIGNALS}")
    rng = np.random.default_rng(seed)
    result: dict[str, dict] = {}

    def caption_pair(specs, edited):  # the same wording for both: one rng seed per item
        return ([world.caption(s, np.random.default_rng([seed, i])) for i, s in enumerate(specs)],
                [world.caption(s, np.random.default_rng([seed, i])) for i, s in enumerate(edited)])

    def record(name, clean, corrupted):
        result[name] = {"loss": clean, "corrupted": corrupted,
                        "relative_increase": (corrupted - clean) / clean}

    image_edits = {
        "colour": (lambda o: True, lambda s, r: _edit(s, colour=str(r.choice(
            [c for c in world.COLOURS if c != s.objects[0].colour
             and world.is_allowed(c, s.background)])))),
        "shape": (lambda o: True, lambda s, r: _edit(s, shape=str(r.choice(
            [x for x in world.SHAPES if x != s.objects[0].shape])))),
        "row": (lambda o: o.position.split()[0] in _ROW_SWAP,
                lambda s, r: _edit(s, position=_swap_position(s.objects[0].position,
                                                              _ROW_SWAP))),
        "column": (lambda o: o.position.split()[-1] in _COLUMN_SWAP,
                   lambda s, r: _edit(s, position=_swap_position(s.objects[0].position,
                                                                 _COLUMN_SWAP))),
    }
    for name in ("caption", *image_edits):
        if name not in signals:
            continue
        keep, edit = image_edits.get(name, (lambda o: True, None))
        specs = _scenes(rng, scenes, video=False, keep=keep)
        x0 = probe.encode_pixels(np.stack([world.render_image(s, SIZE, SIZE, rng)
                                           for s in specs]))
        if name == "caption":
            captions, _ = caption_pair(specs, specs)
            corrupted = [""] * len(specs)
        else:
            captions, corrupted = caption_pair(specs, [edit(s, rng) for s in specs])
        record(name, probe.loss(captions, x0, seed=seed), probe.loss(corrupted, x0, seed=seed))
    if not {"motion", "first_frame", "reference"} & set(signals):
        return result
    clips = _scenes(rng, scenes, video=True, keep=lambda o: o.motion in _MOTION_SWAP)
    x0 = probe.encode_pixels(np.stack([world.render_clip(s, CLIP_FRAMES, SIZE, SIZE, rng)
                                       for s in clips]))
    other = np.roll(np.arange(len(clips)), 1)  # each clip gets its neighbour's frame
    captions, swapped = caption_pair(
        clips, [_edit(s, motion=_MOTION_SWAP[s.objects[0].motion]) for s in clips])
    if "motion" in signals:
        record("motion", probe.loss(captions, x0, seed=seed), probe.loss(swapped, x0, seed=seed))
    if "first_frame" in signals:
        mixed = x0.clone()
        mixed[:, :, 0] = x0[other][:, :, 0]
        record("first_frame", probe.loss(captions, x0, first_frame=True, seed=seed),
               probe.loss(captions, mixed, first_frame=True, seed=seed))
    if "reference" in signals:
        refs = probe.encode_pixels(np.stack([reference_image(s, rng) for s in clips]))
        anonymous = [anonymise(c) for c in captions]
        record("reference", probe.loss(anonymous, x0, reference=refs, seed=seed),
               probe.loss(anonymous, x0, reference=refs[other], seed=seed))
    return result


#: (colour, shape, background) of the placement probe's prompts: solid backgrounds, where
#: only the caption (not a texture) can say where the object goes
PLACEMENT_OBJECTS = (("red", "circle", "white"), ("blue", "square", "beige"),
                     ("black", "star", "white"), ("yellow", "triangle", "teal"))
PLACEMENT_WORDS = {"left": "on the left", "right": "on the right", "top": "at the top",
                   "bottom": "at the bottom"}


def latent_grid(pipe) -> tuple[int, int]:
    """(latent channels, latent side) of a 64x64 frame for ``pipe``'s VAE and denoiser."""
    from studio.tiny.autoencoder import SIZE

    return (int(pipe.transformer.config.in_channels),
            SIZE // int(pipe.vae.config.scale_factor_spatial))


@torch.no_grad()
def placement_shift(probe: DenoiserProbe, *, noise_level: float = 0.9, samples: int = 8,
                    seed: int = 0) -> dict[str, float]:
    """How far the position words move the object in the denoiser's first guess of the
    image, where sampling decides the composition.

    For each of :data:`PLACEMENT_OBJECTS` and each word of :data:`PLACEMENT_WORDS` ("a large
    red circle on the left on a white background"), the denoiser predicts the clean latents
    from ``samples`` pure-noise draws at ``noise_level`` (x̂0 = x_t - s·v, the same draws for
    every word), the VAE decodes them, and the object's centroid is taken over the pixels
    nearer the object's colour than the background's. The world puts the object's centre at
    0.25 or 0.75 of the side, so a denoiser that follows the words fully moves the centroid
    by up to 0.5 there; one that ignores them, by 0.

    Returns:
        ``{"column": cx(right) - cx(left), "row": cy(bottom) - cy(top)}``, mean over the
        objects, in fractions of the width / height.
    Raises:
        ValueError: ``noise_level`` outside (0, 1] or ``samples`` below 1.
    """
    from studio.tiny.autoencoder import SIZE

    if not 0.0 < noise_level <= 1.0:
        raise ValueError(f"noise_level: {noise_level} is outside (0, 1]")
    if samples < 1:
        raise ValueError(f"samples: {samples} is below 1")
    channels, side = latent_grid(probe.pipe)
    noise = torch.randn(samples, channels, 1, side, side,
                        generator=torch.Generator().manual_seed(seed))
    ys, xs = torch.meshgrid(torch.linspace(0, 1, SIZE), torch.linspace(0, 1, SIZE),
                            indexing="ij")
    shifts = {"column": [], "row": []}
    transformer = probe.pipe.transformer
    for colour, shape, background in PLACEMENT_OBJECTS:
        obj = torch.tensor(world.COLOURS[colour], dtype=torch.float32).view(1, 3, 1, 1)
        bg = torch.tensor(world.SOLID_BACKGROUNDS[background],
                          dtype=torch.float32).view(1, 3, 1, 1)
        centre = {}
        for word, phrase in PLACEMENT_WORDS.items():
            text = probe.encode_text([f"a large {colour} {shape} {phrase} on a {background} "
                                      f"background"]).expand(samples, -1, -1)
            v = transformer(hidden_states=noise, encoder_hidden_states=text,
                            timestep=torch.full((samples,), noise_level * 1000.0),
                            return_dict=False)[0]
            x0 = (noise - noise_level * v) * probe.std + probe.mean
            rgb = (probe.pipe.vae.decode(x0).sample[:, :, 0].clamp(-1, 1) + 1) * 127.5
            weight = ((rgb - bg).norm(dim=1) > (rgb - obj).norm(dim=1)).float()
            mass = weight.sum((1, 2)).clamp(min=1.0)
            centre[word] = (float(((weight * xs).sum((1, 2)) / mass).mean()),
                            float(((weight * ys).sum((1, 2)) / mass).mean()))
        shifts["column"].append(centre["right"][0] - centre["left"][0])
        shifts["row"].append(centre["bottom"][1] - centre["top"][1])
    return {k: float(np.mean(v)) for k, v in shifts.items()}


@torch.no_grad()
def position_awareness(probe: DenoiserProbe, *, noise_level: float = 0.95, samples: int = 96,
                       seed: int = 0) -> dict[str, dict[str, float]]:
    """How well each layer of the denoiser knows its tokens' absolute row and column, from
    pure noise, where nothing in the input says where a token is.

    Wan's denoiser has no absolute position embedding: 3D RoPE (Su et al., "RoFormer", 2021)
    gives attention only relative offsets, and a pure-noise input is the same at every
    position in distribution. A token can tell where it is only from the frame's edges (the
    offsets that exist around it), and it has to know that before a word such as "left" can
    move the object there. For each hook point (the patch embedding, then each block's
    output) a linear probe (least squares on one-hot targets, ridge 1e-3) is fitted on the
    tokens of the first half of the noise draws to predict each token's row index and
    column index, and scored on the second half. Chance is 1 / tokens per side (1/8 at
    64 x 64); the patch embedding reads at chance by construction, which shows the probe
    cannot find a position that is not there.

    Args:
        probe: the model.
        noise_level: s of the pure-noise input (timestep ``1000 s``), in (0, 1].
        samples: noise draws (an image each), >= 4 and even.
        seed: the noise draws.

    Returns:
        ``{hook: {"row": accuracy, "column": accuracy}}``, hooks ``"embed"``, ``"block0"``,
        ... in order, accuracies in [0, 1] on held-out draws.

    Raises:
        ValueError: ``noise_level`` outside (0, 1], or ``samples`` below 4 or odd.
    """
    if not 0.0 < noise_level <= 1.0:
        raise ValueError(f"noise_level: {noise_level} is outside (0, 1]")
    if samples < 4 or samples % 2:
        raise ValueError(f"samples: {samples} must be even and at least 4")
    transformer = probe.pipe.transformer
    _, ph, pw = transformer.config.patch_size
    channels, side = latent_grid(probe.pipe)
    rows_n, cols_n = side // ph, side // pw
    noise = torch.randn(samples, channels, 1, side, side,
                        generator=torch.Generator().manual_seed(seed))
    text = probe.encode_text(["a large red circle on a white background"]).expand(samples, -1, -1)
    features: dict[str, torch.Tensor] = {}

    def keep(name):
        def hook(module, inputs, output):
            out = output[0] if isinstance(output, tuple) else output
            features[name] = out.flatten(2).transpose(1, 2) if out.ndim == 5 else out
        return hook

    handles = [transformer.patch_embedding.register_forward_hook(keep("embed"))]
    handles += [block.register_forward_hook(keep(f"block{k}"))
                for k, block in enumerate(transformer.blocks)]
    try:
        transformer(hidden_states=noise, encoder_hidden_states=text,
                    timestep=torch.full((samples,), noise_level * 1000.0), return_dict=False)
    finally:
        for handle in handles:
            handle.remove()
    # tokens are (frame, row, column) in row-major order
    row = torch.arange(rows_n).repeat_interleave(cols_n).repeat(samples)
    column = torch.arange(cols_n).repeat(rows_n).repeat(samples)
    half = samples // 2 * rows_n * cols_n
    result = {}
    for name, feats in features.items():
        x = feats.reshape(-1, feats.shape[-1]).double()
        x = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], 1)
        gram = x[:half].T @ x[:half] + 1e-3 * torch.eye(x.shape[1], dtype=x.dtype)
        scores = {}
        for axis, label, classes in (("row", row, rows_n), ("column", column, cols_n)):
            target = torch.nn.functional.one_hot(label, classes).double()
            weights = torch.linalg.solve(gram, x[:half].T @ target[:half])
            scores[axis] = float(((x[half:] @ weights).argmax(1) == label[half:]).double().mean())
        result[name] = scores
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studio.tiny.probe", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="assets/models/tiny-wan")
    parser.add_argument("--scenes", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        probe = DenoiserProbe(args.model)
        report = conditioning_sensitivity(probe, scenes=args.scenes, seed=args.seed)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for name, row in report.items():
        print(f"{name:12s} relative loss increase {row['relative_increase']:+.4f}  "
              f"({row['loss']:.5f} -> {row['corrupted']:.5f})")
    placement = placement_shift(probe, seed=args.seed)
    print(f"placement    the position words move the object's first guess by "
          f"{placement['column']:+.3f} of the width (left -> right) and "
          f"{placement['row']:+.3f} of the height (top -> bottom); following them fully: "
          f"up to +0.5")
    awareness = position_awareness(probe, seed=args.seed)
    print("awareness    each layer's linear read of its tokens' row / column from pure noise "
          "(chance 0.125): " + ", ".join(f"{k} {v['row']:.2f}/{v['column']:.2f}"
                                         for k, v in awareness.items()))
    print(json.dumps({**{k: round(v["relative_increase"], 5) for k, v in report.items()},
                      "placement": {k: round(v, 4) for k, v in placement.items()},
                      "awareness": {k: {a: round(x, 3) for a, x in v.items()}
                                    for k, v in awareness.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["DenoiserProbe", "SIGNALS", "conditioning_sensitivity", "placement_shift",
           "position_awareness"]
