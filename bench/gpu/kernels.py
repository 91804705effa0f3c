"""studio.kernels on one GPU: correctness first, then time and TFLOP/s against torch SDPA.

    bench/gpu/run.sh [--json PATH] [--budget-s 270]
    python -m bench.gpu.kernels --cpu-smoke        # correctness only, tiny shapes, CPU

Imports only torch, triton, numpy and studio.kernels (the GPU machine has no diffusers).

1. Correctness on medium shapes (tiny ones with --cpu-smoke): each kernel against its float32
   reference or float32 SDPA, checking that the Triton path (not the torch fallback) ran.
2. Timing at the Flux 1024² shape (batch 1, 4608 tokens, 24 heads, head dim 128, bf16) and the
   Wan 2.1 720p shape (75,600 tokens, 40 heads, head dim 128): torch SDPA with the flash and
   cuDNN backends, our dense attention (a small launch-config sweep on the Flux shape),
   SageAttention with 16-bit and fp8 P·V (end to end: the torch quantization included, and
   timed alone), block-sparse attention on a local video window (dense-equivalent TFLOP/s and
   the kept fraction), and the AdaLN norm and gated residual against torch eager.
3. A compact markdown table, last. Exit status 1 when a correctness check failed.

A time budget (--budget-s) skips the remaining timings rather than overrunning the machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
import traceback

from bench.gpu import seconds_left

T0 = time.perf_counter()
#: seconds of the run's deadline ($STUDIO_GPU_DEADLINE) kept for bench.gpu.engine, which
#: runs next: the kernel timings left are skipped instead
ENGINE_RESERVE_S = 190.0

FLUX = dict(name="flux-1024", batch=1, heads=24, seq=4608, head_dim=128,
            video=(1, 64, 64, 512), window=(0, 16, 16))  # 64x64 image tokens + 512 text
WAN = dict(name="wan-720p", batch=1, heads=40, seq=75600, head_dim=128,
           video=(21, 45, 80, 0), window=(3, 6, 10))  # 21 latent frames of 45x80
NORM_SHAPES = [("flux-1024", 1, 4608, 3072), ("wan-720p", 1, 75600, 5120)]
SMOKE = dict(name="cpu-smoke", batch=1, heads=2, seq=80, head_dim=64, video=(1, 8, 8, 16),
             window=(0, 2, 2))
SMOKE_NORM_SHAPES = [("cpu-smoke", 1, 77, 96)]


# ---------------------------------------------------------------------------- helpers


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


def quality(actual, expected) -> tuple[float, float]:
    """(cosine similarity, relative L1) in float64."""
    import torch

    a, e = actual.double().flatten(), expected.double().flatten()
    cos = torch.nn.functional.cosine_similarity(a, e, dim=0).item()
    return cos, ((a - e).abs().sum() / e.abs().sum()).item()


class Checks:
    """Collects correctness rows: name, measured figures, limits, pass/fail."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def add(self, name: str, ok: bool, detail: str) -> None:
        self.rows.append(dict(name=name, ok=bool(ok), detail=detail))
        log(f"{'PASS' if ok else 'FAIL'} {name}: {detail}")

    def run(self, name: str, fn) -> None:
        try:
            fn()
        except Exception as exc:  # a kernel that fails to compile must not stop the others
            self.add(name, False, f"error: {type(exc).__name__}: {str(exc)[:300]}")
            traceback.print_exc()

    @property
    def ok(self) -> bool:
        return all(r["ok"] for r in self.rows)


def within_bf16_ulp(out, ref) -> bool:
    """Within one bfloat16 ulp of the float32-math reference (the interpreter truncates when
    rounding to bfloat16, the GPU rounds to nearest: half an ulp)."""
    diff = (out.float() - ref.float()).abs()
    return bool((diff <= 1e-2 + 2.0**-7 * ref.float().abs()).all()) and not out.isnan().any()


def bf16_detail(out, ref) -> str:
    diff = (out.float() - ref.float()).abs()
    rel = (diff / ref.float().abs().clamp_min(1e-2)).max().item()
    return (f"bf16 max abs err {diff.max().item():.2e}, max rel err {rel:.1e} "
            f"(<= 1 ulp = 7.8e-3 + 1e-2 abs)")


def ran_triton(counter, before: int, calls: int = 1) -> bool:
    return counter["triton"] - before == calls


# ---------------------------------------------------------------------------- correctness


def correctness(device: str, smoke: bool) -> Checks:
    import torch
    import torch.nn.functional as F

    from studio.kernels.adaln_norm import LAUNCHES as ADALN_LAUNCHES
    from studio.kernels.adaln_norm import adaln_norm, adaln_norm_reference
    from studio.kernels.attention import LAUNCHES as ATTN_LAUNCHES
    from studio.kernels.attention import attention, attention_reference
    from studio.kernels.block_sparse_attention import LAUNCHES as BS_LAUNCHES
    from studio.kernels.block_sparse_attention import (
        BlockSparseLayout,
        block_sparse_attention,
        block_sparse_attention_reference,
        build_video_mask,
    )
    from studio.kernels.gated_residual import LAUNCHES as GATE_LAUNCHES
    from studio.kernels.gated_residual import gated_residual, gated_residual_reference
    from studio.kernels.qk_norm_rope import LAUNCHES as QK_LAUNCHES
    from studio.kernels.qk_norm_rope import qk_norm_rope, qk_norm_rope_reference
    from studio.kernels.sage_attention import LAUNCHES as SAGE_LAUNCHES
    from studio.kernels.sage_attention import (
        device_supports_fp8,
        sage_attention,
        sage_attention_reference,
    )
    from studio.kernels.sage_attention.op import use_fast_exp

    checks = Checks()
    gen = torch.Generator(device="cpu").manual_seed(0)

    def randn(*shape, dtype=torch.float32, scale=1.0, offset=None):
        x = torch.randn(*shape, generator=gen) * scale
        if offset is not None:
            x = x + offset
        return x.to(device=device, dtype=dtype)

    batch, heads = (1, 2) if smoke else (2, 8)
    seq_q, seq_k = (129, 77) if smoke else (1000, 1000)
    kv_len = torch.tensor([seq_k, seq_k * 2 // 3], dtype=torch.int32)[:batch].to(device)
    nan = float("nan")
    tol = {torch.float32: 1e-4 if smoke else 2e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}

    # Dense attention: every dtype, against the float32 reference (output and LSE).
    for dtype, head_dim in [(torch.float16, 64), (torch.bfloat16, 128), (torch.float32, 64),
                            (torch.bfloat16, 32)]:
        name = f"attention {str(dtype)[6:]} d{head_dim}"

        def check_attention(dtype=dtype, head_dim=head_dim, name=name):
            q = randn(batch, heads, seq_q, head_dim, dtype=dtype)
            k = randn(batch, heads, seq_k, head_dim, dtype=dtype)
            v = randn(batch, heads, seq_k, head_dim, dtype=dtype)
            out = torch.full_like(q, nan)
            before = ATTN_LAUNCHES["triton"]
            _, lse = attention(q, k, v, kv_lengths=kv_len, out=out)
            ref, ref_lse = attention_reference(q, k, v, kv_len)
            err = (out.float() - ref.float()).abs().max().item()
            lse_err = (lse - ref_lse).abs().max().item()
            ok = (ran_triton(ATTN_LAUNCHES, before) and not out.isnan().any().item()
                  and err <= tol[dtype] and lse_err <= 1e-3)
            checks.add(name, ok, f"max abs err {err:.2e} (<= {tol[dtype]:.0e}), "
                       f"lse {lse_err:.1e} (<= 1e-3)")

        checks.run(name, check_attention)

    def sdpa32(q, k, v, lengths=None):
        mask = None
        if lengths is not None:
            cols = torch.arange(k.shape[2], device=device)
            mask = (cols[None, :] < lengths[:, None].long())[:, None, None, :]
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)

    # SageAttention: quality against float32 SDPA on keys with a per-channel offset.
    fp8_ok = device_supports_fp8(torch.device(device)) or smoke
    head_dim = 64 if smoke else 128
    for pv_fp8, dtype, fast in [(False, torch.bfloat16, False), (False, torch.float16, False),
                                (True, torch.bfloat16, False), (True, torch.bfloat16, True)]:
        name = (f"sage {'fp8' if pv_fp8 else '16-bit'} P·V {str(dtype)[6:]} d{head_dim}"
                f"{', f16x2 exp2' if fast else ''}")
        if fast and device != "cuda":
            checks.add(name, True, "skipped: inline PTX needs a CUDA GPU")
            continue
        if pv_fp8 and not fp8_ok:
            checks.add(name, True, "skipped: device has no fp8 (compute capability < 8.9)")
            continue
        # fp8 under the interpreter rounds differently from the GPU: a looser smoke bound.
        lim_cos, lim_l1 = (0.999, 0.02) if not pv_fp8 else ((0.99, 0.08) if smoke
                                                            else (0.995, 0.05))

        def check_sage(pv_fp8=pv_fp8, dtype=dtype, name=name, lim_cos=lim_cos, lim_l1=lim_l1,
                       fast=fast):
            offset = 4.0 * torch.randn(1, heads, 1, head_dim, generator=gen)
            q = randn(batch, heads, seq_q, head_dim, dtype=dtype)
            k = randn(batch, heads, seq_k, head_dim, dtype=dtype, offset=offset)
            v = randn(batch, heads, seq_k, head_dim, dtype=dtype)
            out = torch.full_like(q, nan)
            before = SAGE_LAUNCHES["triton"]
            with use_fast_exp(fast):
                sage_attention(q, k, v, kv_lengths=kv_len, pv_fp8=pv_fp8, out=out)
            cos, l1 = quality(out, sdpa32(q, k, v, kv_len))
            emulated = sage_attention_reference(q, k, v, kv_len, pv_fp8=pv_fp8)[0]
            emu_cos, emu_l1 = quality(emulated, sdpa32(q, k, v, kv_len))
            ok = (ran_triton(SAGE_LAUNCHES, before) and not out.isnan().any().item()
                  and cos >= lim_cos and l1 <= lim_l1)
            checks.add(name, ok, f"vs fp32 SDPA cos {cos:.5f} (>= {lim_cos}), rel L1 "
                       f"{l1:.4f} (<= {lim_l1}); torch emulation cos {emu_cos:.5f}, "
                       f"rel L1 {emu_l1:.4f}")

        checks.run(name, check_sage)

    # diffusers hands attention (batch, seq, heads, dim) tensors transposed to (batch, heads,
    # seq, dim): strided, and with a whole number of blocks nothing pads (copies) them.
    def check_sage_transposed():
        seq = 256 if smoke else 4608  # the Flux 1024² image tokens: 36 blocks of 128
        q, k, v = (randn(batch, seq, heads, head_dim, dtype=torch.bfloat16).transpose(1, 2)
                   for _ in range(3))
        before = SAGE_LAUNCHES["triton"]
        out = sage_attention(q, k, v, pv_fp8=False)[0]
        want = sage_attention(*(t.contiguous() for t in (q, k, v)), pv_fp8=False)[0]
        cos, _ = quality(out, want)
        ok = ran_triton(SAGE_LAUNCHES, before, calls=2) and cos >= 0.99999
        checks.add("sage on diffusers' strided layout", ok, f"vs contiguous cos {cos:.6f}")

    checks.run("sage on diffusers' strided layout", check_sage_transposed)

    # Block-sparse attention: against dense masked attention, and the visited-block count.
    def check_block_sparse():
        frames, height, width, text = (3, 4, 8, 17) if smoke else (4, 16, 16, 77)
        block_m, block_n = (32, 16) if smoke else (128, 64)
        mask = build_video_mask(frames, height, width, text, block_m, block_n, (1, 2, 2),
                                device=device)
        layout = BlockSparseLayout.from_mask(mask, block_m, block_n)
        seq = frames * height * width + text
        dtype = torch.float16 if smoke else torch.bfloat16
        hd = 64 if smoke else 128
        q, k, v = (randn(batch, heads, seq, hd, dtype=dtype) for _ in range(3))
        out = torch.full_like(q, nan)
        visits = torch.zeros(mask.shape[0], dtype=torch.int32, device=device)
        before = BS_LAUNCHES["triton"]
        block_sparse_attention(q, k, v, layout, out=out, visit_counter=visits)
        ref = block_sparse_attention_reference(q, k, v, mask, block_m, block_n)[0]
        err = (out.float() - ref.float()).abs().max().item()
        expected_visits = batch * heads * int(mask.sum())
        ok = (ran_triton(BS_LAUNCHES, before) and not out.isnan().any().item()
              and err <= tol[dtype] and int(visits.sum()) == expected_visits)
        checks.add("block-sparse attention", ok,
                   f"max abs err {err:.2e} (<= {tol[dtype]:.0e}), visited {int(visits.sum())} "
                   f"blocks, mask says {expected_visits}, density {layout.density():.3f}")

    checks.run("block-sparse attention", check_block_sparse)

    # Norms.
    rows, dim = (77, 1000) if smoke else (4096, 3072)
    for norm in ("layer", "rms"):
        name = f"adaln_norm {norm}"

        def check_adaln(norm=norm, name=name):
            x = randn(2, rows, dim, dtype=torch.bfloat16, scale=3.0)
            scale, shift = randn(2, 1, dim, scale=0.5), randn(2, 1, dim)
            out = torch.full_like(x, nan)
            before = ADALN_LAUNCHES["triton"]
            adaln_norm(x, scale, shift, norm=norm, out=out)
            ref = adaln_norm_reference(x, scale, shift, norm)
            ok = ran_triton(ADALN_LAUNCHES, before) and within_bf16_ulp(out, ref)
            checks.add(name, ok, bf16_detail(out, ref))

        checks.run(name, check_adaln)

    def check_gate():
        x, y = randn(2, rows, dim, dtype=torch.bfloat16), randn(2, rows, dim, dtype=torch.bfloat16)
        gate = randn(2, dim, dtype=torch.bfloat16)
        out = torch.full_like(x, nan)
        before = GATE_LAUNCHES["triton"]
        gated_residual(x, gate, y, out=out)
        ref = gated_residual_reference(x, gate, y)
        ok = ran_triton(GATE_LAUNCHES, before) and within_bf16_ulp(out, ref)
        checks.add("gated_residual", ok, bf16_detail(out, ref))

    checks.run("gated_residual", check_gate)

    for norm in ("head", "all"):
        name = f"qk_norm_rope {norm}"

        def check_qk(norm=norm, name=name):
            heads, head_dim = (3, 64) if smoke else (24, 128)
            x = randn(2, rows, heads * head_dim, dtype=torch.bfloat16, scale=2.0)
            w = randn(head_dim if norm == "head" else heads * head_dim, scale=0.2) + 1
            angle = randn(1, rows, head_dim // 2, scale=3.0).repeat_interleave(2, -1)
            out = torch.full_like(x, nan)
            before = QK_LAUNCHES["triton"]
            qk_norm_rope(x, w, angle.cos(), angle.sin(), heads=heads, norm=norm, out=out)
            ref = qk_norm_rope_reference(x, w, angle.cos(), angle.sin(), heads, 1e-6, norm)
            ok = ran_triton(QK_LAUNCHES, before) and within_bf16_ulp(out, ref)
            checks.add(name, ok, bf16_detail(out, ref))

        checks.run(name, check_qk)

    def check_fp8_linear():
        from studio.kernels.fp8_linear import LAUNCHES as FP8_LAUNCHES
        from studio.kernels.fp8_linear import (
            fp8_linear,
            fp8_linear_reference,
            quantize_rows_fp8,
            quantize_rows_fp8_reference,
            quantize_weight_fp8,
        )

        m, kf, nf = (77, 96, 48) if smoke else (1000, 3072, 3072)
        x = randn(m, kf, dtype=torch.bfloat16, scale=3.0)
        before = FP8_LAUNCHES["triton"]
        x8, xs = quantize_rows_fp8(x)
        want8, want_s = quantize_rows_fp8_reference(x)
        # GPU fp32 division may move a value by one fp8 step: count, don't demand equality
        moved = (x8.float() != want8.float()).float().mean().item()
        w8, ws = quantize_weight_fp8(randn(nf, kf, scale=0.05))
        bias = randn(nf, dtype=torch.bfloat16)
        cos, rel = quality(fp8_linear(x, w8, ws, bias), fp8_linear_reference(x, w8, ws, bias))
        ok = (ran_triton(FP8_LAUNCHES, before, 2) and moved < 1e-3 and cos >= 0.9999
              and torch.allclose(xs, want_s, rtol=1e-6))
        checks.add("fp8_linear row-wise", ok, f"quantized values off the reference: "
                   f"{moved:.1e} (< 1e-3); linear vs float32 emulation cos {cos:.6f} "
                   f"(>= 0.9999), rel L1 {rel:.4f}")

    checks.run("fp8_linear row-wise", check_fp8_linear)
    return checks


# ---------------------------------------------------------------------------- timing


def device_time(fn, device: str, min_reps: int = 3, target_s: float = 0.6) -> float:
    """Median seconds per call: one warm-up call (compiles), then reps timed with CUDA events
    (wall clock on the CPU) until about ``target_s`` has passed."""
    import torch

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    fn()
    sync()
    start = time.perf_counter()
    fn()
    sync()
    once = time.perf_counter() - start
    reps = max(min_reps, min(50, int(target_s / max(once, 1e-6))))
    times = []
    for _ in range(reps):
        if device != "cuda":
            begin_s = time.perf_counter()
            fn()
            times.append(time.perf_counter() - begin_s)
            continue
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) / 1e3)
    times.sort()
    return times[len(times) // 2]


class Timings:
    def __init__(self, budget_s: float, device: str) -> None:
        self.rows: list[dict] = []
        self.deadline = time.perf_counter() + budget_s  # the timings' own budget
        self.device = device

    def run(self, shape: str, name: str, fn, flops: float | None = None,
            bytes_moved: float | None = None, note: str = "", baseline: str | None = None):
        row = dict(shape=shape, kernel=name, ms=None, tflops=None, gbps=None, note=note,
                   baseline=baseline)
        # past its own budget, or when the engine stage would lose its share of the run's
        if time.perf_counter() > self.deadline or seconds_left() < ENGINE_RESERVE_S:
            row["note"] = "skipped: time budget"
            self.rows.append(row)
            log(f"skip {shape} {name}: time budget")
            return None
        try:
            sec = device_time(fn, self.device)
        except Exception as exc:
            row["note"] = f"error: {type(exc).__name__}: {str(exc)[:160]}"
            self.rows.append(row)
            log(f"error {shape} {name}: {exc}")
            return None
        row["ms"] = sec * 1e3
        if flops:
            row["tflops"] = flops / sec / 1e12
        if bytes_moved:
            row["gbps"] = bytes_moved / sec / 1e9
        self.rows.append(row)
        log(f"{shape} {name}: {sec * 1e3:.3f} ms"
            + (f", {row['tflops']:.0f} TFLOP/s" if row["tflops"] else "")
            + (f", {row['gbps']:.0f} GB/s" if row["gbps"] else "") + (f" ({note})" if note else ""))
        return sec

    def ms_of(self, shape: str, name: str) -> float | None:
        for r in self.rows:
            if r["shape"] == shape and r["kernel"] == name:
                return r["ms"]
        return None


def time_attention(shape: dict, timings: Timings, best_config) -> object:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from studio.kernels.attention import attention
    from studio.kernels.attention.op import Config, use_config
    from studio.kernels.block_sparse_attention import (
        BlockSparseLayout,
        block_sparse_attention,
        build_video_mask,
    )
    from studio.kernels.sage_attention import device_supports_fp8, sage_attention
    from studio.kernels.sage_attention.op import (
        quantize_int8_fused,
        quantize_v_fp8_fused,
        use_fast_exp,
        use_launch,
    )
    from studio.kernels.sage_attention.reference import k_mean, quantize_qk, quantize_v_fp8

    name, b, h, s, d = (shape[k] for k in ("name", "batch", "heads", "seq", "head_dim"))
    flops = 4.0 * b * h * s * s * d
    dev = timings.device
    g = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device=dev, dtype=torch.bfloat16, generator=g)
               for _ in range(3))
    k += torch.randn(1, h, 1, d, device=dev, dtype=torch.bfloat16, generator=g)
    out = torch.empty_like(q)
    base = "sdpa flash"

    for label, backend in (("sdpa flash", SDPBackend.FLASH_ATTENTION),
                           ("sdpa cudnn", SDPBackend.CUDNN_ATTENTION)):
        def sdpa(backend=backend):
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v)

        timings.run(name, label, sdpa, flops)
    timings.run(name, "sdpa default (what stock diffusers runs)",
                lambda: F.scaled_dot_product_attention(q, k, v), flops, baseline=base)
    # diffusers hands attention (batch, seq, heads, dim) tensors transposed: the same data in
    # that layout, to see what the strides cost each path
    qt, kt, vt = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    timings.run(name, "sdpa default, diffusers' strided layout",
                lambda: F.scaled_dot_product_attention(qt, kt, vt), flops, baseline=base)
    timings.run(name, "studio attention, diffusers' strided layout",
                lambda: attention(qt, kt, vt, out=out), flops, baseline=base)
    timings.run(name, "studio sage fp8 P·V, diffusers' strided layout",
                lambda: sage_attention(qt, kt, vt, out=out), flops, baseline=base)

    if best_config is None:  # sweep a few launch configs on this (the first) shape
        best = (math.inf, None)
        for cfg in (Config(128, 64, 8, 3), Config(128, 64, 4, 3), Config(128, 128, 8, 2),
                    Config(64, 64, 4, 3), Config(128, 32, 4, 4)):
            def ours(cfg=cfg):
                with use_config(cfg):
                    attention(q, k, v, out=out)

            label = (f"studio attention {cfg.block_m}x{cfg.block_n} w{cfg.num_warps} "
                     f"s{cfg.num_stages}")
            sec = timings.run(name, label, ours, flops, baseline=base)
            if sec is not None and sec < best[0]:
                best = (sec, cfg)
        best_config = best[1]
    elif best_config:
        def ours_best():
            with use_config(best_config):
                attention(q, k, v, out=out)

        c = best_config
        timings.run(name, f"studio attention {c.block_m}x{c.block_n} w{c.num_warps} "
                    f"s{c.num_stages}", ours_best, flops, baseline=base)

    timings.run(name, "studio attention (default config)", lambda: attention(q, k, v, out=out),
                flops, baseline=base)
    timings.run(name, "studio sage 16-bit P·V",
                lambda: sage_attention(q, k, v, pv_fp8=False, out=out), flops, baseline=base)
    if device_supports_fp8(q.device):
        timings.run(name, "studio sage fp8 P·V",
                    lambda: sage_attention(q, k, v, pv_fp8=True, out=out), flops, baseline=base)

        def sage_fast():
            with use_fast_exp():
                sage_attention(q, k, v, pv_fp8=True, out=out)

        timings.run(name, "studio sage fp8 P·V, f16x2 exp2", sage_fast, flops, baseline=base)

    def quantize_fused():
        quantize_int8_fused(q, 128, 1.0 / math.sqrt(d))
        quantize_int8_fused(k, 64, mean=k_mean(k))
        quantize_v_fp8_fused(v)

    def quantize_eager():
        quantize_qk(q, k, 1.0 / math.sqrt(d), 128, 64)
        quantize_v_fp8(v)

    timings.run(name, "  of which sage quantization (fused Triton)", quantize_fused,
                note="part of the sage rows")
    timings.run(name, "  sage quantization in torch eager (before)", quantize_eager,
                note="what the fused quantizers replace")
    if shape is WAN and device_supports_fp8(q.device):  # the target shape: a launch sweep
        # f16x2 exp2 (use_fast_exp): two exponentials per MUFU instruction, which the int8 and
        # fp8 products leave as the bottleneck (FlashAttention-3's analysis)
        for bm, bn, warps, stages, fast in (
                (64, 128, 4, 3, False), (64, 128, 4, 3, True), (128, 128, 8, 3, False),
                (128, 128, 8, 3, True), (128, 64, 4, 3, True), (64, 128, 4, 4, True),
                (128, 128, 8, 4, True), (64, 64, 4, 3, True)):
            def sage_cfg(bm=bm, bn=bn, warps=warps, stages=stages, fast=fast):
                with use_launch(warps, stages), use_fast_exp(fast):
                    sage_attention(q, k, v, pv_fp8=True, block_m=bm, block_n=bn, out=out)

            timings.run(name, f"studio sage fp8 P·V {bm}x{bn} w{warps} s{stages}"
                        f"{' f16x2 exp2' if fast else ''}", sage_cfg, flops, baseline=base)

    frames, height, width, text = shape["video"]
    mask = build_video_mask(frames, height, width, text, 128, 64, shape["window"], device=dev)
    layout = BlockSparseLayout.from_mask(mask, 128, 64)
    timings.run(name, "studio block-sparse", lambda: block_sparse_attention(q, k, v, layout,
                                                                            out=out),
                flops, baseline=base,
                note=f"window {shape['window']}, kept {layout.density():.1%} of blocks; "
                     f"TFLOP/s dense-equivalent")
    return best_config  # q, k, v, out are freed on return


def time_norms(timings: Timings, name: str, b: int, s: int, dim: int) -> None:
    import torch

    from studio.kernels.adaln_norm import adaln_norm
    from studio.kernels.gated_residual import gated_residual

    dev = timings.device
    x = torch.randn(b, s, dim, device=dev, dtype=torch.bfloat16)
    y = torch.randn_like(x)
    scale, shift, gate = (torch.randn(b, 1, dim, device=dev, dtype=torch.bfloat16)
                          for _ in range(3))
    out = torch.empty_like(x)
    moved = 2 * x.numel() * x.element_size()
    ln = torch.nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6).to(dev)
    timings.run(name, "torch layer_norm*(1+scale)+shift",
                lambda: ln(x) * (1 + scale) + shift, bytes_moved=moved)
    timings.run(name, "studio adaln_norm (layer)",
                lambda: adaln_norm(x, scale, shift, out=out), bytes_moved=moved,
                baseline="torch layer_norm*(1+scale)+shift")
    moved = 3 * x.numel() * x.element_size()
    timings.run(name, "torch x + gate*y", lambda: x + gate * y, bytes_moved=moved)
    timings.run(name, "studio gated_residual", lambda: gated_residual(x, gate, y, out=out),
                bytes_moved=moved, baseline="torch x + gate*y")

    from studio.kernels.qk_norm_rope import qk_norm_rope

    head_dim = 128 if dim % 128 == 0 else 32
    heads = dim // head_dim
    rms = torch.nn.RMSNorm(head_dim, eps=1e-6).to(dev, torch.bfloat16)
    angle = torch.rand(1, s, head_dim // 2, device=dev) * 6.3
    cos, sin = angle.repeat_interleave(2, -1).cos(), angle.repeat_interleave(2, -1).sin()

    def torch_qk():  # what diffusers runs for Flux: RMSNorm per head, then the rotation
        n = rms(x.unflatten(2, (heads, -1)))
        x1, x2 = n.unflatten(-1, (-1, 2)).unbind(-1)
        rot = torch.stack([-x2, x1], -1).flatten(3)
        return (n.float() * cos[:, :, None] + rot.float() * sin[:, :, None]).to(n.dtype)

    moved = 2 * x.numel() * x.element_size()
    timings.run(name, "torch rms_norm + rope", torch_qk, bytes_moved=moved)
    timings.run(name, "studio qk_norm_rope",
                lambda: qk_norm_rope(x, rms.weight, cos, sin, heads=heads, out=out),
                bytes_moved=moved, baseline="torch rms_norm + rope")


LINEAR_SHAPES = [("flux-1024 mlp", 4608, 3072, 12288), ("wan-480p ffn", 32760, 5120, 13824)]
SMOKE_LINEAR_SHAPES = [("cpu-smoke", 77, 96, 48)]


def time_linear(timings: Timings, name: str, rows: int, features: int, out_features: int):
    """bf16 F.linear against our fp8 row-wise linear (quantizer + torch._scaled_mm) and the
    parts of it, at a DiT's MLP shape."""
    import torch
    import torch.nn.functional as F

    from studio.kernels.fp8_linear import fp8_linear, quantize_rows_fp8, quantize_weight_fp8

    dev = timings.device
    x = torch.randn(rows, features, device=dev, dtype=torch.bfloat16)
    w = torch.randn(out_features, features, device=dev, dtype=torch.bfloat16) * 0.02
    bias = torch.randn(out_features, device=dev, dtype=torch.bfloat16)
    w8, ws = quantize_weight_fp8(w)
    flops = 2.0 * rows * features * out_features
    timings.run(name, "torch linear bf16", lambda: F.linear(x, w, bias), flops)
    timings.run(name, "studio fp8_linear (row-wise)", lambda: fp8_linear(x, w8, ws, bias), flops,
                baseline="torch linear bf16")
    x8, xs = quantize_rows_fp8(x)
    timings.run(name, "  of which quantize_rows_fp8", lambda: quantize_rows_fp8(x),
                bytes_moved=3 * x.numel(), note="reads bf16 x, writes fp8")
    timings.run(name, "  of which torch._scaled_mm", lambda: torch._scaled_mm(
        x8, w8.t(), scale_a=xs, scale_b=ws[None, :], bias=bias, out_dtype=torch.bfloat16),
        flops)


# ---------------------------------------------------------------------------- report


def fmt(value, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def markdown(checks: Checks, timings: Timings) -> str:
    lines = ["## Correctness", "", "| check | result | figures |", "|---|---|---|"]
    for r in checks.rows:
        lines.append(f"| {r['name']} | {'pass' if r['ok'] else '**FAIL**'} | {r['detail']} |")
    if timings.rows:
        lines += ["", f"## Timing on {timings.device} (bf16; median time per call)", "",
                  "| shape | kernel | ms | TFLOP/s | GB/s | vs baseline | note |",
                  "|---|---|---|---|---|---|---|"]
        for r in timings.rows:
            speed = None
            if r["baseline"] and r["ms"]:
                base = timings.ms_of(r["shape"], r["baseline"])
                speed = f"{base / r['ms']:.2f}x {r['baseline']}" if base else None
            lines.append(f"| {r['shape']} | {r['kernel']} | {fmt(r['ms'], '.3f')} | "
                         f"{fmt(r['tflops'], '.0f')} | {fmt(r['gbps'], '.0f')} | "
                         f"{speed or '—'} | {r['note']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu.kernels")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="correctness only, tiny shapes, on the CPU under TRITON_INTERPRET=1")
    p.add_argument("--json", help="also write the results to this JSON file")
    p.add_argument("--budget-s", type=float, default=270.0,
                   help="skip the timings left once this many seconds of timing have "
                        "passed (correctness is not counted)")
    args = p.parse_args(argv)
    if args.cpu_smoke:
        # Must precede the first import of triton: it reads the variable when it decorates.
        os.environ["TRITON_INTERPRET"] = "1"

    import torch
    import triton

    device = "cpu" if args.cpu_smoke else "cuda"
    info = dict(torch=torch.__version__, triton=triton.__version__,
                python=platform.python_version(), device=device)
    if device == "cuda":
        if not torch.cuda.is_available():
            print("no CUDA device: use --cpu-smoke on a machine without a GPU", file=sys.stderr)
            return 2
        info["gpu"] = torch.cuda.get_device_name()
        info["capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
    log(f"environment: {info}")

    checks = correctness(device, smoke=args.cpu_smoke)
    timings = Timings(args.budget_s, device)
    shapes, norm_shapes = (FLUX, WAN), NORM_SHAPES
    if args.cpu_smoke:  # exercise the timing code on tiny shapes; its figures mean nothing
        shapes, norm_shapes = (SMOKE,), SMOKE_NORM_SHAPES
    empty_cache = torch.cuda.empty_cache if device == "cuda" else (lambda: None)
    best = None  # the dense kernel's launch config: swept on the first shape

    def attention_at(shape):
        nonlocal best
        best = time_attention(shape, timings, best) or False

    linear_shapes = SMOKE_LINEAR_SHAPES if args.cpu_smoke else LINEAR_SHAPES
    for what, timer, cases in (("attention", attention_at, [(s,) for s in shapes]),
                               ("the fp8 linear", lambda *a: time_linear(timings, *a),
                                linear_shapes),
                               ("norms", lambda *a: time_norms(timings, *a), norm_shapes)):
        for case in cases:
            try:  # one failing timing must not stop the others
                timer(*case)
            except Exception as exc:
                label = case[0]["name"] if isinstance(case[0], dict) else case[0]
                log(f"error timing {what} at {label}: {exc}")
                traceback.print_exc()
            empty_cache()

    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(dict(command="bench/gpu/run.sh " + " ".join(argv or sys.argv[1:]),
                           environment=info, correctness=checks.rows,
                           timings=timings.rows,
                           seconds=time.perf_counter() - T0), f, indent=1)
    print()
    print(markdown(checks, timings))
    return 0 if checks.ok else 1


if __name__ == "__main__":
    sys.exit(main())
