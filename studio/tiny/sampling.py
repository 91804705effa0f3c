"""Sampling the embedded model during training, scoring its adherence, and exporting it.

Sampling always goes through diffusers' own Wan pipelines, so what training measures is what
the engine runs.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch

from studio.tiny import evaluate, world


def t2x_pipeline(pipe):
    """A WanPipeline over the same modules as ``pipe`` (text-to-image and -video)."""
    from diffusers import WanPipeline

    from studio.engine.pipelines.base import derive_pipeline

    return derive_pipeline(WanPipeline, pipe)


@torch.no_grad()
def generate(pipe, captions: list[str], *, frames: int = 1, steps: int = 20,
             guidance: float = 4.0, seed: int = 0, size: int = 64) -> np.ndarray:
    """uint8 (B, H, W, 3) for ``frames == 1``, else (B, F, H, W, 3)."""
    t2x = t2x_pipeline(pipe)
    from studio.tiny.denoiser import TEXT_LEN

    gens = [torch.Generator().manual_seed(seed + i) for i in range(len(captions))]
    out = t2x(prompt=captions, negative_prompt=[""] * len(captions), height=size, width=size,
              num_frames=frames, num_inference_steps=steps, guidance_scale=guidance,
              generator=gens, output_type="np", max_sequence_length=TEXT_LEN).frames
    out = (np.clip(np.asarray(out), 0, 1) * 255).round().astype(np.uint8)
    return out[:, 0] if frames == 1 else out


def adherence_report(pipe, *, n: int = 32, steps: int = 20, seed: int = 0,
                     modes: tuple[str, ...] = ("t2i",),
                     keep: dict[str, tuple[list[str], np.ndarray]] | None = None
                     ) -> dict[str, float]:
    """Per-attribute accuracy on ``n`` held-out prompts per mode, flattened for a log line.

    Args:
        keep: when given, receives each mode's first batch as ``{mode: (captions, pixels)}``
            (uint8 (B, H, W, 3) images or (B, F, H, W, 3) clips), e.g. for
            :func:`write_sample_grid`.
    """
    out: dict[str, float] = {}
    for mode in modes:
        frames = 9 if mode == "t2v" else 1

        def sample(caps, fr=frames, mode=mode):
            pixels = generate(pipe, caps, frames=fr, steps=steps, seed=seed)
            if keep is not None and mode not in keep:
                keep[mode] = (list(caps), pixels)
            return pixels

        report = evaluate.score_mode(sample, mode, n=n, seed=seed, batch_size=16)
        out.update({f"{mode}_{k}": round(v, 3) for k, v in report.accuracy.items()})
        out.update({f"{mode}_position_{k}": round(v, 3)
                    for k, v in evaluate.position_axes(report).items()})
    return out


def export_pipeline(task, dest: Path, step: int | None = None,
                    total_steps: int | None = None,
                    eval_log: str = "training/tiny/dit/eval_log.jsonl") -> Path:
    """Saves the EMA weights as a diffusers folder (fp16 safetensors; the reference encoder,
    when the task has one, in ``reference_encoder/``, named by ``reference_tokens``) plus
    ``studio.json``
    (whose description names the training step, when given, and ``eval_log``, the committed
    eval lines of the run), replacing ``dest`` whole.
    The step cache calibration in ``studio.json`` belongs to the old weights and is dropped:
    run ``python -m bench calibrate --write`` after exporting."""
    pipe = task.pipeline(ema=True)
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    for module in (pipe.text_encoder, pipe.transformer, pipe.vae):
        module.to(torch.float16)
    pipe.save_pretrained(tmp, safe_serialization=True)
    ref_encoder = getattr(task, "ema_reference_encoder", None)
    if ref_encoder is not None:  # reference-to-video's tokens (see DenoiserTask)
        import copy

        copy.deepcopy(ref_encoder).to(torch.float16).save_pretrained(
            tmp / "reference_encoder", safe_serialization=True)
    from studio.tiny.autoencoder import CLIP_FRAMES, SIZE
    from studio.tiny.denoiser import TEXT_LEN

    trained = "" if step is None else (
        f" Weights of training step {step}" + (f" of {total_steps}" if total_steps else "")
        + f"; adherence per attribute in {eval_log}.")
    (tmp / "studio.json").write_text(json.dumps({
        "description": "The embedded model: a tiny Wan-architecture model trained on the "
                       "synthetic world of studio/tiny/world.py (python -m studio.tiny.train)."
                       + trained,
        "training_step": step,
        "capabilities": {"default_width": SIZE, "default_height": SIZE,
                         "default_frames": CLIP_FRAMES, "default_fps": 8.0,
                         "default_steps": 20, "default_guidance": 4.0, "max_size": 128,
                         "max_pixels": 128 * 128, "max_frames": 17, "max_references": 1},
        "call_kwargs": {"max_sequence_length": TEXT_LEN},
        "reference_frames": "append",
        **({"reference_tokens": "reference_encoder"} if ref_encoder is not None else {}),
    }, indent=2) + "\n")
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)
    return dest


def _wrap(text: str, width: int = 26, lines: int = 4) -> tuple[str, ...]:
    """``text`` in at most ``lines`` lines of ``width`` characters, the last ending in " …"
    when the caption goes on (so a cut caption is never read as a whole one)."""
    import textwrap

    return tuple(textwrap.wrap(text, width, max_lines=lines, placeholder=" …",
                               break_on_hyphens=False))


def write_sample_grid(path: Path, kept: dict[str, tuple[list[str], np.ndarray]], *,
                      step: int, per_mode: int = 8, cell: int = 160) -> Path:
    """Writes a training checkpoint's sample grid: the first ``per_mode`` samples of each
    mode in ``kept`` (:func:`adherence_report`'s ``keep``), each under its caption; a clip is
    shown as its first, middle and last frames side by side. A PNG contact sheet
    (:func:`studio.store.contact_sheet.write_contact_sheet`, written atomically) whose text
    chunk lists each cell's mode, caption and training step.

    Raises:
        ValueError: ``kept`` holds no samples.
    """
    from studio.store.contact_sheet import SheetItem, key_frame_strip, write_contact_sheet

    items = []
    for mode, (captions, pixels) in kept.items():
        for caption, px in list(zip(captions, pixels, strict=True))[:per_mode]:
            if px.ndim == 4:  # a clip (F, H, W, 3): first | middle | last
                px = key_frame_strip(px)
            items.append(SheetItem(px, (f"{mode}, step {step}", *_wrap(caption)),
                                   {"mode": mode, "prompt": caption, "training_step": step}))
    if not items:
        raise ValueError("kept: no samples to draw")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return write_contact_sheet(path, items, cell)


__all__ = ["adherence_report", "export_pipeline", "generate", "world", "write_sample_grid"]
