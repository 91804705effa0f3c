"""Cost of the per-step preview (linear latent-to-RGB projection) against a denoising step.

    python -m bench preview [--model embedded] [--size 64] [--frames 9] [--runs 5]

Runs the same request with and without the preview callback and reports the preview's cost
per step, measured directly around the projection, as a fraction of the mean step time.
Goal (issue 2): <= 5 % of a step.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch

from bench.doc import weights_record
from studio.core.request import GenerationRequest
from studio.engine.executor import runner_class
from studio.engine.models.registry import ModelRegistry


def measure(model: str, size: int, frames: int, runs: int, steps: int) -> dict:
    entry = ModelRegistry(include_hf_cache=False).resolve(model)
    runner = runner_class(entry.family)(entry, torch.device("cpu"), torch.float32)
    mode = "t2v" if frames > 1 else "t2i"
    req = GenerationRequest(mode=mode, model=model, prompt="a red circle on grass", seed=0,
                            steps=steps, guidance_scale=4.0, width=size, height=size,
                            num_frames=frames)
    preview_s: list[float] = []
    step_s: list[float] = []
    for _ in range(runs):
        def on_step(i, n, latents):
            t0 = time.perf_counter()
            img = runner.preview(latents)
            preview_s.append(time.perf_counter() - t0)
            assert img.dtype == np.uint8 and max(img.shape[:2]) <= 256

        out = runner.run(req, {}, on_step)
        denoise = out.timings["denoise"]
        step_s.append(denoise / max(steps - 1, 1))
    per_step = float(np.median(step_s))
    per_preview = float(np.median(preview_s))
    return {"model": model, "mode": mode, "size": size, "frames": frames, "steps": steps,
            "step_s": per_step, "preview_s": per_preview,
            "preview_fraction_of_step": per_preview / per_step}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench preview")
    p.add_argument("--model", default="embedded")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    args = p.parse_args(argv)
    rows = [measure(args.model, 64, 1, args.runs, args.steps),
            measure(args.model, 64, 9, args.runs, args.steps)]
    result = {"command": "python -m bench preview " + " ".join(argv or []),
              "date": time.strftime("%Y-%m-%d"), "machine": platform.processor() or
              platform.machine(), "torch_threads": torch.get_num_threads(),
              "weights": weights_record(), "rows": rows}
    out = Path(__file__).parent / "results" / f"{time.strftime('%Y-%m-%d')}-preview.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    for r in rows:
        print(f"{r['mode']} {r['size']}px x{r['frames']}: step {r['step_s'] * 1e3:.2f} ms, "
              f"preview {r['preview_s'] * 1e3:.3f} ms = "
              f"{100 * r['preview_fraction_of_step']:.1f}% of a step")
    print(f"wrote {out}")
    return 0
