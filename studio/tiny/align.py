"""Stage ``align-reference``: the reference encoder taught to name the reference's object.

Reference-to-video gives the denoiser the reference as tokens appended after the prompt's
(:func:`studio.engine.pipelines.wan.reference_tokens`). Trained only through the denoising
loss, those tokens never came to carry the object (session 13: the nearest of the 32
"<colour> <shape>" word pairs was right 9 % of the time), while the denoiser reads colour and
shape from word embeddings well, and even from word embeddings appended after an anonymised
caption (the object's colour and shape right 19 % of the time with no training for it,
against 3 % without). So the reference encoder is first trained alone to put, on its first
two tokens, the text encoder's embeddings of the reference object's colour and shape words
(:func:`studio.tiny.denoiser.reference_word_targets`): a small supervised regression, after
ELITE (Wei et al., ICCV 2023: a reference mapped into the text encoder's word-embedding
space). The denoiser run then goes on with ``--reference-alignment`` keeping the tokens there.

    python -m studio.tiny.train align-reference --out runs/tiny --total-steps 1500

trains in ``<out>/reference-align`` (seeded and resumable like every stage), from the
denoiser checkpoint's reference encoder, against its EMA text encoder (the one sampling
uses), and at the end writes the result into ``<out>/dit/checkpoint`` as both the live and
the EMA reference encoder (each file replaced atomically), where the denoiser stage resumes
from.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from studio.tiny import world
from studio.train.loop import TrainTask


class ReferenceAlignTask(TrainTask):
    """Regression of the reference encoder's first two tokens onto the object's word
    embeddings.

    Data: references as the denoiser's reference steps draw them
    (:func:`studio.tiny.denoiser.reference_image`: the object alone at another size and position
    on another background), VAE-encoded and normalised as the denoiser sees them, from a pool
    (``warm`` encoded at the start, ``fresh`` new ones per step replacing random entries, at
    most ``max_pool``): the VAE encode costs far more than the encoder's step.

    Loss: mean squared error between tokens ``[:, :2]`` (B, 2, 64) and the targets (B, 2, 64),
    divided by the targets' mean square (so 1 is an encoder that outputs zeros, and the
    targets' own variance share, about 0.7, is one that outputs the mean target).

    Args:
        denoiser_task: a :class:`studio.tiny.denoiser.DenoiserTask` whose ``reference_encoder``
            is trained here; its ``ema_text`` gives the targets and its VAE the latents.
        batch: references per step.

    Raises:
        ValueError: ``batch``, ``warm``, ``fresh`` or ``max_pool`` below 1, or ``warm`` above
            ``max_pool``.
    """

    def __init__(self, denoiser_task, *, batch: int = 128, warm: int = 4096, fresh: int = 16,
                 max_pool: int = 16384, seed: int = 31337):
        if min(batch, warm, fresh, max_pool) < 1 or warm > max_pool:
            raise ValueError(f"batch={batch}, warm={warm}, fresh={fresh}, max_pool={max_pool}: "
                             "each must be >= 1 and warm <= max_pool")
        self.task, self.batch_size = denoiser_task, batch
        self.fresh, self.max_pool = fresh, max_pool
        self.pool: list[tuple[torch.Tensor, tuple[str, str]]] = []
        rng = np.random.default_rng(seed)
        while len(self.pool) < warm:
            self._add(rng, min(256, warm - len(self.pool)))

    def modules(self):
        return {"reference_encoder": self.task.reference_encoder}

    @torch.no_grad()
    def _add(self, rng: np.random.Generator, n: int) -> None:
        from studio.tiny.denoiser import insert_bounded, reference_image

        specs = [world.sample_scene(rng, video=True) for _ in range(n)]
        z = self.task.encode_pixels(np.stack([reference_image(s, rng) for s in specs]))
        insert_bounded(self.pool, self.max_pool, rng,
                       [(z[i].clone(), (s.objects[0].colour, s.objects[0].shape))
                        for i, s in enumerate(specs)])

    def batch(self, rng):
        self._add(rng, self.fresh)
        picked = [self.pool[int(i)] for i in rng.integers(len(self.pool), size=self.batch_size)]
        return torch.stack([p[0] for p in picked]), [p[1] for p in picked]

    def loss(self, batch, gen):
        from studio.engine.pipelines.wan import reference_tokens
        from studio.tiny.denoiser import alignment_error, reference_word_targets

        latents, objects = batch
        target = reference_word_targets(self.task, objects, encoder=self.task.ema_text)
        tokens = reference_tokens(self.task.reference_encoder, latents)[:, :2]
        return alignment_error(tokens, target), {}

    @torch.no_grad()
    def evaluate(self, n: int = 512, seed: int = 2) -> dict[str, float]:
        """On ``n`` new references: the normalised error, and how often the nearest of the
        32 word pairs' targets is the object's (pair), has its colour, has its shape."""
        import itertools

        from studio.engine.pipelines.wan import reference_tokens
        from studio.tiny.denoiser import alignment_error, reference_image, reference_word_targets

        pairs = list(itertools.product(world.COLOURS, world.SHAPES))
        targets = reference_word_targets(self.task, pairs, encoder=self.task.ema_text)
        rng = np.random.default_rng(seed)
        specs = [world.sample_scene(rng, video=True) for _ in range(n)]
        z = self.task.encode_pixels(np.stack([reference_image(s, rng) for s in specs]))
        encoder = self.task.reference_encoder
        was_training = encoder.training
        encoder.eval()
        tokens = reference_tokens(encoder, z)[:, :2]
        encoder.train(was_training)
        truth = torch.tensor([pairs.index((s.objects[0].colour, s.objects[0].shape))
                              for s in specs])
        nearest = ((tokens[:, None] - targets[None]) ** 2).flatten(2).sum(-1).argmin(1)
        tg = targets[truth]
        return {"error": round(float(alignment_error(tokens, tg)), 4),
                "pair": round(float((nearest == truth).float().mean()), 4),
                "colour": round(float(np.mean([pairs[a][0] == pairs[b][0] for a, b in
                                               zip(truth.tolist(), nearest.tolist(),
                                                   strict=True)])), 4),
                "shape": round(float(np.mean([pairs[a][1] == pairs[b][1] for a, b in
                                              zip(truth.tolist(), nearest.tolist(),
                                                  strict=True)])), 4)}


def write_into_denoiser_checkpoint(encoder: torch.nn.Module, dit_dir: Path) -> None:
    """Replaces ``reference_encoder`` and ``ema_reference_encoder`` in ``dit_dir/checkpoint``
    with ``encoder``'s weights, each file written to a temporary name, fsynced and renamed.

    Raises:
        FileNotFoundError: ``dit_dir`` holds no denoiser checkpoint.
    """
    from safetensors.torch import save_model

    ckpt = dit_dir / "checkpoint"
    if not (ckpt / "state.json").exists():
        raise FileNotFoundError(f"no denoiser checkpoint in {ckpt}")
    for name in ("reference_encoder", "ema_reference_encoder"):
        tmp = ckpt / f".{name}.safetensors.tmp"
        save_model(encoder, str(tmp))
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        tmp.replace(ckpt / f"{name}.safetensors")


__all__ = ["ReferenceAlignTask", "write_into_denoiser_checkpoint"]
