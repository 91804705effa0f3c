"""``python -m bench.gpu.engine``: the engine's GPU levers on full-size denoisers, timed.

Random-weight Wan 2.1 (1.3B config, 480p x 81 frames) and FLUX.1 (12B config, 1024²)
transformers built directly on the GPU in bf16; one denoiser forward each, timed with CUDA
events (median), for:

* attention: PyTorch SDPA (stock) vs our kernels routed in by ``studio.engine.attention``
  (``flash``, ``sage``; ``sparse`` on the video model), output cosine similarity to stock;
* precision: torchao int8-dynamic / fp8-dynamic on the denoiser (if torchao imports);
* the step cache's overhead on a full step (hooks on, threshold 0: must be ~free);
* the parallel code path at degree 1 (a 1-rank group: mesh, per-step cancel all-reduce and
  host sync), which must cost ≤ 3% of a step.

Quality of these levers on a *trained* model is measured on the embedded model
(``python -m bench cpu`` / ``precision``); random weights only give speed and numerical
agreement. ``--cpu-smoke`` runs tiny configs on the CPU to check the script itself.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def cuda_time(fn, device: torch.device, reps: int = 5) -> float:
    """Median seconds of ``fn()`` after one warm-up call."""
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


def models(device: torch.device, smoke: bool):
    """(name, model, inputs) for the full-size (or, smoke, tiny) configs."""
    from diffusers import FluxTransformer2DModel, WanTransformer3DModel

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        prev = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            if smoke:
                wan = WanTransformer3DModel(num_attention_heads=2, attention_head_dim=64,
                                            in_channels=16, out_channels=16, text_dim=64,
                                            freq_dim=64, ffn_dim=128, num_layers=2,
                                            cross_attn_norm=True,
                                            qk_norm="rms_norm_across_heads").eval()
                flux = FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=1,
                                              num_single_layers=1, attention_head_dim=64,
                                              num_attention_heads=2, joint_attention_dim=32,
                                              pooled_projection_dim=32, guidance_embeds=True,
                                              axes_dims_rope=(16, 24, 24)).eval()
                lat, tokens, text = (16, 3, 8, 12), 64, 16
            else:
                wan = WanTransformer3DModel(num_attention_heads=12, attention_head_dim=128,
                                            in_channels=16, out_channels=16, text_dim=4096,
                                            freq_dim=256, ffn_dim=8960, num_layers=30,
                                            cross_attn_norm=True,
                                            qk_norm="rms_norm_across_heads").eval()
                flux = FluxTransformer2DModel(guidance_embeds=True).eval()  # FLUX.1-dev config
                lat, tokens, text = (16, 21, 60, 104), 4096, 512
        finally:
            torch.set_default_dtype(prev)
    g = torch.Generator(device="cpu").manual_seed(1)

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(device, dtype)

    wan_in = dict(hidden_states=rand(1, *lat), timestep=torch.tensor([500.0], device=device),
                  encoder_hidden_states=rand(1, 512 if not smoke else 16,
                                             wan.config.text_dim), return_dict=False)
    fc = flux.config
    flux_in = dict(hidden_states=rand(1, tokens, fc.in_channels),
                   encoder_hidden_states=rand(1, text, fc.joint_attention_dim),
                   pooled_projections=rand(1, fc.pooled_projection_dim),
                   timestep=torch.tensor([0.5], device=device, dtype=dtype),
                   img_ids=torch.zeros(tokens, 3, device=device),
                   txt_ids=torch.zeros(text, 3, device=device),
                   guidance=torch.tensor([3.5], device=device, dtype=dtype), return_dict=False)
    return [("wan-1.3b 480p x81" if not smoke else "wan-tiny", wan, wan_in),
            ("flux-12b 1024²" if not smoke else "flux-tiny", flux, flux_in)]


def degree_one_rank_group(device: torch.device):
    """What a rank-group worker adds to each step when its plan has degree 1: a 1-rank
    process group (NCCL/gloo) with the (cfg, ring, ulysses) mesh, and per step the cancel
    check. With one rank the worker reads its cancel flag without a collective (there is no
    one to agree with); the 4-byte all-reduce and host sync it does with 2+ ranks are timed
    too (``per_step(collective=True)``). Returns that per-step call."""
    import os

    import torch.distributed as dist

    from studio.engine.parallel import ParallelConfig
    from studio.engine.parallel.launch import free_port
    from studio.engine.parallel.mesh import ParallelMesh

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0,
                                world_size=1)
        ParallelMesh.build(ParallelConfig())
    flag = torch.zeros(1, dtype=torch.int32, device=device)

    def per_step(collective: bool = False) -> None:
        if not collective:
            flag.fill_(0)  # the shared-memory flag read, as the 1-rank worker does
            return
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        flag.item()

    return per_step


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.float().flatten(), b.float().flatten(),
                                                       dim=0))


def main(argv: list[str] | None = None) -> int:
    from studio.engine.attention import AttentionConfig, apply_attention, remove_attention
    from studio.engine.caching import StepCacheConfig, apply_step_cache, remove_step_cache

    ap = argparse.ArgumentParser(prog="python -m bench.gpu.engine")
    ap.add_argument("--cpu-smoke", action="store_true")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    device = torch.device("cpu" if args.cpu_smoke or not torch.cuda.is_available() else "cuda")
    rows = []
    with torch.inference_mode():
        for name, model, inputs in models(device, args.cpu_smoke):
            def fwd(model=model, inputs=inputs):
                return model(**inputs)[0]

            stock = fwd().clone()
            base_s = cuda_time(fwd, device)
            rows.append(dict(model=name, lever="stock (SDPA)", ms=base_s * 1e3, speedup=1.0,
                             cosine=1.0))
            log(f"{name}: stock {base_s * 1e3:.1f} ms")
            kernels = ["flash", "sage"] + (["sparse"] if name.startswith("wan") else [])
            for kernel in kernels:
                try:
                    stats = apply_attention(model, AttentionConfig(kernel=kernel))
                    out = fwd().clone()
                    seconds = cuda_time(fwd, device)
                    rows.append(dict(model=name, lever=f"attention {kernel}", ms=seconds * 1e3,
                                     speedup=base_s / seconds, cosine=cosine(out, stock),
                                     calls=dict(stats)))
                    log(f"{name}: {kernel} {seconds * 1e3:.1f} ms cos {cosine(out, stock):.5f}")
                except Exception as exc:  # report and go on: time is scarce
                    rows.append(dict(model=name, lever=f"attention {kernel}",
                                     error=f"{type(exc).__name__}: {str(exc)[:200]}"))
                finally:
                    remove_attention(model)
            apply_step_cache(model, StepCacheConfig(threshold=0.0))
            seconds = cuda_time(fwd, device)
            remove_step_cache(model)
            rows.append(dict(model=name, lever="step cache hooks (threshold 0)",
                             ms=seconds * 1e3, speedup=base_s / seconds, cosine=1.0))
            per_step = degree_one_rank_group(device)

            def fwd_in_group(fwd=fwd, per_step=per_step):
                per_step()
                return fwd()

            out = fwd_in_group().clone()
            seconds = cuda_time(fwd_in_group, device)
            rows.append(dict(model=name, lever="parallel path at degree 1 (rank group)",
                             ms=seconds * 1e3, speedup=base_s / seconds,
                             cosine=cosine(out, stock),
                             note="overhead " + f"{(seconds / base_s - 1) * 100:+.1f}%"))
            log(f"{name}: degree-1 rank group {seconds * 1e3:.1f} ms")

            def fwd_agreeing(fwd=fwd, per_step=per_step):
                per_step(collective=True)
                return fwd()

            seconds = cuda_time(fwd_agreeing, device)
            rows.append(dict(model=name, lever="per-step cancel all-reduce (2+ ranks)",
                             ms=seconds * 1e3, speedup=base_s / seconds, cosine=1.0,
                             note="overhead " + f"{(seconds / base_s - 1) * 100:+.1f}%"))
            log(f"{name}: with the cancel all-reduce {seconds * 1e3:.1f} ms")
        from studio.engine.precision import apply_precision, precision_supported

        precision = ("fp8-dynamic" if precision_supported("fp8-dynamic", device) is None
                     else "int8-dynamic")
        for name, model, inputs in models(device, args.cpu_smoke)[1:]:  # flux, rebuilt
            # the transform is in place: one precision per model build
            try:
                note = apply_precision(model, precision, device)
                out = model(**inputs)[0]
                seconds = cuda_time(lambda m=model, i=inputs: m(**i)[0], device)
                rows.append(dict(model=name, lever=f"precision {precision}",
                                 ms=seconds * 1e3, speedup=base_s / seconds,
                                 cosine=cosine(out, stock), note=note))
                log(f"{name}: {precision} {seconds * 1e3:.1f} ms")
            except Exception as exc:
                rows.append(dict(model=name, lever=f"precision {precision}",
                                 error=f"{type(exc).__name__}: {str(exc)[:200]}"))
    print("| model | lever | ms | speed-up | cosine vs stock | note |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['model']} | {r['lever']} | | | | {r['error']} |")
        else:
            print(f"| {r['model']} | {r['lever']} | {r['ms']:.1f} | ×{r['speedup']:.2f} | "
                  f"{r['cosine']:.5f} | {r.get('note', '')} |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": str(device), "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
