"""``python -m bench precision``: each low-precision setting of the denoiser against float32.

On the embedded model (text-to-image 64x64 and text-to-video 64x64x9, 20 steps, CFG), in one
process: for each precision of :mod:`studio.engine.precision`, the stock diffusers pipeline
with its denoiser transformed: end-to-end latency (median of ``--runs``), the denoiser's
weight bytes, peak RSS above the start of the run, and PSNR / SSIM of the uint8 output
against the float32 output of the same seed. Settings the device cannot run are listed with
the reason. Writes ``bench/results/<date>-precision-<device>.json`` and the table into
``docs/PERFORMANCE.md``.

    python -m bench precision [--runs 5] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import time

import numpy as np
import torch

from bench.cpu import EMBEDDED, ROOT, PeakRss, psnr_ssim
from bench.doc import weights_record, write_block

PROMPTS = ["a small red star in the top left corner on a grass background",
           "a large blue circle in the center on a sky background"]


def main(argv: list[str]) -> int:
    from diffusers import DiffusionPipeline, WanPipeline

    from studio.engine.memory import module_bytes
    from studio.engine.pipelines.base import derive_pipeline
    from studio.engine.pipelines.wan import fit_token_timesteps
    from studio.engine.precision import PRECISIONS, apply_precision, precision_supported

    ap = argparse.ArgumentParser(prog="python -m bench precision")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--no-doc", action="store_true", help="do not update PERFORMANCE.md")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs: must be at least 1")
    device = torch.device(args.device)
    base = DiffusionPipeline.from_pretrained(EMBEDDED, local_files_only=True).to(device)
    studio = json.loads((EMBEDDED / "studio.json").read_text())
    text_len = studio.get("call_kwargs", {}).get("max_sequence_length", 32)
    original = base.transformer
    rows, reference = [], {}
    for precision in PRECISIONS:
        reason = precision_supported(precision, device)
        if reason is not None:
            rows.append({"precision": precision, "status": reason})
            print(f"{precision:<14} skipped: {reason}", flush=True)
            continue
        transformer = copy.deepcopy(original)
        note = apply_precision(transformer, precision, device)
        base.transformer = transformer
        pipe = derive_pipeline(WanPipeline, base, expand_timesteps=base.config.expand_timesteps)
        fit_token_timesteps(transformer)  # as the Wan runner does (patch 4 on a 2x VAE)
        pipe.set_progress_bar_config(disable=True)
        for mode, frames in (("t2i", 1), ("t2v", 9)):
            def run(pipe=pipe, frames=frames):
                gens = [torch.Generator().manual_seed(i) for i in range(len(PROMPTS))]
                out = pipe(prompt=PROMPTS, negative_prompt=[""] * len(PROMPTS), height=64,
                           width=64, num_frames=frames, num_inference_steps=20,
                           guidance_scale=4.0, generator=gens, output_type="np",
                           max_sequence_length=text_len).frames
                return (np.clip(np.asarray(out), 0, 1) * 255).round().astype(np.uint8)

            times, peak = [], 0
            with torch.inference_mode():
                for _ in range(args.runs):
                    with PeakRss() as rss:
                        t0 = time.perf_counter()
                        out = run()
                        if device.type == "cuda":
                            torch.cuda.synchronize()
                        times.append(time.perf_counter() - t0)
                    peak = max(peak, rss.peak)
            if precision == "as-loaded":
                reference[mode] = out
            psnr, ssim = psnr_ssim(out, reference[mode])
            row = {"precision": precision, "mode": mode, "latency_s": statistics.median(times),
                   "denoiser_mb": module_bytes(transformer) / 2**20,
                   "peak_rss_mb": peak / 2**20, "psnr_db": psnr, "ssim": ssim, "note": note}
            rows.append(row)
            print(f"{precision:<14} {mode} {row['latency_s']:.3f}s weights "
                  f"{row['denoiser_mb']:.1f} MB PSNR {psnr:.1f} SSIM {ssim:.4f}", flush=True)
    base.transformer = original
    for row in rows:
        if "latency_s" in row:
            ref = next(r for r in rows if r.get("precision") == "as-loaded"
                       and r["mode"] == row["mode"])
            row["speedup"] = ref["latency_s"] / row["latency_s"]
    command = "python -m bench precision " + " ".join(argv)
    result = {"command": command.strip(), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
              "device": str(device), "machine": platform.platform(),
              "torch_threads": torch.get_num_threads(),
              "model": studio.get("description", ""), "weights": weights_record(EMBEDDED),
              "rows": rows}
    out_dir = ROOT / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{time.strftime('%Y-%m-%d')}-precision-{device.type}.json"
    path.write_text(json.dumps(result, indent=1))
    table = markdown(rows, result)
    print(table)
    if not args.no_doc:
        write_doc(table)
    print(f"wrote {path}")
    return 0


def markdown(rows: list[dict], result: dict) -> str:
    lines = [f"Command: `{result['command']}` on {result['device']} "
             f"({result['torch_threads']} threads), {result['date']}; model: "
             f"{result['model'] or 'embedded'}.", "",
             "| precision | mode | latency | vs float32 | denoiser weights | peak RSS | PSNR dB | "
             "SSIM |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "latency_s" not in r:
            lines.append(f"| {r['precision']} | | | | | | | not run: {r['status']} |")
            continue
        psnr = "∞" if r["psnr_db"] == float("inf") else f"{r['psnr_db']:.1f}"
        lines.append(f"| {r['precision']} | {r['mode']} | {r['latency_s'] * 1000:.0f} ms | "
                     f"×{r['speedup']:.2f} | {r['denoiser_mb']:.1f} MB | "
                     f"{r['peak_rss_mb']:.0f} MB | {psnr} | {r['ssim']:.4f} |")
    return "\n".join(lines)


def write_doc(table: str) -> None:
    write_block("precision", table, "Low-precision weights (`python -m bench precision`)")
