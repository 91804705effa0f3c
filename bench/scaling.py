"""``python -m bench scaling``: a scaling model for one job over 2, 4 and 8 H200s per
parallel scheme, from per-step compute and the bytes each scheme moves per step.

Inputs, each stated in the output:

* per-step compute on one GPU: FLUX.1-dev at 1024² from xDiT's published one-H100 eager
  figure (6.71 s for 28 steps; H200 has the same GH100 compute, more memory bandwidth).
  When ``bench/gpu/run.sh`` has measured our own step time, pass it with ``--flux-step-s``.
  Other workloads are scaled from it by their counted FLOPs (same achieved FLOP rate).
* FLOPs: linear layers 2 × tokens × parameters per block (parameters counted on the real
  diffusers class, built on the meta device), attention 4 × tokens² × hidden per layer.
* bytes per step, per rank: Ulysses all-to-alls of q, k, v and the output of every
  attention layer (each rank keeps 1/n of what it hands in); ring: (n − 1) key/value
  blocks per layer, sent point to point; CFG: one all-gather of the denoiser output per
  step. These formulas are the ones the gloo tests check against the bytes really handed to
  the collectives (:mod:`studio.engine.parallel.comm`).
* link: NVLink 4 on H200, 450 GB/s per direction, at ``--link-efficiency`` (0.8).
* overlap: diffusers' Ulysses all-to-alls are synchronous (fully exposed); our ring sends
  the next key/value block while the current one is attended (exposed only where a block's
  transfer outlasts its attention); diffusers' own ring all-gathers first (exposed).
* the compute split is ideal (1/n of the step per rank); text encoding and VAE decode are
  left out (not split by these schemes).

Beside it: xDiT's published FLUX.1-dev figures (one H100: 6.71 s eager; four H100 with
Ulysses 4 and torch.compile: 1.63 s). Source: Fang et al., "xDiT: an Inference Engine for
Diffusion Transformers (DiTs) with Massive Parallelism", 2024, and its README's FLUX table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

XDIT_FLUX_ONE_H100_S = 6.71
XDIT_FLUX_FOUR_H100_ULYSSES_COMPILE_S = 1.63
XDIT_FLUX_STEPS = 28
NVLINK_GBPS = 450.0  # H200 NVLink 4: 900 GB/s bidirectional per GPU


@dataclass(frozen=True)
class Workload:
    """One denoising job's shape.

    Attributes:
        name: what it is.
        layers: attention layers per denoiser call.
        tokens: sequence length of each attention (image/video + text for joint attention).
        hidden: heads × head dim.
        heads: attention heads (Ulysses needs them divisible by its degree).
        block_params: parameters per attention layer's block (for the linear FLOPs).
        steps: denoising steps.
        calls_per_step: 2 with classifier-free guidance, else 1.
        output_elements: elements of one denoiser output (what CFG parallel exchanges).
    """

    name: str
    layers: int
    tokens: int
    hidden: int
    heads: int
    block_params: float
    steps: int
    calls_per_step: int
    output_elements: int

    def flops_per_call(self) -> tuple[float, float]:
        """(linear FLOPs, attention FLOPs) of one denoiser call."""
        linear = 2.0 * self.tokens * self.block_params * self.layers
        attention = 4.0 * self.tokens ** 2 * self.hidden * self.layers
        return linear, attention


def ulysses_bytes_per_attention(batch: int, tokens: int, hidden: int, degree: int,
                                dtype_bytes: int) -> int:
    """Bytes one rank hands to Ulysses' all-to-alls in one attention: q, k, v and the output,
    each its shard of batch × tokens/degree × hidden (of which (degree−1)/degree leaves it)."""
    return 4 * batch * (tokens // degree) * hidden * dtype_bytes


def ring_bytes_per_attention(batch: int, tokens: int, hidden: int, degree: int,
                             dtype_bytes: int) -> int:
    """Bytes one rank sends in one ring attention: its key and value block, degree−1 times."""
    return (degree - 1) * 2 * batch * (tokens // degree) * hidden * dtype_bytes


def _count_params(model_cls, blocks: list[str], **config) -> tuple[float, dict]:
    import torch

    with torch.device("meta"):
        model = model_cls(**config)
    total = 0
    for name in blocks:
        for block in getattr(model, name):
            total += sum(p.numel() for p in block.parameters())
    layers = sum(len(getattr(model, n)) for n in blocks)
    return total / layers, dict(model.config)


def workloads() -> list[Workload]:
    """FLUX.1-dev 1024² (28 steps, guidance-distilled: one call per step) and Wan 2.1 14B
    720p × 81 frames (50 steps with CFG), shapes from the real diffusers classes."""
    from diffusers import FluxTransformer2DModel, WanTransformer3DModel

    per_block, flux = _count_params(FluxTransformer2DModel,
                                    ["transformer_blocks", "single_transformer_blocks"])
    flux_hidden = flux["num_attention_heads"] * flux["attention_head_dim"]
    image_tokens = (1024 // 16) ** 2  # 8× VAE, 2×2 patches
    out = [Workload("FLUX.1-dev 1024² (28 steps)", flux["num_layers"] + flux["num_single_layers"],
                    image_tokens + 512, flux_hidden, flux["num_attention_heads"], per_block,
                    XDIT_FLUX_STEPS, 1, image_tokens * 64)]
    per_block, wan = _count_params(WanTransformer3DModel, ["blocks"], num_layers=40,
                                   num_attention_heads=40, attention_head_dim=128,
                                   ffn_dim=13824)
    frames, height, width = (81 - 1) // 4 + 1, 720 // 16, 1280 // 16  # 4×8×8 VAE, 1×2×2
    tokens = frames * height * width
    out.append(Workload("Wan 2.1 14B 720p × 81 frames (50 steps, CFG)", 40, tokens, 40 * 128,
                        40, per_block, 50, 2, tokens * 16 * 4))
    return out


SCHEMES = ("ulysses", "ring (ours, overlapped)", "ring (all-gather)", "cfg", "cfg × ulysses",
           "cfg × ring (ours, overlapped)")


def predict(work: Workload, scheme: str, n: int, call_s: float, attention_share: float,
            link_gbps: float, dtype_bytes: int = 2) -> dict | None:
    """Seconds per step on ``n`` GPUs under ``scheme`` (None where it does not apply)."""
    cfg = 2 if scheme.startswith("cfg") else 1
    seq = n // cfg
    if cfg == 2 and work.calls_per_step != 2:
        return None
    if scheme == "cfg" and n != 2:
        return None
    if "ulysses" in scheme and (seq < 2 or work.heads % seq):
        return None
    if "ring" in scheme and seq < 2:
        return None
    calls_per_rank = work.calls_per_step // cfg
    compute = call_s * calls_per_rank / seq
    link = link_gbps * 1e9
    exposed = 0.0
    moved = 0
    if "ulysses" in scheme:
        per_attn = ulysses_bytes_per_attention(1, work.tokens, work.hidden, seq, dtype_bytes)
        moved += per_attn * work.layers * calls_per_rank
        exposed += moved * (seq - 1) / seq / link
    elif "ring" in scheme:
        per_attn = ring_bytes_per_attention(1, work.tokens, work.hidden, seq, dtype_bytes)
        moved += per_attn * work.layers * calls_per_rank
        if "overlapped" in scheme:
            block_transfer = per_attn / (seq - 1) / link
            block_attention = call_s * attention_share / work.layers / seq / seq
            exposed += max(0.0, block_transfer - block_attention) * (seq - 1) * \
                work.layers * calls_per_rank
        else:
            exposed += moved / link
    if cfg == 2:  # one all-gather of the output per step
        gather = work.output_elements * dtype_bytes
        moved += gather
        exposed += gather / link
    step = compute + exposed
    return dict(step_s=step, compute_s=compute, exposed_comm_s=exposed,
                bytes_per_step=moved)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench scaling")
    ap.add_argument("--flux-step-s", type=float, default=XDIT_FLUX_ONE_H100_S / XDIT_FLUX_STEPS,
                    help="one GPU's FLUX.1-dev 1024² step time, s (default: xDiT's H100)")
    ap.add_argument("--link-efficiency", type=float, default=0.8)
    ap.add_argument("--out", default=f"bench/results/{time.strftime('%Y-%m-%d')}-scaling.json")
    args = ap.parse_args(argv)
    link = NVLINK_GBPS * args.link_efficiency
    works = workloads()
    flux_flops = sum(works[0].flops_per_call())
    rate = flux_flops / args.flux_step_s  # achieved FLOP/s, carried to the other workloads
    rows = []
    for work in works:
        linear, attention = work.flops_per_call()
        call_s = (linear + attention) / rate
        share = attention / (linear + attention)
        one = call_s * work.calls_per_step
        rows.append(dict(workload=work.name, scheme="one GPU", gpus=1, step_s=one,
                         total_s=one * work.steps, speedup=1.0, exposed_comm_s=0.0,
                         bytes_per_step=0))
        for n in (2, 4, 8):
            for scheme in SCHEMES:
                p = predict(work, scheme, n, call_s, share, link)
                if p is None:
                    continue
                label = scheme if scheme == "cfg" else f"{scheme} {n // (2 if scheme.startswith('cfg') else 1)}"
                rows.append(dict(workload=work.name, scheme=label, gpus=n, step_s=p["step_s"],
                                 total_s=p["step_s"] * work.steps, speedup=one / p["step_s"],
                                 exposed_comm_s=p["exposed_comm_s"],
                                 bytes_per_step=p["bytes_per_step"]))
    lines = ["| workload | scheme | GPUs | s / step | job s | speed-up | exposed comm / step | "
             "GB sent / rank / step |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['workload']} | {r['scheme']} | {r['gpus']} | {r['step_s']:.3f} | "
                     f"{r['total_s']:.2f} | ×{r['speedup']:.2f} | "
                     f"{r['exposed_comm_s'] * 1e3:.1f} ms | {r['bytes_per_step'] / 1e9:.2f} |")
    lines.append(f"| FLUX.1-dev 1024² (xDiT, published) | one H100, eager | 1 | "
                 f"{XDIT_FLUX_ONE_H100_S / XDIT_FLUX_STEPS:.3f} | {XDIT_FLUX_ONE_H100_S:.2f} | "
                 f"×1.00 | | |")
    lines.append(f"| FLUX.1-dev 1024² (xDiT, published) | Ulysses 4 + torch.compile, H100 | 4 | "
                 f"{XDIT_FLUX_FOUR_H100_ULYSSES_COMPILE_S / XDIT_FLUX_STEPS:.3f} | "
                 f"{XDIT_FLUX_FOUR_H100_ULYSSES_COMPILE_S:.2f} | "
                 f"×{XDIT_FLUX_ONE_H100_S / XDIT_FLUX_FOUR_H100_ULYSSES_COMPILE_S:.2f} | | |")
    table = "\n".join(lines)
    print(table)
    result = dict(command="python -m bench scaling " + " ".join(argv or []),
                  inputs=dict(flux_step_s=args.flux_step_s, link_gbps=link,
                              achieved_tflops=rate / 1e12,
                              workloads=[asdict(w) for w in works]),
                  rows=rows, table=table)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
