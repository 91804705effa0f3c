"""The embedded model's reference word map: reference tokens -> pseudo-words for the prompt.

Reference-to-video on the embedded model gives the reference's object three ways in: its
clean latents as an extra frame, its tokens in cross-attention, and (this module) two
pseudo-words in the prompt itself, read by the text encoder in the sentence
(:class:`studio.engine.pipelines.wan.ReferenceWords`). The pseudo-words are what a linear map
makes of the first two reference tokens, which the reference encoder was trained to land on
the text encoder's embeddings of "<colour> <shape>" (``--reference-alignment``). The map is
fitted here in closed form (ridge regression) toward the text encoder's *input* word
embeddings of the object's colour and shape words, on reference images of training scenes,
as ELITE (Wei et al., ICCV 2023) maps image features into the word-embedding space. No
training step of the denoiser is involved: the fit runs on an exported model folder, through
the engine's own loading code, in a few seconds.

Command: ``python -m studio.tiny.train reference-words --dest assets/models/tiny-wan``
(``export`` runs it too).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from studio.core.media import fit_image
from studio.tiny import world

#: The word the pseudo-words replace in a reference-to-video prompt: what
#: :func:`studio.tiny.denoiser.anonymise` writes in place of "<colour> <shape>".
PLACEHOLDER = "object"
#: Where the map is stored in a model folder.
MAP_FILE = "reference_encoder/word_map.safetensors"
WORDS = 2  # colour, shape


@torch.no_grad()
def reference_features(runner, pixels: list[np.ndarray]) -> torch.Tensor:
    """The first :data:`WORDS` reference tokens of each image, flattened: float32
    (N, WORDS * D_token), as :class:`~studio.engine.pipelines.wan.WanRunner` computes them for
    a reference-to-video job (the image fitted to the encoder's side, VAE-encoded,
    normalised)."""
    from studio.engine.pipelines.wan import reference_tokens

    encoder = runner.reference_encoder
    side = encoder.config.image_size * int(runner.base.vae.config.get("scale_factor_spatial", 8))
    rows = []
    for px in pixels:
        latents = runner.encode_image(fit_image(px, side, side), cache=False)
        rows.append(reference_tokens(encoder, latents)[0, :WORDS].reshape(-1).float())
    return torch.stack(rows)


def word_rows(runner, words: list[str]) -> torch.Tensor:
    """The text encoder's input embeddings of single-token ``words``: float32 (N, D_word).

    Raises:
        ValueError: a word is not one token of the model's tokenizer.
    """
    pipe = runner.base
    ids = []
    for word in words:
        tok = pipe.tokenizer(word, add_special_tokens=False).input_ids
        if len(tok) != 1:
            raise ValueError(f"word {word!r}: {len(tok)} tokens, expected 1")
        ids.append(tok[0])
    table = pipe.text_encoder.get_input_embeddings().weight.detach().float().cpu()
    return table[torch.tensor(ids)]


def _scenes(n: int, seed: int, split: str) -> tuple[list[np.ndarray], list[tuple[str, str]]]:
    from studio.tiny.denoiser import reference_image

    rng = np.random.default_rng([seed, 9173])
    pixels, objects = [], []
    for _ in range(n):
        spec = world.sample_scene(rng, video=True, split=split)
        pixels.append(reference_image(spec, rng))
        objects.append((spec.objects[0].colour, spec.objects[0].shape))
    return pixels, objects


def fit_word_map(runner, *, images: int = 768, held_out: int = 256, seed: int = 0,
                 ridge: float = 1e-3) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Fits the map of :class:`~studio.engine.pipelines.wan.ReferenceWords` on a loaded
    embedded-style model.

    Least squares ``[tokens, 1] @ W ~ [row(colour), row(shape)]`` with a ridge of ``ridge``
    times the mean diagonal of the Gram matrix (float64), on reference images
    (:func:`studio.tiny.denoiser.reference_image`) of ``images`` training scenes; scored on
    ``held_out`` scenes of the evaluation split.

    Args:
        runner: a ``WanRunner`` of the model, with its reference encoder.
    Returns:
        ``weight`` (WORDS * D_word, WORDS * D_token) and ``bias`` (WORDS * D_word,), float32,
        and the fit's figures: ``r2`` (training), and on the held-out scenes
        ``colour_nearest`` / ``shape_nearest`` (the share of pseudo-words whose nearest row,
        among the colour words or the shape words, is the object's own) and
        ``relative_error`` (the squared error over the targets' mean square).
    Raises:
        ValueError: the runner has no reference encoder, or ``images`` < 64.
    """
    from studio.tiny.denoiser import _ridge

    if runner.reference_encoder is None:
        raise ValueError("runner: the model has no reference encoder (reference_tokens)")
    if images < 64 or held_out < 1:
        raise ValueError(f"images={images} must be >= 64 and held_out={held_out} >= 1")
    colours, shapes = list(world.COLOURS), list(world.SHAPES)
    colour_rows, shape_rows = word_rows(runner, colours), word_rows(runner, shapes)

    def targets(objects):
        return torch.cat([colour_rows[[colours.index(c) for c, _ in objects]],
                          shape_rows[[shapes.index(s) for _, s in objects]]], dim=1)

    pixels, objects = _scenes(images, seed, "train")
    x, y = reference_features(runner, pixels), targets(objects)
    w, r2 = _ridge(x, y, ridge)
    weight, bias = w[:-1].T.contiguous(), w[-1].contiguous()

    pixels, objects = _scenes(held_out, seed + 1, "eval")
    pred = reference_features(runner, pixels) @ weight.T + bias
    truth = targets(objects)
    dim = colour_rows.shape[1]

    def nearest(block, rows, names, wanted):
        d = torch.cdist(block, rows)
        return float(np.mean([names[int(i)] == want
                              for i, want in zip(d.argmin(1), wanted, strict=True)]))

    stats = {"images": images, "held_out": held_out, "r2": r2,
             "colour_nearest": nearest(pred[:, :dim], colour_rows, colours,
                                       [c for c, _ in objects]),
             "shape_nearest": nearest(pred[:, dim:], shape_rows, shapes,
                                      [s for _, s in objects]),
             "relative_error": float((pred - truth).pow(2).mean() / truth.pow(2).mean())}
    return weight, bias, stats


def write_word_map(folder: Path, weight: torch.Tensor, bias: torch.Tensor,
                   stats: dict | None = None) -> Path:
    """Writes the map into ``folder`` (:data:`MAP_FILE`, fp32 safetensors) and declares it in
    its ``studio.json`` (``reference_words``), both atomically.

    Raises:
        ValueError: ``folder`` has no ``studio.json`` naming a reference encoder.
    """
    from safetensors.torch import save

    from studio.paths import atomic_write_bytes, atomic_write_text

    folder = Path(folder)
    meta_path = folder / "studio.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    if not meta.get("reference_tokens"):
        raise ValueError(f"{folder}: studio.json names no reference encoder (reference_tokens)")
    metadata = {"words": str(WORDS), "placeholder": PLACEHOLDER,
                "fit": json.dumps(stats or {}, sort_keys=True)}
    atomic_write_bytes(folder / MAP_FILE, save(
        {"weight": weight.float().contiguous(), "bias": bias.float().contiguous()}, metadata))
    meta["reference_words"] = {"map": MAP_FILE, "placeholder": PLACEHOLDER}
    atomic_write_text(meta_path, json.dumps(meta, indent=2) + "\n")
    return folder / MAP_FILE


def add_reference_words(folder: Path, *, seed: int = 0) -> dict:
    """Fits the word map on the model in ``folder`` (loaded through the engine's registry)
    and writes it there; returns the fit's figures (:func:`fit_word_map`)."""
    from studio.engine.models.registry import ModelRegistry
    from studio.engine.pipelines.wan import WanRunner

    registry = ModelRegistry(include_hf_cache=False)
    entry = registry.inspect(Path(folder), model_id=Path(folder).name, source="folder")
    if entry.error:
        raise ValueError(f"{folder}: {entry.error}")
    runner = WanRunner(entry, torch.device("cpu"), torch.float32)
    weight, bias, stats = fit_word_map(runner, seed=seed)
    write_word_map(folder, weight, bias, stats)
    return stats
