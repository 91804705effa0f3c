"""``python -m bench.gpu.engine``: the engine's GPU levers on full-size denoisers, timed.

Random-weight Wan 2.1 (14B config: 40 layers, 40 heads x 128, ffn 13824; 480p x 81 frames,
32,760 tokens) and FLUX.1 (12B, FLUX.1-dev config, 1024², 4,096 + 512 tokens) transformers
built directly on the GPU in bf16; one denoiser forward (one denoising step of one CFG
branch) each, timed with CUDA events (median), for:

* attention: PyTorch SDPA (stock) vs our kernels routed in by ``studio.engine.attention``
  (``flash``, ``sage``; ``sparse`` on the video model), output cosine similarity to stock;
* fused block ops (:mod:`studio.engine.fused_blocks`: AdaLN norm, QK-norm + RoPE, gated
  residual in Wan blocks);
* precision: our fp8-rowwise linears (studio.kernels.fp8_linear + torch._scaled_mm) alone and
  with our attention and fused block ops: "ours", the per-step figure of issue 7, whose
  targets (Wan >= 1.4x, Flux >= 1.5x stock bf16; no caching) are printed beside it with
  PASS/FAIL; then torchao's fp8-dynamic (int8-dynamic below Hopper), the library baseline;
* the step cache's overhead on a full step (hooks on, threshold 0: must be ~free);
* the parallel code path at degree 1 (a 1-rank group: mesh, per-step cancel all-reduce and
  host sync), which must cost ≤ 3% of a step.

Quality of these levers on a *trained* model is measured on the embedded model
(``python -m bench cpu`` / ``precision``); random weights only give speed and numerical
agreement. ``--cpu-smoke`` runs tiny configs on the CPU to check the script itself.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time

import torch

from bench.gpu import seconds_left

T0 = time.perf_counter()
#: seconds before the run's deadline ($STUDIO_GPU_DEADLINE, bench/gpu/run.sh) past which a
#: kind of row is skipped: the optional rows first, then the compile rows (tens of seconds
#: each on a 12-14B model), then everything, so the run ends with its JSON written
RESERVE_S = {"optional": 70.0, "compile": 110.0, "any": 15.0}


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def cuda_time(fn, device: torch.device, reps: int = 5, warm: bool = False) -> float:
    """Median seconds of ``reps`` calls of ``fn()``, after one warm-up call unless ``warm``
    (the caller has just called it)."""
    if not warm:
        fn()
    if device.type != "cuda":
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return sorted(times)[len(times) // 2]
    torch.cuda.synchronize(device)
    times = []
    for _ in range(reps):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


# Issue 7's per-step targets for "ours" (our attention kernels + fp8 GEMMs, no caching).
PER_STEP_TARGETS = {"wan": 1.4, "flux": 1.5}


def model_names(smoke: bool) -> list[str]:
    # Flux first: it is the quicker model, so its rows land even if the Wan ones overrun.
    return ["flux-tiny", "wan-tiny"] if smoke else ["flux-12b 1024²", "wan-14b 480p x81"]


def build(name: str, device: torch.device):
    """(model, inputs) for one of :func:`model_names`, built on ``device`` (bf16 on CUDA) so
    that a full-size model never exists in float32 on the host."""
    from diffusers import FluxTransformer2DModel, WanTransformer3DModel

    smoke = name.endswith("tiny")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        prev = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            if name.startswith("wan") and smoke:
                model = WanTransformer3DModel(num_attention_heads=2, attention_head_dim=64,
                                              in_channels=16, out_channels=16, text_dim=64,
                                              freq_dim=64, ffn_dim=128, num_layers=2,
                                              cross_attn_norm=True,
                                              qk_norm="rms_norm_across_heads").eval()
                lat, text = (16, 3, 8, 12), 16
            elif name.startswith("wan"):  # Wan 2.1 T2V 14B
                model = WanTransformer3DModel(num_attention_heads=40, attention_head_dim=128,
                                              in_channels=16, out_channels=16, text_dim=4096,
                                              freq_dim=256, ffn_dim=13824, num_layers=40,
                                              cross_attn_norm=True,
                                              qk_norm="rms_norm_across_heads").eval()
                lat, text = (16, 21, 60, 104), 512  # 480x832, 81 frames: 32,760 tokens
            elif smoke:
                model = FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=1,
                                               num_single_layers=1, attention_head_dim=64,
                                               num_attention_heads=2, joint_attention_dim=32,
                                               pooled_projection_dim=32, guidance_embeds=True,
                                               axes_dims_rope=(16, 24, 24)).eval()
                tokens, text = 64, 16
            else:
                model = FluxTransformer2DModel(guidance_embeds=True).eval()  # FLUX.1-dev
                tokens, text = 4096, 512
        finally:
            torch.set_default_dtype(prev)
    g = torch.Generator(device="cpu").manual_seed(1)

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(device, dtype)

    if name.startswith("wan"):
        return model, dict(hidden_states=rand(1, *lat),
                           timestep=torch.tensor([500.0], device=device),
                           encoder_hidden_states=rand(1, text, model.config.text_dim),
                           return_dict=False)
    fc = model.config
    return model, dict(hidden_states=rand(1, tokens, fc.in_channels),
                       encoder_hidden_states=rand(1, text, fc.joint_attention_dim),
                       pooled_projections=rand(1, fc.pooled_projection_dim),
                       timestep=torch.tensor([0.5], device=device, dtype=dtype),
                       img_ids=torch.zeros(tokens, 3, device=device),
                       txt_ids=torch.zeros(text, 3, device=device),
                       guidance=torch.tensor([3.5], device=device, dtype=dtype),
                       return_dict=False)


def degree_one_rank_group(device: torch.device):
    """What a rank-group worker adds to each step when its plan has degree 1: a 1-rank
    process group (NCCL/gloo) with the (cfg, ring, ulysses) mesh, and per step the cancel
    check. With one rank the worker reads its cancel flag without a collective (there is no
    one to agree with); the 4-byte all-reduce and host sync it does with 2+ ranks are timed
    too (``per_step(collective=True)``). Returns that per-step call."""

    import torch.distributed as dist

    from studio.engine.parallel import ParallelConfig
    from studio.engine.parallel.launch import free_port, init_loopback_group
    from studio.engine.parallel.mesh import ParallelMesh

    if not dist.is_initialized():
        init_loopback_group("nccl" if device.type == "cuda" else "gloo", 0, 1, free_port(),
                            60.0)
        ParallelMesh.build(ParallelConfig())
    flag = torch.zeros(1, dtype=torch.int32, device=device)

    def per_step(collective: bool = False) -> None:
        if not collective:
            flag.fill_(0)  # the shared-memory flag read, as the 1-rank worker does
            return
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        flag.item()

    return per_step


def profile_forward(label: str, fwd, device: torch.device, path: str = "") -> str:
    """The top GPU kernels of one ``fwd()`` by self device time (torch.profiler), as text;
    also appended to ``path`` when given."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA]
                                           if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        fwd()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    events = prof.key_averages()
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    try:
        table = events.table(sort_by=key, row_limit=14, max_name_column_width=70)
    except Exception:  # older spellings
        table = events.table(sort_by="self_cuda_time_total" if device.type == "cuda"
                             else "self_cpu_time_total", row_limit=14)
    text = f"### profile: {label}\n{table}\n"
    if path:
        with open(path, "a") as fh:
            fh.write(text)
    return text


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.float().flatten(), b.float().flatten(),
                                                       dim=0))


def main(argv: list[str] | None = None) -> int:
    from studio.engine import attention as attention_module
    from studio.engine import fused_blocks
    from studio.engine.attention import AttentionConfig, apply_attention, remove_attention
    from studio.engine.caching import StepCacheConfig, apply_step_cache, remove_step_cache
    from studio.engine.compile import compile_denoiser, uncompile_denoiser
    from studio.engine.precision import (
        apply_fp8_rowwise,
        apply_precision,
        precision_supported,
    )
    from studio.kernels.sage_attention.op import use_fast_exp

    ap = argparse.ArgumentParser(prog="python -m bench.gpu.engine")
    ap.add_argument("--cpu-smoke", action="store_true")
    ap.add_argument("--json", default="")
    ap.add_argument("--reps", type=int, default=3,
                    help="timed forwards per figure (median); 2 on the 14B model")
    ap.add_argument("--profile", default="",
                    help="write torch.profiler's top kernels of one video-model forward, "
                         "stock and with sage attention, to this file")
    ap.add_argument("--budget-s", type=float, default=260.0,
                    help="past this many seconds the optional rows (dense flash, fused ops "
                         "alone, step cache, rank group) are skipped; stock and 'ours' run")
    ap.add_argument("--compile-budget-s", type=float, default=200.0,
                    help="past this many seconds the regional torch.compile rows are skipped")
    args = ap.parse_args(argv)
    import logging

    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    device = torch.device("cpu" if args.cpu_smoke or not torch.cuda.is_available() else "cuda")
    # ours first (the "ours" rows), then torchao's, the library baseline, in the same run
    precisions = (["fp8-rowwise", "fp8-dynamic"]
                  if precision_supported("fp8-rowwise", device) is None
                  else ["fp8-dynamic"] if precision_supported("fp8-dynamic", device) is None
                  else ["int8-dynamic"])
    if device.type == "cpu":  # --cpu-smoke: ours on the CPU's torch._scaled_mm, then torchao
        precisions = ["fp8-rowwise", "int8-dynamic"]

    def apply(model, precision):
        if precision == "fp8-rowwise" and device.type == "cpu":
            return f"{apply_fp8_rowwise(model)} block linears in fp8 row-wise (CPU smoke)"
        return apply_precision(model, precision, device)

    rows = []

    def out_of_time(kind: str) -> bool:
        """Whether a row of this kind ("optional", "compile", "any") is past its budget: this
        stage's own (--budget-s, --compile-budget-s) or the run's deadline."""
        elapsed = time.perf_counter() - T0
        own = {"optional": args.budget_s, "compile": args.compile_budget_s}.get(kind)
        return (own is not None and elapsed > own) or seconds_left() < RESERVE_S[kind]

    def save_json():
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"device": torch.cuda.get_device_name(device)
                           if device.type == "cuda" else "cpu", "rows": rows}, fh, indent=1)

    def compiled_row(model, name, lever, fwd, stock, base_s, target=None):
        """The model as it stands, its repeated blocks under regional torch.compile (the
        compile is paid in the warm-up call), then uncompiled again."""
        if out_of_time("compile"):
            rows.append(dict(model=name, lever=lever, error="skipped: time budget"))
            log(f"{name}: {lever} skipped (compile time budget)")
            save_json()
            return
        try:
            # --cpu-smoke: dynamo's eager backend checks the path in seconds
            note = compile_denoiser(model, backend="inductor" if device.type == "cuda"
                                    else "eager")
            row = timed(name, lever, fwd, stock, base_s, note=note)
            if "ms" in row and target:
                row["note"] += (f"; issue 7 target x{target:.1f}: "
                                f"{'PASS' if row['speedup'] >= target else 'FAIL'}")
        except Exception as exc:  # compile failures are a finding, not a stop
            rows.append(dict(model=name, lever=lever,
                             error=f"{type(exc).__name__}: {str(exc)[:200]}"))
        finally:
            save_json()
            uncompile_denoiser(model)
            torch._dynamo.reset()

    def timed(name, lever, fwd, stock, base_s, optional=False, **extra):
        if out_of_time("optional" if optional else "any"):
            rows.append(dict(model=name, lever=lever, error="skipped: time budget"))
            log(f"{name}: {lever} skipped (time budget)")
            save_json()
            return rows[-1]
        reps = 2 if "14b" in name else args.reps
        broken_before = set(attention_module._BROKEN)
        try:
            out = fwd().clone()  # also the warm-up
            seconds = cuda_time(fwd, device, reps, warm=True)
            row = dict(model=name, lever=lever, ms=seconds * 1e3, speedup=base_s / seconds,
                       cosine=cosine(out, stock), **extra)
            if "calls" in row:  # a snapshot of the live counter: which path really ran
                row["calls"] = dict(row["calls"])
            log(f"{name}: {lever} {seconds * 1e3:.1f} ms cos {row['cosine']:.5f}")
        except Exception as exc:  # report and go on: device time is scarce
            row = dict(model=name, lever=lever, error=f"{type(exc).__name__}: {str(exc)[:200]}")
            log(f"{name}: {lever} failed: {row['error']}")
        newly_broken = attention_module._BROKEN - broken_before
        if newly_broken:  # the router fell back to SDPA: this row did not time our kernel
            row = dict(model=name, lever=lever,
                       error=f"kernel {', '.join(sorted(newly_broken))} failed; SDPA ran "
                             f"(see the log)")
            log(f"{name}: {lever}: {row['error']}")
            attention_module._BROKEN.difference_update(newly_broken)  # later rows try again
        rows.append(row)
        save_json()  # after every row: a run killed at its limit keeps what it measured
        return row

    with torch.inference_mode():
        for name in model_names(args.cpu_smoke):
            model, inputs = build(name, device)
            fusable = fused_blocks.install(model) is not None  # before any hook; off
            log(f"{name}: built")

            def fwd(model=model, inputs=inputs):
                return model(**inputs)[0]

            stock = fwd().clone()  # the first call pays one-time set-up: warm up once more
            base_s = cuda_time(fwd, device, 2 if "14b" in name else args.reps)
            rows.append(dict(model=name, lever="stock (SDPA)", ms=base_s * 1e3, speedup=1.0,
                             cosine=1.0))
            log(f"{name}: stock {base_s * 1e3:.1f} ms")
            video = name.startswith("wan")
            if device.type == "cuda":  # the library's fastest dense attention, for reference
                from torch.nn.attention import SDPBackend, sdpa_kernel

                def fwd_cudnn(fwd=fwd):
                    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                        return fwd()

                timed(name, "SDPA forced to cuDNN attention (library)", fwd_cudnn, stock,
                      base_s)
            kernels = ["sage"] + (["sparse"] if video else []) + ["flash"]
            for kernel in kernels:
                stats = apply_attention(model, AttentionConfig(
                    kernel=kernel, sparse_inner="sage" if kernel == "sparse" else "flash"))
                timed(name, f"attention {kernel}", fwd, stock, base_s, calls=stats,
                      optional=kernel == "flash")
                if args.profile and video and kernel == "sage" and not out_of_time("optional"):
                    log(profile_forward(f"{name}, sage attention", fwd, device, args.profile))
                    remove_attention(model)
                    log(profile_forward(f"{name}, stock", fwd, device, args.profile))
                remove_attention(model)
            if fusable:
                fused_blocks.set_fused(model, True)
                timed(name, "fused block ops (AdaLN norm, QK-norm+RoPE, gated residual)", fwd,
                      stock, base_s, calls=model._studio_fused_stats, optional=True)
                fused_blocks.set_fused(model, False)
            apply_step_cache(model, StepCacheConfig(threshold=0.0))
            timed(name, "step cache hooks (threshold 0)", fwd, stock, base_s, optional=True)
            remove_step_cache(model)
            # the rank-group overhead is per step, not per model: timed on the smaller one
            per_step = None
            if not video and not out_of_time("optional"):
                try:  # the loopback rendezvous has only run on CPUs: a failure is a row
                    per_step = degree_one_rank_group(device)
                except Exception as exc:
                    rows.append(dict(model=name, lever="parallel path at degree 1 (rank group)",
                                     error=f"{type(exc).__name__}: {str(exc)[:200]}"))
                    log(f"{name}: rank group failed: {rows[-1]['error']}")

            def fwd_in_group(fwd=fwd, per_step=per_step):
                per_step()
                return fwd()

            def fwd_agreeing(fwd=fwd, per_step=per_step):
                per_step(collective=True)
                return fwd()

            for lever, f in (("parallel path at degree 1 (rank group)", fwd_in_group),
                             ("per-step cancel all-reduce (2+ ranks)", fwd_agreeing)
                             ) if per_step else ():
                row = timed(name, lever, f, stock, base_s, optional=True)
                if "ms" in row:
                    row["note"] = f"overhead {(row['ms'] / (base_s * 1e3) - 1) * 100:+.1f}%"
            # precision last. Ours (fp8-rowwise) swaps the block linears: the originals are
            # kept and put back, then torchao's fp8-dynamic (the library baseline) transforms
            # the weights in place.
            target = PER_STEP_TARGETS["wan" if video else "flux"]
            fused = " + fused block ops" if fusable else ""
            originals = {n: m for n, m in model.named_modules()
                         if isinstance(m, torch.nn.Linear)}
            for precision in precisions:
                try:
                    note = apply(model, precision)
                except Exception as exc:
                    rows.append(dict(model=name, lever=f"precision {precision}",
                                     error=f"{type(exc).__name__}: {str(exc)[:200]}"))
                    log(f"{name}: precision {precision} failed: {rows[-1]['error']}")
                    continue
                timed(name, f"precision {precision}", fwd, stock, base_s, note=note)
                if precision == "fp8-rowwise":  # + inductor fusion
                    compiled_row(model, name, f"precision {precision} + regional torch.compile "
                                 f"(SDPA attention)", fwd, stock, base_s,
                                 target)
                fused_blocks.set_fused(model, fusable)
                ours = precision == precisions[0]
                for kernel in ["sage"] + (["sparse"] if video and ours else []):
                    stats = apply_attention(model, AttentionConfig(
                        kernel=kernel, sparse_inner="sage"))
                    row = timed(name, f"{'ours: ' if ours else ''}attention {kernel}{fused} "
                                f"+ {precision}", fwd, stock, base_s, calls=stats)
                    if ours and kernel == "sage":
                        # regional torch.compile on top (studio.engine.compile): not in any
                        # profile until this row has measured it
                        compiled_row(model, name, f"ours: attention sage{fused} + {precision} + "
                                     f"regional torch.compile", fwd, stock, base_s, target)
                        with use_fast_exp():
                            timed(name, f"ours: attention sage (f16x2 exp2){fused} + "
                                  f"{precision}", fwd, stock, base_s, optional=True)
                    remove_attention(model)
                    if "ms" in row and ours:
                        ok = row["speedup"] >= target
                        row["note"] = (f"issue 7 target x{target:.1f}: "
                                       f"{'PASS' if ok else 'FAIL'}")
                fused_blocks.set_fused(model, False)
                if precision == "fp8-rowwise":  # back to the bf16, unfused linears
                    for n, m in originals.items():
                        parent, _, child = n.rpartition(".")
                        setattr(model.get_submodule(parent) if parent else model, child, m)
                    model.unfuse_qkv_projections()
                    # the library's own compile, for reference (before torchao's transform)
                    compiled_row(model, name, "stock + regional torch.compile (library)", fwd,
                                 stock, base_s)
            # every closure over the model goes too, or the 12B one stays resident while the
            # 14B one is built (an out-of-memory risk on an 80 GB card)
            del originals, fwd, fwd_in_group, fwd_agreeing
            if device.type == "cuda":
                del fwd_cudnn
            del model, inputs, stock
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            save_json()  # after each model: a run cut short keeps what it measured
    print("| model | lever | ms | speed-up | cosine vs stock | note |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['model']} | {r['lever']} | | | | {r['error']} |")
        else:
            calls = ", ".join(f"{k} {v}" for k, v in r.get("calls", {}).items())
            note = "; ".join(x for x in (r.get("note", ""), calls and f"calls: {calls}") if x)
            print(f"| {r['model']} | {r['lever']} | {r['ms']:.1f} | ×{r['speedup']:.2f} | "
                  f"{r['cosine']:.6f} | {note} |")
    save_json()
    return 0


if __name__ == "__main__":
    sys.exit(main())
