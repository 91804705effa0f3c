"""The embedded model's denoiser and text encoder: the builders (:func:`build_denoiser`,
:func:`build_text_stack`, :func:`build_reference_encoder`), the flow-matching objective
(:class:`DenoiserTask`, :func:`flow_matching_loss`) and the pool of encoded training samples
(:class:`LatentPool`), run by :mod:`studio.tiny.train`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from studio.tiny import world
from studio.tiny.autoencoder import (
    CLIP_FRAMES,
    LATENT_CHANNELS,
    SIZE,
    SPATIAL,
    export_vae,
    spatial_compression_of,
    temporal_compression_of,
    to_tensor,
)
from studio.train.loop import TrainTask

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


TOKEN_GRID = 8  # denoiser tokens per frame along each side, whatever the VAE's compression


def denoiser_patch(spatial_compression: int = SPATIAL) -> int:
    """The denoiser's spatial patch side for a VAE with ``spatial_compression`` pixels per
    latent pixel: 2 for the 4x VAE (16x16 latents), 4 for the 2x VAE (32x32), so a 64x64 frame
    is always 8 x 8 tokens and the denoiser's cost does not change with the VAE.

    Raises:
        ValueError: ``spatial_compression`` other than 2 or 4.
    """
    if spatial_compression not in (2, 4):
        raise ValueError(f"spatial_compression={spatial_compression}: must be 2 or 4")
    return SIZE // spatial_compression // TOKEN_GRID


def build_denoiser(spatial_compression: int = SPATIAL, latent_channels: int = LATENT_CHANNELS):
    """The embedded denoiser: WanTransformer3DModel, 6 layers, 3 heads of dim 64, patches of
    (1, p, p) latent cells with p = :func:`denoiser_patch` (``spatial_compression``: the VAE's
    pixels per latent pixel, 4 or 2; ``latent_channels``: its latent channels).

    Raises:
        ValueError: ``spatial_compression`` other than 2 or 4.
    """
    from diffusers import WanTransformer3DModel

    p = denoiser_patch(spatial_compression)
    return WanTransformer3DModel(
        patch_size=(1, p, p), num_attention_heads=3, attention_head_dim=64,
        in_channels=latent_channels, out_channels=latent_channels, text_dim=64, freq_dim=64,
        ffn_dim=512, num_layers=6, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32)


def build_reference_encoder(spatial_compression: int = SPATIAL,
                            latent_channels: int = LATENT_CHANNELS):
    """The reference-token encoder (see :func:`studio.engine.pipelines.wan.reference_tokens`):
    a ``transformers`` ``CLIPVisionModel`` over the reference's normalised latents (B, C,
    64 / s, 64 / s) for a VAE of ``spatial_compression`` s, in 4 x 4 patches (of 16 / s
    latent cells a side), 2 layers of width 64 (the text embeddings' width): 17 tokens
    appended to the 32 text tokens of a reference-to-video prompt.

    Raises:
        ValueError: ``spatial_compression`` other than 2 or 4.
    """
    from transformers import CLIPVisionConfig, CLIPVisionModel

    denoiser_patch(spatial_compression)  # validates
    side = SIZE // spatial_compression
    cfg = CLIPVisionConfig(num_channels=latent_channels, image_size=side, patch_size=side // 4,
                           hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, projection_dim=64)
    return CLIPVisionModel(cfg)


def anonymise(caption: str) -> str:
    """A caption with colour and shape words removed: "a small red star ..." -> "a small object
    ...", "a red star ..." -> "an object ..." (what a reference-to-video prompt says when the
    reference gives the object)."""
    import re

    global _COLOUR_RE
    if _COLOUR_RE is None:
        colours = "|".join(sorted(set(world.COLOURS) | {"violet", "grey"}))
        _COLOUR_RE = re.compile(rf"\b({colours})\s+(?=(circle|square|triangle|star)\b)")
    text = _COLOUR_RE.sub("", caption)
    text = re.sub(r"\b(circle|square|triangle|star)\b(?!ry)", "object", text)
    return re.sub(r"\b([Aa]) object\b", r"\1n object", text)


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
                       reference: torch.Tensor | None = None,
                       latent_weight: torch.Tensor | None = None) -> torch.Tensor:
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
        latent_weight: optional per-latent-pixel loss weights (B, 1, f, h, w), >= 0.
    Returns:
        The weighted mean squared error over the latents in the loss (a 0-dim tensor; the
        plain mean over the frames in the loss without ``latent_weight``).
    """
    b, _, f, h, w = x0.shape
    _, ph, pw = transformer.config.patch_size
    sv = s.view(b, 1, 1, 1, 1)
    xt = (1 - sv) * x0 + sv * noise
    target = noise - x0
    t_frame = (s * 1000).view(b, 1).expand(b, f).clone()  # per latent frame
    weight = torch.ones(b, 1, f, h, w, device=x0.device)
    if latent_weight is not None:
        weight = weight * latent_weight
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
    return err.sum() / (weight.sum() * pred.shape[1])


def step_mix(reference_share: float = 0.18,
             image_share: float | None = None) -> dict[str, float]:
    """Probabilities of the denoiser's step kinds: ``reference_share`` of reference-to-video
    clips, ``image_share`` of images and the rest clips; without ``image_share`` images and
    clips share the rest 45 : 37 (the mix of steps 0-21036 was 0.45 / 0.37 / 0.18).

    Raises:
        ValueError: ``reference_share`` outside [0, 1), or ``image_share`` outside
            [0, 1 - reference_share).
    """
    if not 0 <= reference_share < 1:
        raise ValueError(f"reference_share={reference_share}: must be in [0, 1)")
    if image_share is None:
        rest = (1 - reference_share) / 0.82
        return {"image": 0.45 * rest, "clip": 0.37 * rest, "reference": reference_share}
    if not 0 <= image_share < 1 - reference_share:
        raise ValueError(f"image_share={image_share}: must be in [0, 1 - reference_share = "
                         f"{1 - reference_share:g})")
    return {"image": image_share, "clip": 1 - reference_share - image_share,
            "reference": reference_share}


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
        object_cover: with ``DenoiserTask.object_weight``: float32 (B, 1, f, h, w) in [0, 1]
            on the latent grid, where the scene's objects are (:meth:`DenoiserTask.
            latent_coverage`); else None.
        motion_target: with ``DenoiserTask.motion_awareness`` on clip steps: the
            :func:`motion_targets` of the scenes, ``(target float32 (B, f, 3), known bool
            (B,))``, where ``known`` is also False for a dropped caption; else None.
        shape_cover: with ``DenoiserTask.shape_awareness``: float32 (B, len(world.SHAPES),
            f, h, w), the object cover per shape (:meth:`DenoiserTask.latent_coverage` with
            ``by_shape``); else None.
    """

    captions: list[str]
    pixels: np.ndarray | torch.Tensor
    refs: np.ndarray | torch.Tensor | None
    first_frame: np.ndarray
    ref_objects: list[tuple[str, str]] | None = None
    object_cover: torch.Tensor | None = None
    motion_target: tuple[torch.Tensor, torch.Tensor] | None = None
    shape_cover: torch.Tensor | None = None


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


#: Latent frames the frame-awareness head can name (17 frames on the 2x VAE: 9, plus an
#: appended reference frame).
MAX_TOKEN_FRAMES = 16


def frame_awareness_loss(head: torch.nn.Module, hidden: torch.Tensor,
                         frames: int) -> tuple[torch.Tensor, float]:
    """Cross-entropy of a linear read-out of each token's frame index from a block's output.

    An auxiliary training loss (the head is not part of the exported model), in the spirit of
    REPA's hidden-state targets (Yu et al. 2024, "Representation Alignment for Generation"):
    Wan's 3D rotary embedding gives attention relative offsets only, so a token learns which
    latent frame it is in only from the clip's ends, and the 2x-VAE denoiser (5 latent
    frames) read it 0.79 of the time by its last block on pure noise (a linear probe of each
    block's tokens, training/README.md, session 28); a motion word can only move the object
    in tokens that know how late they are.

    Args:
        head: maps (..., D) to (..., K) logits, K >= ``frames``.
        hidden: (B, N, D) tokens of one block, frame-major (N = frames * tokens per frame),
            the layout of Wan's flattened patches.
        frames: token frames in the sequence (latent frames, an appended reference included).
    Returns:
        (the mean cross-entropy, a 0-dim tensor; the share of tokens whose arg-max is right).
    Raises:
        ValueError: N not a multiple of ``frames``.
    """
    b, n, _ = hidden.shape
    if frames < 1 or n % frames:
        raise ValueError(f"frames={frames}: must divide the {n} tokens")
    labels = torch.arange(frames, device=hidden.device).repeat_interleave(n // frames)
    logits = head(hidden.float())  # (B, N, K)
    loss = torch.nn.functional.cross_entropy(logits.reshape(b * n, -1), labels.repeat(b))
    accuracy = float((logits.argmax(-1) == labels).float().mean())
    return loss, accuracy


#: Token rows (and columns) per frame the position-awareness head can name (8 at 64 x 64 on
#: the 2x VAE with a 4-pixel patch).
MAX_TOKEN_SIDE = 16


def position_awareness_loss(head: torch.nn.Module, hidden: torch.Tensor, frames: int,
                            rows: int, columns: int) -> tuple[torch.Tensor, float]:
    """Cross-entropy of a linear read-out of each token's absolute row and column in its
    frame from a block's output: an auxiliary training loss like
    :func:`frame_awareness_loss` (after REPA, Yu et al. 2024).

    Why: Wan's 3D rotary embedding (Su et al., "RoFormer", 2021) gives attention relative
    offsets only, so a token learns where it is in the frame only from the frame's edges. A
    denoiser trained from random weights on the 2x VAE read its tokens' row and column only
    0.33 / 0.39 of the time by its last block on pure noise (chance 1/8; the shipped
    denoiser, trained 30 hours in a longer lineage, 0.95 / 0.79), and its loss did not move
    when the caption's position words were swapped (``studio.tiny.probe``,
    training/README.md, session 38): a word such as "top left" can only place the object in
    tokens that know where they are.

    Args:
        head: maps (..., D) to (..., 2 * :data:`MAX_TOKEN_SIDE`) logits: rows first, then
            columns.
        hidden: (B, N, D) tokens of one block in Wan's flattened patch order (frame, row,
            column), N = ``frames * rows * columns``.
        frames: token frames in the sequence (an appended reference frame included).
        rows, columns: tokens per frame down and across, each in [1, MAX_TOKEN_SIDE].
    Returns:
        (the mean of the row and column cross-entropies, a 0-dim tensor; the share of
        tokens whose row and column arg-maxes are both right).
    Raises:
        ValueError: N is not ``frames * rows * columns``, or a side is outside
            [1, MAX_TOKEN_SIDE].
    """
    b, n, _ = hidden.shape
    for name, side in (("rows", rows), ("columns", columns)):
        if not 1 <= side <= MAX_TOKEN_SIDE:
            raise ValueError(f"{name}={side}: must be in [1, {MAX_TOKEN_SIDE}]")
    if frames < 1 or n != frames * rows * columns:
        raise ValueError(f"frames={frames}, rows={rows}, columns={columns}: the sequence "
                         f"holds {n} tokens, not frames * rows * columns")
    row = torch.arange(rows, device=hidden.device).repeat_interleave(columns).repeat(frames)
    column = torch.arange(columns, device=hidden.device).repeat(rows * frames)
    logits = head(hidden.float())  # (B, N, 2 * MAX_TOKEN_SIDE)
    row_logits = logits[..., :MAX_TOKEN_SIDE].reshape(b * n, -1)
    column_logits = logits[..., MAX_TOKEN_SIDE:].reshape(b * n, -1)
    f = torch.nn.functional.cross_entropy
    loss = 0.5 * (f(row_logits, row.repeat(b)) + f(column_logits, column.repeat(b)))
    right = (row_logits.argmax(-1) == row.repeat(b)) & \
        (column_logits.argmax(-1) == column.repeat(b))
    return loss, float(right.float().mean())


def _pool_cover_to_tokens(cover: torch.Tensor, hidden: torch.Tensor, patch: tuple[int, int],
                          name: str) -> tuple[torch.Tensor, int]:
    """Pools a latent-grid cover to one value per token of the latent frames.

    Args:
        cover: (B, C, f, h, w) on the latent grid.
        hidden: (B, N, D) tokens in Wan's (frame, row, column) order; only N is read.
        patch: (ph, pw), the denoiser's spatial patch.
        name: the cover's argument name, for the errors.
    Returns:
        (float32 (B, C, T) patch means, T = ``f * (h / ph) * (w / pw)``; T).
    Raises:
        ValueError: the cover's sides do not divide by the patch, or N < T.
    """
    b, c, f, h, w = cover.shape
    ph, pw = patch
    if h % ph or w % pw:
        raise ValueError(f"{name} of {h} x {w} latent pixels does not divide into "
                         f"{ph} x {pw} patches")
    tokens = f * (h // ph) * (w // pw)
    if hidden.shape[1] < tokens:
        raise ValueError(f"hidden holds {hidden.shape[1]} tokens, fewer than the cover's "
                         f"{tokens}")
    pooled = torch.nn.functional.avg_pool3d(cover.float(), (1, ph, pw)).reshape(b, c, tokens)
    return pooled, tokens


def layout_awareness_loss(head: torch.nn.Module, hidden: torch.Tensor, cover: torch.Tensor,
                          patch: tuple[int, int], known: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy of a linear read-out of "the object is here" from each token of
    a block's output: an auxiliary training loss like :func:`position_awareness_loss` (after
    REPA, Yu et al. 2024), aimed at the position words.

    Why: from noise, the only source of where the object goes is the caption. A denoiser
    trained from random weights whose tokens knew their row and column (the position loss)
    still did not read the position words 1900 steps later (swapping them changed its loss by
    0.04 %, training/README.md, session 38): at the high noise levels where sampling places
    the object, what it is worth in the flow-matching loss is small beside the noise. The
    read-out asks each token, early in the network, whether it lies under the object, which
    at high noise only the position (and size and shape) words answer.

    Args:
        head: maps (..., D) to (..., 1) logits.
        hidden: (B, N, D) tokens of one block in Wan's (frame, row, column) order; the first
            ``f * (h / ph) * (w / pw)`` are the latent frames (an appended reference frame
            after them is not read).
        cover: float32 (B, 1, f, h, w) in [0, 1] on the latent grid
            (:meth:`DenoiserTask.latent_coverage`); each token's target is its patch's mean.
        patch: (ph, pw), the denoiser's spatial patch.
        known: bool (B,): the items scored (False where the caption was dropped).
    Returns:
        The mean cross-entropy over the known items' tokens (a 0-dim tensor; 0, still in the
        graph, when no item is known).
    Raises:
        ValueError: the sequence is shorter than the cover's tokens, or the cover's sides do
            not divide by the patch.
    """
    pooled, tokens = _pool_cover_to_tokens(cover, hidden, patch, "cover")
    target = pooled[:, 0]
    logits = head(hidden[:, :tokens].float())[..., 0]
    per_item = torch.nn.functional.binary_cross_entropy_with_logits(
        logits, target, reduction="none").mean(1)
    weight = known.to(per_item.dtype)
    return (per_item * weight).sum() / weight.sum().clamp_min(1.0)


#: A token's shape label counts when its patch's mean cover by objects of one shape is at
#: least this, and by every other shape less (:func:`shape_awareness_loss`).
SHAPE_TOKEN_COVER = 0.25


def shape_awareness_loss(head: torch.nn.Module, hidden: torch.Tensor, shape_cover: torch.Tensor,
                         patch: tuple[int, int], known: torch.Tensor
                         ) -> tuple[torch.Tensor, float | None]:
    """Cross-entropy of a linear read-out of the shape of the object under each token from a
    block's output: an auxiliary training loss like :func:`layout_awareness_loss` (after
    REPA, Yu et al. 2024), aimed at the shape words.

    Why: the from-scratch recipe run (training/README.md, sessions 37-38) learned colour,
    position and motion but drew stars as circles or squares (shape 55-62 % at step 25000,
    bar 75 %); its loss hardly moved when the shape word was swapped (+0.06, against +0.41
    for the shipped model). At high noise only the caption says which shape goes where; the
    read-out asks each token under an object, early in the network, which shape it is.

    Args:
        head: maps (..., D) to (..., K) logits, K = ``len(world.SHAPES)``.
        hidden: (B, N, D) tokens of one block in Wan's (frame, row, column) order; the first
            ``f * (h / ph) * (w / pw)`` are the latent frames (an appended reference frame
            after them is not read).
        shape_cover: float32 (B, K, f, h, w) in [0, 1] on the latent grid, one plane per
            shape (:meth:`DenoiserTask.latent_coverage` with ``by_shape``).
        patch: (ph, pw), the denoiser's spatial patch.
        known: bool (B,): the items scored (False where the caption was dropped).
    Returns:
        (the mean cross-entropy over the scored tokens: those of known items whose patch is
        covered at least :data:`SHAPE_TOKEN_COVER` by exactly one shape, labelled with it
        (where objects of two shapes meet or one hides the other, the cover, which ignores
        occlusion, cannot say which is seen: not scored); a 0-dim tensor, 0 and still in the
        graph when none is scored; the share of scored tokens whose arg-max is right, None
        when none is).
    Raises:
        ValueError: the sequence is shorter than the cover's tokens, the cover's sides do not
            divide by the patch, or the head's logits are not one per shape plane.
    """
    b, k = shape_cover.shape[:2]
    pooled, tokens = _pool_cover_to_tokens(shape_cover, hidden, patch, "shape_cover")
    logits = head(hidden[:, :tokens].float())  # (B, T, K)
    if logits.shape[-1] != k:
        raise ValueError(f"the head gives {logits.shape[-1]} logits for {k} shape planes")
    label = pooled.argmax(1)  # (B, T)
    scored = ((pooled >= SHAPE_TOKEN_COVER).sum(1) == 1) & known.view(b, 1)
    if not bool(scored.any()):
        return logits.sum() * 0.0, None
    picked = logits[scored]
    loss = torch.nn.functional.cross_entropy(picked, label[scored])
    return loss, float((picked.argmax(-1) == label[scored]).float().mean())


def latent_frame_groups(frames: int, temporal: int) -> list[slice]:
    """The pixel frames each latent frame of Wan's causal VAE encodes: latent frame 0 encodes
    frame 0, latent frame k the k-th group of ``temporal`` frames after it.

    Args:
        frames: pixel frames per clip, ``1 + k * temporal``.
        temporal: the VAE's temporal compression.
    Returns:
        ``1 + (frames - 1) // temporal`` slices into the frame axis.
    Raises:
        ValueError: ``frames`` not ``1 + k * temporal`` with k >= 1.
    """
    if temporal < 1 or frames < 1 + temporal or (frames - 1) % temporal:
        raise ValueError(f"frames={frames}: must be 1 + k * {temporal} with k >= 1")
    return [slice(0, 1)] + [slice(1 + k * temporal, 1 + (k + 1) * temporal)
                            for k in range((frames - 1) // temporal)]


def motion_targets(specs, temporal: int, frames: int = CLIP_FRAMES,
                   device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Where each clip's object is at each latent frame, relative to the clip's middle: the
    targets of :func:`motion_awareness_loss`.

    A latent frame's time is the mean clip time (``world.frame_times``) of the frames it
    encodes (:func:`latent_frame_groups`). The object's state (``world.object_state``) at
    that time minus its state at the middle (t = 0) gives ``dx / (W * MOTION_DISTANCE)``,
    ``dy / (H * MOTION_DISTANCE)`` and ``log(extent ratio) / log(GROWTH)``: each in
    [-0.5, 0.5], 0 for a still object (and dx, dy 0 in a world set to no travel,
    ``world.motion_distance(0)``).

    Args:
        specs: B ``world.SceneSpec`` clips.
        temporal: the VAE's temporal compression (frames per latent frame after the first).
        frames: pixel frames per clip, ``1 + k * temporal``.
    Returns:
        ``(target float32 (B, f, 3), known bool (B,))``, f = ``1 + (frames - 1) // temporal``;
        ``known`` is True for one-object clips (two objects may move differently; their rows
        are zero).
    Raises:
        ValueError: ``frames`` not ``1 + k * temporal`` with k >= 1.
    """
    times = world.frame_times(frames)
    latent_times = [float(np.mean(times[g])) for g in latent_frame_groups(frames, temporal)]
    travel = SIZE * (world.MOTION_DISTANCE or 1.0)  # no travel: dx = dy = 0
    target = np.zeros((len(specs), len(latent_times), 3), np.float32)
    known = np.zeros(len(specs), bool)
    for b, spec in enumerate(specs):
        if len(spec.objects) != 1:
            continue
        known[b] = True
        obj = spec.objects[0]
        x0, y0, e0 = world.object_state(obj, 0.0, SIZE, SIZE)
        for k, t in enumerate(latent_times):
            x, y, e = world.object_state(obj, t, SIZE, SIZE)
            target[b, k] = ((x - x0) / travel, (y - y0) / travel,
                            np.log(e / e0) / np.log(world.GROWTH))
    return torch.from_numpy(target).to(device), torch.from_numpy(known).to(device)


def motion_awareness_loss(head: torch.nn.Module, hidden: torch.Tensor, frames: int,
                          target: torch.Tensor, known: torch.Tensor) -> torch.Tensor:
    """Squared error of a linear read-out of each latent frame's object displacement from a
    block's output (each frame's tokens averaged, then divided by the batch's RMS): an
    auxiliary training loss like :func:`frame_awareness_loss` (after REPA, Yu et al. 2024),
    aimed at text-to-video motion.

    Why: a clip's stated position is its middle frame's, so in text-to-video the first latent
    frame must put the object behind its motion, which only the motion words tell; the
    denoiser leaves such clips still (training/README.md, session 32: 18 of the 24 wrong
    text-to-video motions of step 16000 on 64 prompts read "still";
    ``bench/results/2026-12-06-model-step16000-t2v-64.json``). The read-out asks every
    token of frame k to carry "the object is d_k from its middle position" (motion word x
    frame time) early in the network.

    Args:
        head: maps (..., D) to (..., 3).
        hidden: (B, N, D) tokens of one block, frame-major, ``frames`` token frames (an
            appended reference frame last, which is not read).
        frames: token frames in the sequence.
        target: (B, f, 3) from :func:`motion_targets`, f <= ``frames``.
        known: bool (B,): the items scored.
    Returns:
        The mean squared error over the known items' frames and components (a 0-dim tensor;
        0, still in the graph, when no item is known).
    Raises:
        ValueError: N not a multiple of ``frames``, or more target frames than ``frames``.
    """
    b, n, d = hidden.shape
    f = target.shape[1]
    if frames < 1 or n % frames:
        raise ValueError(f"frames={frames}: must divide the {n} tokens")
    if f > frames:
        raise ValueError(f"target has {f} frames, more than the {frames} token frames")
    pooled = hidden.float().reshape(b, frames, n // frames, d).mean(2)[:, :f]  # (B, f, D)
    # one scale for the batch (no gradient through it): the read-out stays linear, and the
    # blocks' large activations do not make the head's gradient outweigh the denoiser's
    # under gradient clipping (unscaled: a norm of 3-5 against the denoiser's 0.3)
    pooled = pooled / pooled.detach().pow(2).mean().sqrt().clamp_min(1e-6)
    err = (head(pooled) - target).pow(2).mean(dim=(1, 2))  # (B,)
    weight = known.to(err.dtype)
    return (err * weight).sum() / weight.sum().clamp_min(1.0)


class DenoiserTask(TrainTask):
    """Flow matching (rectified flow) of the Wan denoiser and the text encoder on VAE latents.

    x_t = (1 - s) x_0 + s e with s ~ sigmoid(N(m, 1)) (logit-normal, as in SD3; ``m``:
    ``noise_level_mean``, 0 by default, > 0 weighs the high noise levels where sampling
    decides the composition more), target
    e - x_0, timestep s * 1000: exactly what ``FlowMatchEulerDiscreteScheduler`` integrates.
    Step kinds: images (one latent frame), clips (9 frames: 3 latent frames with the 4x
    VAE, 5 with the 2x; 40 % of them
    image-to-video: the first latent frame clean with timestep 0, as Wan 2.2 TI2V's
    ``expand_timesteps``), and reference-to-video clips (a clean reference latent frame
    appended after the clip, timestep 0, the caption without colour and shape, 70 % of the
    time). 10 % of captions are dropped for classifier-free guidance.

    ``reference_alignment`` > 0 adds, on reference steps, that weight times the normalised
    squared error between the first two reference tokens and the text embeddings of the
    reference object's colour and shape words (:func:`reference_word_targets`), so the
    reference encoder speaks the denoiser's language; ``reference_lr_scale`` multiplies the
    reference encoder's learning rate (it trains from far behind the denoiser).

    ``object_weight`` W > 0 weighs each latent pixel's loss by ``1 + W c (1 - s)``, ``c``
    where the scene's objects are on the latent grid (:meth:`latent_coverage`). Why: objects
    cover about 3 % of a frame, so the plain mean spends the denoiser on backgrounds, and the
    shape of small objects is what it learned last (the VAE had the same trouble, fixed by
    the same weighting in its pixel loss). The ``1 - s`` factor fades the weight out at high
    noise, where the weight (a function of x_0) is not yet a function of x_t and would bias
    the learned velocity toward objects everywhere; at low noise the layout is visible in
    x_t and the weighted loss has the same minimiser as the plain one. ``motion_weight`` M
    adds ``M m`` on clips, ``m = |c_k - c_0|`` where a latent frame's objects are not where
    they were in the first (``motion_anchor`` "first"; "middle": ``m = |c_k - c_mid|``, the
    middle latent frame's, which also weighs the first frame, where the object must sit
    behind its motion because a clip's stated position is its middle, and text-to-video
    fails; training/README.md, session 31): the leading and trailing edges of the motion,
    where a denoiser that leaves the object still is wrong (the 2x-VAE denoiser at step 3527
    did: t2v motion 12.5 %, chance 17 %). It does not fade with noise: the direction is
    decided at high noise, where the world's small motion (0.18 of the frame over a clip)
    costs a still guess least; there the weight's bias pushes toward more motion, the error
    to correct.
    Measured (training/README.md, session 28): neither form, nor clip-only steps with M = 30,
    made the 2x-VAE denoiser's prediction depend on its motion words
    (``scripts/probe_motion_words.py``) in 2,500 steps.

    Reference clips also get the reference's tokens from a small image encoder
    (:func:`build_reference_encoder`, trained with the denoiser, module
    ``reference_encoder``) appended to the text embeddings; 10 % of them are zeroed (the
    unconditional branch's tokens at sampling). Why: in 20,000 steps the denoiser never
    learned to look the object up in the appended frame (its loss was the same with another
    clip's reference), while it reads colour and shape from cross-attention tokens well; Wan
    2.1 I2V likewise gives its image both as latents and as CLIP tokens. The module was added
    at step 20038 and is optional in older checkpoints (it starts fresh).

    ``frame_awareness`` F > 0 adds, on clip steps, F times :func:`frame_awareness_loss` of a
    linear head (module ``frame_head``, trained, not exported) reading each token's latent
    frame from the output of block ``frame_awareness_block``. ``motion_awareness`` A > 0 adds,
    on clip steps, A times :func:`motion_awareness_loss` of a linear head (module
    ``motion_head``, trained, not exported) reading each latent frame's object displacement
    from the same block's output. ``position_awareness`` P > 0 adds, on every step, P times
    :func:`position_awareness_loss` of a linear head (module ``position_head``, trained, not
    exported) reading each token's row and column from the same block's output.
    ``layout_awareness`` L > 0 adds, on every step, L times :func:`layout_awareness_loss` of a
    linear head (module ``layout_head``, trained, not exported) reading whether each token
    lies under an object from the same block's output (it needs the object cover: set
    ``object_weight`` or ``motion_weight``). ``shape_awareness`` S > 0 adds, on every step,
    S times :func:`shape_awareness_loss` of a linear head (module ``shape_head``, trained, not
    exported) reading the shape of the object under each token from the same block's output.
    ``free_caption_share`` (0 to 1) of one-object captions leave out the size, the position
    or both (:meth:`caption`; the world's free forms).
    """

    optional_modules = frozenset({"reference_encoder", "ema_reference_encoder", "frame_head",
                                  "motion_head", "position_head", "layout_head",
                                  "shape_head"})
    step_kinds = step_mix()  # the default mix; an instance's comes from reference_share
    motion_anchor = "first"  # the default; an instance's comes from motion_anchor
    motion_awareness = 0.0  # off by default, as are the heads
    position_awareness = 0.0
    layout_awareness = 0.0
    shape_awareness = 0.0
    free_caption_share = 0.0
    frame_head: torch.nn.Module | None = None
    motion_head: torch.nn.Module | None = None
    position_head: torch.nn.Module | None = None
    layout_head: torch.nn.Module | None = None
    shape_head: torch.nn.Module | None = None

    def __init__(self, device: torch.device, vae, *, image_batch: int = 48,
                 clip_batch: int = 12, ema_decay: float = 0.999, pool: bool = False,
                 reference_share: float = 0.18, noise_level_mean: float = 0.0,
                 reference_alignment: float = 0.0, reference_lr_scale: float = 1.0,
                 object_weight: float = 0.0, motion_weight: float = 0.0,
                 image_share: float | None = None, frame_awareness: float = 0.0,
                 frame_awareness_block: int = 1, motion_anchor: str = "first",
                 motion_awareness: float = 0.0, position_awareness: float = 0.0,
                 layout_awareness: float = 0.0, shape_awareness: float = 0.0,
                 free_caption_share: float = 0.0):
        import copy

        step_kinds = step_mix(reference_share, image_share)  # bad input fails before building
        if not 0.0 <= free_caption_share <= 1.0:
            raise ValueError(f"free_caption_share={free_caption_share}: must be in [0, 1]")
        self.free_caption_share = free_caption_share
        if not -3.0 <= noise_level_mean <= 3.0:
            raise ValueError(f"noise_level_mean={noise_level_mean}: must be in [-3, 3]")
        if not 0.0 <= reference_alignment <= 10.0:
            raise ValueError(f"reference_alignment={reference_alignment}: must be in [0, 10]")
        if not 0.0 < reference_lr_scale <= 100.0:
            raise ValueError(f"reference_lr_scale={reference_lr_scale}: must be in (0, 100]")
        for name, value in (("object_weight", object_weight), ("motion_weight", motion_weight)):
            if not 0.0 <= value <= 100.0:
                raise ValueError(f"{name}={value}: must be in [0, 100]")
        self.object_weight, self.motion_weight = object_weight, motion_weight
        if motion_anchor not in ("first", "middle"):
            raise ValueError(f"motion_anchor={motion_anchor!r}: must be 'first' or 'middle'")
        self.motion_anchor = motion_anchor
        if not 0.0 <= frame_awareness <= 10.0:
            raise ValueError(f"frame_awareness={frame_awareness}: must be in [0, 10]")
        if not 0 <= frame_awareness_block < 6:
            raise ValueError(f"frame_awareness_block={frame_awareness_block}: must be in [0, 5]")
        self.frame_awareness, self.frame_awareness_block = frame_awareness, frame_awareness_block
        if not 0.0 <= motion_awareness <= 10.0:
            raise ValueError(f"motion_awareness={motion_awareness}: must be in [0, 10]")
        self.motion_awareness = motion_awareness
        if not 0.0 <= position_awareness <= 10.0:
            raise ValueError(f"position_awareness={position_awareness}: must be in [0, 10]")
        self.position_awareness = position_awareness
        if not 0.0 <= layout_awareness <= 10.0:
            raise ValueError(f"layout_awareness={layout_awareness}: must be in [0, 10]")
        if layout_awareness > 0 and not (object_weight or motion_weight):
            raise ValueError("layout_awareness needs the object cover: set object_weight or "
                             "motion_weight above 0")
        self.layout_awareness = layout_awareness
        if not 0.0 <= shape_awareness <= 10.0:
            raise ValueError(f"shape_awareness={shape_awareness}: must be in [0, 10]")
        self.shape_awareness = shape_awareness
        self.eval_modes = ("t2i",)  # each checkpoint's eval line; the dit stage adds "t2v"
        self.eval_prompts = 32  # held-out prompts per mode of each eval line
        self.noise_level_mean = noise_level_mean
        self.reference_alignment, self.reference_lr_scale = reference_alignment, reference_lr_scale
        self.device = device
        self.vae = vae.to(device).eval().requires_grad_(False)
        self.tokenizer, self.text_encoder = build_text_stack()
        self.text_encoder.to(device)
        spatial, channels = spatial_compression_of(vae), int(vae.config.z_dim)
        self.transformer = build_denoiser(spatial, channels).to(device)
        self.ema_text = copy.deepcopy(self.text_encoder).requires_grad_(False)
        self.ema_transformer = copy.deepcopy(self.transformer).requires_grad_(False)
        self.reference_encoder = build_reference_encoder(spatial, channels).to(device)
        self.ema_reference_encoder = copy.deepcopy(self.reference_encoder).requires_grad_(False)
        width = self.transformer.config.num_attention_heads * \
            self.transformer.config.attention_head_dim  # of the blocks' tokens
        if frame_awareness > 0:
            self.frame_head = torch.nn.Linear(width, MAX_TOKEN_FRAMES).to(device)
        if motion_awareness > 0:
            self.motion_head = torch.nn.Linear(width, 3).to(device)
        if position_awareness > 0:
            self.position_head = torch.nn.Linear(width, 2 * MAX_TOKEN_SIDE).to(device)
        if layout_awareness > 0:
            self.layout_head = torch.nn.Linear(width, 1).to(device)
        if shape_awareness > 0:
            self.shape_head = torch.nn.Linear(width, len(world.SHAPES)).to(device)
        self.image_batch, self.clip_batch, self.ema_decay = image_batch, clip_batch, ema_decay
        self.step_kinds = step_kinds
        self.latents_mean, self.latents_std = self.latent_stats()
        self.pool = LatentPool(self) if pool else None

    def modules(self):
        modules = {"text_encoder": self.text_encoder, "transformer": self.transformer,
                   "reference_encoder": self.reference_encoder,
                   "ema_text_encoder": self.ema_text, "ema_transformer": self.ema_transformer,
                   "ema_reference_encoder": self.ema_reference_encoder}
        for name, head in (("frame_head", self.frame_head), ("motion_head", self.motion_head),
                           ("position_head", self.position_head),
                           ("layout_head", self.layout_head),
                           ("shape_head", self.shape_head)):
            if head is not None:
                modules[name] = head
        return modules

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

    def latent_coverage(self, specs, video: bool, *, by_shape: bool = False
                        ) -> torch.Tensor | None:
        """Where the scenes' objects are on the latent grid: float32 (B, 1, f, h, w) in
        [0, 1], each latent pixel the maximum of :func:`world.object_coverage` over the
        pixels and frames it encodes (:func:`latent_frame_groups`), widened by one latent
        pixel so outlines count in full. With ``by_shape``, (B, len(world.SHAPES), f, h, w):
        one plane per shape (its maximum over the planes is the plain cover). None when
        ``object_weight`` and ``motion_weight`` are 0 (and ``by_shape`` is False)."""
        if not by_shape and not (getattr(self, "object_weight", 0.0)
                                 or getattr(self, "motion_weight", 0.0)):
            return None
        cover = np.stack([world.object_coverage(s, CLIP_FRAMES if video else None, SIZE, SIZE,
                                                by_shape=by_shape) for s in specs])
        cover = torch.from_numpy(cover).to(self.device)
        if not by_shape:
            cover = cover[:, None]  # (B, 1, [F,] H, W)
        if not video:
            cover = cover[:, :, None]  # (B, P, F, H, W)
        if video:
            groups = latent_frame_groups(CLIP_FRAMES, temporal_compression_of(self.vae))
            cover = torch.stack([cover[:, :, g].amax(dim=2) for g in groups], dim=2)
        sc = spatial_compression_of(self.vae)
        cover = torch.nn.functional.max_pool3d(cover, (1, sc, sc))
        return torch.nn.functional.max_pool3d(cover, (1, 3, 3), 1, (0, 1, 1))

    def batch_covers(self, specs, video: bool) -> dict[str, torch.Tensor | None]:
        """A batch's ``object_cover`` and ``shape_cover`` (:class:`DenoiserBatch`): each
        None when no weight or head needs it; with ``shape_awareness`` the plain cover is
        the per-shape cover's maximum over its planes (drawn once)."""
        if not getattr(self, "shape_awareness", 0.0):
            return {"object_cover": self.latent_coverage(specs, video), "shape_cover": None}
        shapes = self.latent_coverage(specs, video, by_shape=True)
        plain = getattr(self, "object_weight", 0.0) or getattr(self, "motion_weight", 0.0)
        return {"object_cover": shapes.amax(1, keepdim=True) if plain else None,
                "shape_cover": shapes}

    def batch_motion_targets(self, specs, video: bool, dropped: np.ndarray
                             ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """:func:`motion_targets` of a clip batch, items whose caption was dropped
        (``dropped``, bool (B,)) unknown; None for images or without ``motion_awareness``."""
        if not video or not self.motion_awareness:
            return None
        target, known = motion_targets(specs, temporal_compression_of(self.vae),
                                       device=self.device)
        return target, known & ~torch.from_numpy(np.asarray(dropped, bool)).to(self.device)

    #: what a free caption leaves out, drawn uniformly (world.caption's ``unnamed``)
    FREE_CAPTION_KINDS = (frozenset({"size"}), frozenset({"position"}),
                          frozenset({"size", "position"}))

    def caption(self, spec, rng: np.random.Generator) -> str:
        """A training caption of ``spec``: with probability ``free_caption_share`` (one-object
        scenes only) one of the world's free forms, without the size, the position or both
        (:data:`FREE_CAPTION_KINDS`), so that the model learns such prompts mean any size or
        position; otherwise a caption naming everything. At share 0 it draws from ``rng``
        exactly as ``world.caption`` (runs before this option resume unchanged)."""
        if self.free_caption_share > 0 and len(spec.objects) == 1 and \
                rng.random() < self.free_caption_share:
            unnamed = self.FREE_CAPTION_KINDS[int(rng.integers(len(self.FREE_CAPTION_KINDS)))]
            return world.caption(spec, rng, unnamed=unnamed)
        return world.caption(spec, rng)

    def batch(self, rng):
        if getattr(self, "pool", None) is not None:
            return self.pool.batch(rng)
        kind = rng.choice(list(self.step_kinds), p=list(self.step_kinds.values()))
        video = kind != "image"
        n = self.clip_batch if video else self.image_batch
        specs = [world.sample_scene(rng, video=video) for _ in range(n)]
        captions = [self.caption(s, rng) for s in specs]
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
        return DenoiserBatch(captions, pixels, refs, first_frame, objects,
                             motion_target=self.batch_motion_targets(specs, video, drop),
                             **self.batch_covers(specs, video))

    def loss(self, batch: DenoiserBatch, gen):
        captions, pixels, refs, first_frame, ref_objects = batch[:5]
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
        latent_weight = None
        if batch.object_cover is not None:
            cover = batch.object_cover
            latent_weight = 1 + self.object_weight * cover * (1 - s).view(b, 1, 1, 1, 1)
            if getattr(self, "motion_weight", 0.0) and cover.shape[2] > 1:
                k = cover.shape[2] // 2 if self.motion_anchor == "middle" else 0
                latent_weight = latent_weight + self.motion_weight * (
                    cover - cover[:, :, k:k + 1]).abs()
        head, motion_head = self.frame_head, self.motion_head
        position_head, layout_head = self.position_head, self.layout_head
        shape_head = getattr(self, "shape_head", None)
        captured = []
        hook = None
        if ((head is not None or motion_head is not None) and x0.shape[2] > 1) or \
                position_head is not None or layout_head is not None or shape_head is not None:
            block = self.transformer.blocks[self.frame_awareness_block]
            hook = block.register_forward_hook(lambda _m, _a, out: captured.append(out))
        try:
            loss = flow_matching_loss(self.transformer, x0, text, noise, s, first_frame=first,
                                      reference=ref, latent_weight=latent_weight)
        finally:
            if hook is not None:
                hook.remove()
        metrics = {}
        frames = x0.shape[2] + (1 if ref is not None else 0)
        if captured and position_head is not None:
            _, ph, pw = self.transformer.config.patch_size
            aware, accuracy = position_awareness_loss(position_head, captured[0], frames,
                                                      x0.shape[3] // ph, x0.shape[4] // pw)
            loss = loss + self.position_awareness * aware
            metrics["position_ce"], metrics["position_acc"] = float(aware.detach()), accuracy
        if captured and layout_head is not None and batch.object_cover is not None:
            _, ph, pw = self.transformer.config.patch_size
            known = torch.tensor([c != "" for c in captions], device=self.device)
            layout = layout_awareness_loss(layout_head, captured[0], batch.object_cover,
                                           (ph, pw), known)
            loss = loss + self.layout_awareness * layout
            metrics["layout_bce"] = float(layout.detach())
        if captured and shape_head is not None and batch.shape_cover is not None:
            _, ph, pw = self.transformer.config.patch_size
            known = torch.tensor([c != "" for c in captions], device=self.device)
            shape_ce, accuracy = shape_awareness_loss(shape_head, captured[0],
                                                      batch.shape_cover, (ph, pw), known)
            loss = loss + self.shape_awareness * shape_ce
            metrics["shape_ce"] = float(shape_ce.detach())
            if accuracy is not None:
                metrics["shape_acc"] = accuracy
        if captured and head is not None and x0.shape[2] > 1:
            aware, accuracy = frame_awareness_loss(head, captured[0], frames)
            loss = loss + self.frame_awareness * aware
            metrics["frame_ce"], metrics["frame_acc"] = float(aware.detach()), accuracy
        if captured and motion_head is not None and batch.motion_target is not None and \
                x0.shape[2] > 1:
            target, known = batch.motion_target
            if target.shape[1] != x0.shape[2]:
                raise ValueError(f"motion_target has {target.shape[1]} frames for a clip of "
                                 f"{x0.shape[2]} latent frames")
            motion_mse = motion_awareness_loss(motion_head, captured[0], frames, target, known)
            loss = loss + self.motion_awareness * motion_mse
            metrics["motion_mse"] = float(motion_mse.detach())
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
        from studio.engine.pipelines.wan import fit_token_timesteps

        fit_token_timesteps(pipe.transformer)
        return pipe

    def on_checkpoint(self, out_dir, step):
        """Each checkpoint's eval line (``eval_log.jsonl``: adherence per attribute on
        ``eval_prompts`` held-out prompts per mode of ``eval_modes``, 20 steps) and sample
        grid (``samples/step_NNNNNN.png``: the first eight of those samples per mode, under
        their captions)."""
        from studio.tiny.sampling import adherence_report, write_sample_grid

        kept: dict = {}
        report = adherence_report(self.pipeline(), n=self.eval_prompts, steps=20, seed=step,
                                  modes=getattr(self, "eval_modes", ("t2i",)), keep=kept)
        line = {"step": step, **report}
        with open(out_dir / "eval_log.jsonl", "a") as fh:
            fh.write(json.dumps(line) + "\n")
        write_sample_grid(Path(out_dir) / "samples" / f"step_{step:06d}.png", kept, step=step)
        print(f"[dit] step {step}: {line}", file=sys.stderr, flush=True)
        for m in (self.text_encoder, self.transformer, self.reference_encoder):
            m.train()


SCHEDULER_SHIFT = 2.0


WARM_START_PARTS = (("transformer", "transformer", "diffusion_pytorch_model.safetensors"),
                    ("text_encoder", "text_encoder", "model.safetensors"),
                    ("reference_encoder", "reference_encoder", "model.safetensors"))


@torch.no_grad()
def warm_start(task: DenoiserTask, folder) -> dict[str, dict[str, int]]:
    """Starts ``task``'s denoiser, text encoder and reference encoder (live and EMA copies)
    from the weights of an exported model folder (:func:`studio.tiny.sampling.export_pipeline`)
    wherever a tensor's name and shape match, cast to fp32; the rest keep their fresh
    initialisation. Used to move a trained denoiser onto a new VAE's latent space: with the
    2x VAE the patch embedding and output projection of the denoiser and the reference
    encoder's patch embedding change shape (other patches, other channels) and start fresh,
    while the blocks, time and text embeddings, and the text encoder carry over (a new latent
    space needs new input and output maps; what the blocks learned about captions and layout
    stays useful).

    Args:
        task: a freshly built :class:`DenoiserTask`.
        folder: the exported model folder (``transformer/``, ``text_encoder/`` and optionally
            ``reference_encoder/`` with safetensors).
    Returns:
        Per part, ``{"loaded": n, "fresh": m}``: tensors taken from ``folder`` and tensors
        left at their initialisation.
    Raises:
        ValueError: ``folder`` lacks ``transformer/`` or ``text_encoder/`` weights, or no
            tensor of the transformer matched.
    """
    from pathlib import Path

    from safetensors.torch import load_file

    folder = Path(folder)
    report: dict[str, dict[str, int]] = {}
    targets = {"transformer": (task.transformer, task.ema_transformer),
               "text_encoder": (task.text_encoder, task.ema_text),
               "reference_encoder": (task.reference_encoder, task.ema_reference_encoder)}
    for part, sub, file in WARM_START_PARTS:
        path = folder / sub / file
        if not path.exists():
            if part == "reference_encoder":
                continue
            raise ValueError(f"folder={str(folder)!r}: no {sub}/{file}")
        source = load_file(str(path))
        live, ema = targets[part]
        own = live.state_dict()
        taken = {k: v.float() for k, v in source.items()
                 if k in own and tuple(v.shape) == tuple(own[k].shape)}
        if part == "transformer" and not taken:
            raise ValueError(f"folder={str(folder)!r}: no transformer tensor matches")
        for module in (live, ema):
            module.load_state_dict(taken, strict=False)
        report[part] = {"loaded": len(taken), "fresh": len(own) - len(taken)}
    return report


def insert_bounded(items: list, limit: int, rng: np.random.Generator, new: list) -> None:
    """Adds ``new`` to the pool ``items`` in place: appended while it holds fewer than
    ``limit``, then each replaces a random entry (drawn from ``rng``)."""
    for item in new:
        if len(items) < limit:
            items.append(item)
        else:
            items[int(rng.integers(len(items)))] = item


class LatentPool:
    """Encoded training samples, reused: the VAE encode costs about a third of a denoiser
    step on the CPU, so each step encodes only a few fresh samples into the pool (growing to
    ``max_images`` / ``max_clips``, then replacing random entries) and draws its batch from
    the pool. Scenes (not captions) are stored; each use draws a fresh caption, reference
    anonymisation, first-frame conditioning and caption dropout, as the pixel path does.
    The batch mix (``DenoiserTask.step_kinds``: by default 45 % images, 37 % clips, 18 %
    reference clips) is the pixel path's.

    The pool is not part of a checkpoint (at its cap it holds gigabytes). It is warmed with
    ``warm_images`` / ``warm_clips`` samples at the first batch of a sitting, drawn from
    that step's generator: each sitting (and each phase of a recipe) warms on new scenes,
    where a fixed warm set would be drawn again and again at every restart. ``seed``
    (optional) fixes the warm set instead, for tests. The warm-up runs inside the first
    step, so its time is counted in the run's ``elapsed_s``.
    """

    def __init__(self, task: DenoiserTask, *, warm_images: int = 1024, warm_clips: int = 256,
                 fresh_images: int = 6, fresh_clips: int = 2, max_images: int = 40_000,
                 max_clips: int = 12_000, seed: int | None = None):
        self.task = task
        self.fresh_images, self.fresh_clips = fresh_images, fresh_clips
        self.max_images, self.max_clips = max_images, max_clips
        self.warm_images, self.warm_clips, self.seed = warm_images, warm_clips, seed
        self.images: list[tuple] = []  # (spec, latent (C, 1, h, w))
        self.clips: list[tuple] = []  # (spec, latent (C, f, h, w), reference latent (C, 1, h, w))
        self.warmed = False
        if seed is not None:
            self.warm(np.random.default_rng(seed))

    def warm(self, rng) -> None:
        """Fills the pool with its warm set, drawn from ``rng`` (once)."""
        self.warmed = True
        for _ in range(self.warm_images // 64):
            self._add_images(rng, 64)
        for _ in range(self.warm_clips // 16):
            self._add_clips(rng, 16)

    @torch.no_grad()
    def _add_images(self, rng, n: int) -> None:
        specs = [world.sample_scene(rng, video=False) for _ in range(n)]
        pixels = np.stack([world.render_image(s, SIZE, SIZE, rng) for s in specs])
        z = self.task.encode_pixels(pixels)
        insert_bounded(self.images, self.max_images, rng,
                       [(s, z[i].clone()) for i, s in enumerate(specs)])

    @torch.no_grad()
    def _add_clips(self, rng, n: int) -> None:
        specs = [world.sample_scene(rng, video=True) for _ in range(n)]
        pixels = np.stack([world.render_clip(s, CLIP_FRAMES, SIZE, SIZE, rng) for s in specs])
        refs = np.stack([reference_image(s, rng) for s in specs])
        z, zr = self.task.encode_pixels(pixels), self.task.encode_pixels(refs)
        insert_bounded(self.clips, self.max_clips, rng,
                       [(s, z[i].clone(), zr[i].clone()) for i, s in enumerate(specs)])

    def batch(self, rng):
        if not self.warmed:  # the sitting's first step: a warm set of its own
            self.warm(np.random.default_rng(rng.integers(2**63)))
        self._add_images(rng, self.fresh_images)
        self._add_clips(rng, self.fresh_clips)
        kinds = self.task.step_kinds
        kind = rng.choice(list(kinds), p=list(kinds.values()))
        video = kind != "image"
        items = self.clips if video else self.images
        n = self.task.clip_batch if video else self.task.image_batch
        picked = [items[int(i)] for i in rng.integers(len(items), size=n)]
        captions = [self.task.caption(p[0], rng) for p in picked]
        latents = torch.stack([p[1] for p in picked])
        refs = objects = None
        if kind == "reference":
            refs = torch.stack([p[2] for p in picked])
            captions = [anonymise(c) if rng.random() < 0.7 else c for c in captions]
            objects = [(p[0].objects[0].colour, p[0].objects[0].shape) for p in picked]
        first_frame = (rng.random(n) < 0.4) if kind == "clip" else np.zeros(n, bool)
        drop = rng.random(n) < 0.1
        captions = ["" if d else c for c, d in zip(captions, drop, strict=True)]
        specs = [p[0] for p in picked]
        return DenoiserBatch(captions, latents, refs, first_frame, objects,
                             motion_target=self.task.batch_motion_targets(specs, video, drop),
                             **self.task.batch_covers(specs, video))


def _ridge(x: torch.Tensor, y: torch.Tensor, ridge: float,
           bias: bool = True) -> tuple[torch.Tensor, float]:
    """Least squares ``y ~ [x, 1] @ w`` (``[x] @ w`` without ``bias``) with a ridge
    ``ridge * mean(diag(x^T x))`` (float64): ``w`` ((in + 1), out) or (in, out), and the fit's
    R^2 over every output."""
    x1 = (torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], 1) if bias else x).double()
    gram = x1.T @ x1
    gram += ridge * gram.diagonal().mean() * torch.eye(len(gram), dtype=gram.dtype)
    w = torch.linalg.solve(gram, x1.T @ y.double())
    resid = (y.double() - x1 @ w).pow(2).sum()
    r2 = 1.0 - float(resid / (y.double() - y.double().mean(0)).pow(2).sum())
    return w.float(), r2


def _patches(z: torch.Tensor, p: int, *, channels_last: bool) -> torch.Tensor:
    """Latents (N, C, 1, H, W) -> one row per (1, p, p) patch in token order (row, column):
    (N * H/p * W/p, C * p * p), each row ordered (C, p, p) as a Conv3d patch embedding
    reads it, or (p, p, C) as Wan's ``proj_out`` writes it (``channels_last``)."""
    n, c, f, h, w = z.shape
    z = z.reshape(n, c, f, h // p, p, w // p, p)
    order = (0, 2, 3, 5, 4, 6, 1) if channels_last else (0, 2, 3, 5, 1, 4, 6)
    return z.permute(*order).reshape(n * f * (h // p) * (w // p), c * p * p)


@torch.no_grad()
def fit_latent_maps(task: DenoiserTask, folder, *, images: int = 384, seed: int = 0,
                    ridge: float = 1e-3) -> dict[str, float]:
    """Fits the new input and output maps of a denoiser moved onto a new VAE (after
    :func:`warm_start`) by least squares, so training starts from a model that already
    denoises instead of from fresh maps around trained blocks:

    1. the patch embedding, so that new latents' tokens match the tokens the exported
       model's patch embedding makes of its own VAE's latents of the same world images
       (the blocks then see inputs like those they were trained on);
    2. ``proj_out``, from the features the warm-started model computes on noisy new latents
       (x_t = (1 - s) x_0 + s e, s ~ sigmoid(N(0, 1)), the images' captions) to the
       flow-matching target e - x_0;
    3. when its shape changed too, the reference encoder's patch embedding, as in 1 against
       the exported reference encoder (so its tokens, aligned to the object's words, carry
       over).

    Both are ridge regressions (closed form), written into the live and EMA copies. The
    idea is Net2Net's (Chen et al., ICLR 2016: start a changed network from a function of
    the trained one) with a linear probe's fit where no exact map exists.

    Args:
        task: a :class:`DenoiserTask` on the new VAE, warm-started from ``folder``.
        folder: the exported model folder (its ``vae/`` and ``transformer/``).
        images: world images to fit on (64 tokens each); at least 16.
        seed: the images, captions, noise and noise levels.
        ridge: the ridge, relative to the mean diagonal of the Gram matrix.
    Returns:
        ``{"embedding_r2", "output_r2", "loss_before", "loss_after"}`` (and
        ``"reference_r2"`` when 3 ran): the fits' R^2 and the flow-matching loss (mean
        squared error) on the fitting batch with ``proj_out`` as it was and as fitted.
    Raises:
        ValueError: ``images`` below 16, or ``folder`` lacks ``vae/`` or ``transformer/``.
    """
    from pathlib import Path

    from diffusers import AutoencoderKLWan
    from safetensors.torch import load_file

    if images < 16:
        raise ValueError(f"images={images}: must be at least 16")
    folder = Path(folder)
    weights = folder / "transformer" / "diffusion_pytorch_model.safetensors"
    if not (folder / "vae" / "config.json").exists() or not weights.exists():
        raise ValueError(f"folder={str(folder)!r}: needs vae/ and transformer/ weights")
    device = task.device
    old_vae = AutoencoderKLWan.from_pretrained(folder / "vae", torch_dtype=torch.float32)
    old_vae = old_vae.to(device).eval()
    view = (1, -1, 1, 1, 1)
    old_mean = torch.tensor(old_vae.config.latents_mean, device=device).view(view)
    old_std = torch.tensor(old_vae.config.latents_std, device=device).view(view)
    old = load_file(str(weights))
    w_old = old["patch_embedding.weight"].float().to(device)
    b_old = old["patch_embedding.bias"].float().to(device)
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    specs = [world.sample_scene(rng, video=False) for _ in range(images)]
    pixels = np.stack([world.render_image(sp, SIZE, SIZE, rng) for sp in specs])
    captions = [world.caption(sp, rng) for sp in specs]
    z_new, z_old = [], []
    for i in range(0, images, 64):
        chunk = to_tensor(pixels[i:i + 64], device)
        z_old.append((old_vae.encode(chunk).latent_dist.mode() - old_mean) / old_std)
        z_new.append(task.encode_pixels(pixels[i:i + 64]))
    z_old, z_new = torch.cat(z_old), torch.cat(z_new)
    stride = tuple(w_old.shape[2:])
    tokens_old = torch.nn.functional.conv3d(z_old, w_old, b_old, stride=stride)
    dim = tokens_old.shape[1]
    target = tokens_old.flatten(2).transpose(1, 2).reshape(-1, dim).cpu()
    p = task.transformer.config.patch_size[1]
    w, embedding_r2 = _ridge(_patches(z_new, p, channels_last=False).cpu(), target, ridge)
    embed = {"weight": w[:-1].T.reshape(task.transformer.patch_embedding.weight.shape),
             "bias": w[-1]}
    for module in (task.transformer, task.ema_transformer):
        module.patch_embedding.load_state_dict({k: v.to(device) for k, v in embed.items()})
    reference_r2 = None
    ref_weights = folder / "reference_encoder" / "model.safetensors"
    name = "embeddings.patch_embedding.weight"
    live_ref = dict(task.reference_encoder.named_parameters())
    ref_key = next((k for k in live_ref if k.endswith(name)), None)
    if ref_weights.exists() and ref_key is not None:
        w_ref = load_file(str(ref_weights)).get(name)
        if w_ref is not None and w_ref.shape != live_ref[ref_key].shape:
            # 3. the reference encoder's patches (no bias, as CLIP's): its tokens of a new
            # reference latent match the exported encoder's of the old one
            w_ref = w_ref.float().to(device)
            old_ref = torch.nn.functional.conv2d(z_old[:, :, 0], w_ref, stride=w_ref.shape[-1])
            rows = old_ref.flatten(2).transpose(1, 2).reshape(-1, w_ref.shape[0]).cpu()
            q = live_ref[ref_key].shape[-1]
            w, reference_r2 = _ridge(_patches(z_new, q, channels_last=False).cpu(), rows,
                                     ridge, bias=False)
            fitted = w.T.reshape(live_ref[ref_key].shape).to(device)
            for module in (task.reference_encoder, task.ema_reference_encoder):
                dict(module.named_parameters())[ref_key].copy_(fitted)

    features: list[torch.Tensor] = []
    hook = task.transformer.proj_out.register_forward_pre_hook(
        lambda m, args: features.append(args[0].reshape(-1, args[0].shape[-1]).cpu()))
    targets, errors = [], []
    try:
        for i in range(0, images, 32):
            x0 = z_new[i:i + 32]
            noise = torch.randn(x0.shape, generator=gen).to(device)
            s = torch.sigmoid(torch.randn(len(x0), generator=gen)).to(device)
            xt = (1 - s.view(-1, 1, 1, 1, 1)) * x0 + s.view(-1, 1, 1, 1, 1) * noise
            text = task.encode_text(captions[i:i + 32])
            pred = task.transformer(hidden_states=xt, timestep=s * 1000,
                                    encoder_hidden_states=text, return_dict=False)[0]
            errors.append((pred - (noise - x0)).pow(2).mean().item() * len(x0))
            targets.append(_patches(noise - x0, p, channels_last=True).cpu())
    finally:
        hook.remove()
    feats, targets = torch.cat(features), torch.cat(targets)
    w, output_r2 = _ridge(feats, targets, ridge)
    out = {"weight": w[:-1].T.contiguous(), "bias": w[-1]}
    for module in (task.transformer, task.ema_transformer):
        module.proj_out.load_state_dict({k: v.to(device) for k, v in out.items()})
    fitted = torch.cat([feats, torch.ones(len(feats), 1)], 1) @ w
    return {"embedding_r2": round(embedding_r2, 4), "output_r2": round(output_r2, 4),
            **({} if reference_r2 is None else {"reference_r2": round(reference_r2, 4)}),
            "loss_before": round(sum(errors) / images, 4),
            "loss_after": round(float((fitted - targets).pow(2).mean()), 4)}
