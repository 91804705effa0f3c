"""``python -m bench cpu``: step caching against stock diffusers and its peers, in one run.

For each model case (the embedded model in text-to-image and text-to-video, tiny random
Wan and Flux) this measures, in one process:

* ``baseline``: the stock diffusers pipeline, no optimization;
* ``ours/<profile>``: our forecast step cache at each profile's settings;
* the peers at matched speed: running fewer steps, and diffusers' own FirstBlockCache,
  MagCache (calibrated on the model first), TaylorSeerCache, PyramidAttentionBroadcast and
  FasterCache. A peer's knob is searched so that it makes the same number of full denoiser
  computations as our profile (±5 %); a peer that cannot get there is reported with the
  nearest it reached, and a peer that skips no work at all is marked as doing nothing.

Per configuration: end-to-end latency of one prompt (median of ``--runs`` runs) and its
ratio to the baseline (each run sits between two baseline runs; the median over runs of the
mean of its two neighbours' times over its own), full denoiser computations (the denoiser's linear and
attention multiply-adds counted as they run, :class:`DenoiserWork`, in units of one full
call), peak resident set (MB; the process's highest RSS during the timed runs, and its
growth above the level before each run), PSNR and SSIM of the uint8 output
against the baseline output of the same prompt and seed, and, on the embedded model, the
adherence accuracy per attribute from :mod:`studio.tiny.evaluate`. Work and quality are the
mean over ``Case.quality_prompts``, each run alone as the studio runs a job (on the embedded
model ``QUALITY_PROMPTS``: the bench's own prompts plus held-out captions; the worst prompt's
SSIM is reported too); peers are matched on that same mean work. One or two prompts decide
nothing: on 2026-12-01 the two bench prompts ranked fewer steps above our cache while eight
ranked it below.

Writes ``bench/results/<date>-cpu.json``, a markdown table and a speed-versus-SSIM plot into
``docs/PERFORMANCE.md`` / ``docs/images/cpu-speed-quality.png``.

    python -m bench cpu                 # everything (about 20-40 minutes on 2 cores)
    python -m bench cpu --quick         # 2 runs, fewer prompts, no plot: a smoke test
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import os
import platform
import re
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from bench.adherence import paired_report
from bench.doc import DOC, weights_record, write_block

ROOT = Path(__file__).resolve().parents[1]
EMBEDDED = ROOT / "assets" / "models" / "tiny-wan"
PLOT = ROOT / "docs" / "images" / "cpu-speed-quality.png"
PROFILES = ("quality", "balanced", "fast")
#: Prompts over which work and quality are measured on the embedded model, per mode: the
#: bench's own, then held-out evaluation captions (``world.eval_prompts(seed=1)``).
QUALITY_PROMPTS = {"t2i": 8, "t2v": 4}
# the embedded model's default schedule: results of another length get their own files
DEFAULT_STEPS = 20


def steps_suffix(steps: int) -> str:
    """The file-name suffix of a run at ``steps`` (none for ``DEFAULT_STEPS``)."""
    return "" if steps == DEFAULT_STEPS else f"-{steps}steps"


# -- measuring ----------------------------------------------------------------------------
class DenoiserWork(TorchFunctionMode):
    """Counts the multiply-add work of the linear layers and attention run inside
    ``denoiser``'s forward (text encoders and the VAE are not counted).

    ``flops``: 2·tokens·in·out per ``F.linear``; 4·B·H·L·S·D per
    ``F.scaled_dot_product_attention`` (every attention diffusers runs on the CPU goes
    through it). Work skipped by a cache (whole blocks, attention only, or an MLP) is not
    counted, so ``flops / flops of one full call`` is the number of full denoiser
    computations a configuration actually made.
    """

    def __init__(self, denoiser: torch.nn.Module):
        super().__init__()
        self.flops = 0.0
        self.attention_calls = 0
        self.active = False
        self._handles = [
            denoiser.register_forward_pre_hook(lambda *_: setattr(self, "active", True)),
            denoiser.register_forward_hook(lambda *_: setattr(self, "active", False))]

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.active:
            if func is F.scaled_dot_product_attention:  # positional or by keyword
                q = args[0] if args else kwargs["query"]
                k = args[1] if len(args) > 1 else kwargs["key"]
                self.flops += 4.0 * q.numel() * k.shape[-2]
                self.attention_calls += 1
            elif func is F.linear:
                x = args[0] if args else kwargs["input"]
                w = args[1] if len(args) > 1 else kwargs["weight"]
                self.flops += 2.0 * (x.numel() // max(x.shape[-1], 1)) * w.shape[0] * w.shape[1]
        return func(*args, **kwargs)

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        return super().__exit__(*exc)


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRss:
    """Samples the resident set every 5 ms in a thread: ``highest`` is its maximum (bytes),
    ``peak`` that maximum above the level at entry (bytes). In one long process the growth
    reads about 0 once an earlier run has grown the allocator's pools, so ``highest`` is the
    figure to compare between configurations."""

    def __enter__(self):
        self.start = _rss()
        self.peak = 0
        self.highest = self.start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.wait(0.005):
            self._sample()

    def _sample(self):
        now = _rss()
        self.highest = max(self.highest, now)
        self.peak = max(self.peak, now - self.start)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._sample()


def psnr_ssim(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """PSNR (dB, inf when identical) and mean SSIM of uint8 (..., H, W, 3) arrays."""
    from skimage.metrics import peak_signal_noise_ratio, structural_similarity

    a2, b2 = a.reshape(-1, *a.shape[-3:]), b.reshape(-1, *b.shape[-3:])
    if np.array_equal(a2, b2):
        return float("inf"), 1.0
    psnr = float(peak_signal_noise_ratio(a2, b2, data_range=255))
    ssim = float(np.mean([structural_similarity(x, y, channel_axis=-1, data_range=255,
                                                win_size=min(7, x.shape[0] | 1, x.shape[1] | 1))
                          for x, y in zip(a2, b2, strict=True)]))
    return psnr, ssim


# -- cases --------------------------------------------------------------------------------
@dataclass
class Case:
    """One model and mode: how to run it and with how many steps."""

    name: str
    pipe: object
    call: Callable[[object, list[str], int, int], np.ndarray]  # (pipe, prompts, seed, steps)
    prompts: list[str]
    steps: int
    eval_mode: str | None = None  # adherence mode on the embedded model
    denoiser_calls_per_step: int = 2
    tuning: dict | None = None  # the model's studio.json levers (calibrated settings)
    # work and quality are measured over these, each run alone (prompt k with seed k), as the
    # studio runs one prompt per job; None: ``prompts``. The first must be ``prompts[0]``.
    quality_prompts: list[str] | None = None
    video: bool = False  # makes clips: the model's clip-only step cache settings hold

    @property
    def guided(self) -> bool:
        """Whether each step runs separate conditional and unconditional calls."""
        return self.denoiser_calls_per_step == 2


def _wan_call(frames: int, size: int, guidance: float, text_len: int | None):
    def call(pipe, prompts, seed, steps):
        extra = {"max_sequence_length": text_len} if text_len else {}
        gens = [torch.Generator().manual_seed(seed + i) for i in range(len(prompts))]
        out = pipe(prompt=prompts, negative_prompt=[""] * len(prompts), height=size,
                   width=size, num_frames=frames, num_inference_steps=steps,
                   guidance_scale=guidance, generator=gens, output_type="np", **extra).frames
        return (np.clip(np.asarray(out), 0, 1) * 255).round().astype(np.uint8)
    return call


def _flux_call(pipe, prompts, seed, steps):
    gens = [torch.Generator().manual_seed(seed + i) for i in range(len(prompts))]
    out = pipe(prompt=prompts, height=64, width=64, num_inference_steps=steps,
               guidance_scale=3.5, generator=gens, output_type="np").images
    return (np.clip(np.asarray(out), 0, 1) * 255).round().astype(np.uint8)


def quality_prompt_counts(text: str) -> dict[str, int]:
    """``"IMAGES,CLIPS"`` (``--quality-prompts``) -> ``{"t2i": IMAGES, "t2v": CLIPS}``.

    Raises:
        ValueError: not two integers, or images outside 2..200 (the bench's two prompts come
            first) or clips outside 1..100, naming ``--quality-prompts``.
    """
    try:
        images, clips = (int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--quality-prompts: {text!r} is not IMAGES,CLIPS (two integers, "
                         f"e.g. 8,4)") from None
    if not 2 <= images <= 200:
        raise ValueError(f"--quality-prompts: {images} images is outside 2..200")
    if not 1 <= clips <= 100:
        raise ValueError(f"--quality-prompts: {clips} clips is outside 1..100")
    return {"t2i": images, "t2v": clips}


def build_cases(tmp: Path, only: set[str] | None,
                quality_prompts: dict[str, int] | None = None) -> list[Case]:
    """The benchmark's cases; ``quality_prompts`` (mode -> count, default
    ``QUALITY_PROMPTS``) sets how many prompts the embedded model's work and quality are
    measured over."""
    from diffusers import DiffusionPipeline, FluxPipeline, WanPipeline

    from studio.engine.pipelines.base import derive_pipeline
    from studio.engine.pipelines.wan import fit_token_timesteps
    from studio.testing.tiny_pipelines import build_tiny_flux, build_tiny_wan

    cases = []
    prompts = ["a small red star in the top left corner on a grass background",
               "a large blue circle in the center on a sky background"]
    if not only or only & {"embedded-t2i", "embedded-t2v"}:
        base = DiffusionPipeline.from_pretrained(EMBEDDED, local_files_only=True)
        config = {k: base.config.get(k) for k in ("expand_timesteps",) if k in base.config}
        pipe = derive_pipeline(WanPipeline, base, **config)
        pipe.set_progress_bar_config(disable=True)
        fit_token_timesteps(pipe.transformer)  # as the Wan runner does (patch 4 on a 2x VAE)
        studio = json.loads((EMBEDDED / "studio.json").read_text())
        text_len = studio.get("call_kwargs", {}).get("max_sequence_length")
        guidance = float(studio.get("capabilities", {}).get("default_guidance", 5.0))
        from studio.tiny import world

        counts = {**QUALITY_PROMPTS, **(quality_prompts or {})}
        held_out = {m: [c for c, _ in world.eval_prompts(n, m, seed=1)] if n else []
                    for m, n in (("t2i", counts["t2i"] - 2), ("t2v", counts["t2v"] - 1))}
        if not only or "embedded-t2i" in only:
            cases.append(Case("embedded-t2i", pipe, _wan_call(1, 64, guidance, text_len),
                              prompts[:1], 20, "t2i", tuning=studio,
                              quality_prompts=[*prompts, *held_out["t2i"]]))
        if not only or "embedded-t2v" in only:
            cases.append(Case("embedded-t2v", pipe, _wan_call(9, 64, guidance, text_len),
                              prompts[:1], 20, "t2v", tuning=studio,
                              quality_prompts=[prompts[0], *held_out["t2v"]], video=True))
    if not only or "tiny-wan" in only:
        folder = build_tiny_wan(tmp / "wan", variant="t2v", num_layers=4, head_dim=32)
        pipe = WanPipeline.from_pretrained(folder, local_files_only=True)
        pipe.set_progress_bar_config(disable=True)
        cases.append(Case("tiny-wan", pipe, _wan_call(9, 64, 5.0, 32), prompts[:1], 20,
                          video=True))
    if not only or "tiny-flux" in only:
        folder = build_tiny_flux(tmp / "flux")
        pipe = FluxPipeline.from_pretrained(folder, local_files_only=True)
        pipe.set_progress_bar_config(disable=True)
        cases.append(Case("tiny-flux", pipe, _flux_call, prompts[:1], 20,
                          denoiser_calls_per_step=1))
    return cases


# -- methods ------------------------------------------------------------------------------
@dataclass
class Method:
    """One configuration: ``setup(transformer)`` before, ``teardown(transformer)`` after."""

    name: str
    kind: str  # baseline | ours | fewer-steps | peer
    setting: str = ""
    setup: Callable | None = None
    teardown: Callable | None = None
    steps: int | None = None
    info: dict = field(default_factory=dict)


def ours(profile: str, config=None, tuning: dict | None = None,
         steps: int | None = None, video: bool = False) -> Method:
    """The profile's levers as the engine sets them for a model with ``tuning`` (its
    studio.json: calibrated step cache settings, guidance reuse) for a job of ``steps``
    steps making a clip (``video``) or an image, or the step cache at ``config``."""
    from studio.engine.caching import apply_step_cache, remove_step_cache
    from studio.engine.caching.cfg_reuse import apply_cfg_reuse, remove_cfg_reuse
    from studio.engine.profiles import levers_for

    levers = levers_for(profile, "cpu", tuning, steps, video)
    cfg = config or levers.step_cache
    reuse = None if config is not None else levers.guidance_reuse

    def setup(t):
        apply_step_cache(t, cfg)
        if reuse is not None:
            apply_cfg_reuse(t, reuse)

    def teardown(t):
        remove_cfg_reuse(t)
        remove_step_cache(t)

    setting = cfg.describe()
    if reuse is not None:
        setting += f"; uncond every {reuse.interval} steps after {reuse.warmup_steps}"
    return Method(f"ours/{profile}", "ours", setting, setup=setup, teardown=teardown)


def ours_with_guidance_reuse(profile: str, reuse=None, tuning: dict | None = None,
                             steps: int | None = None, video: bool = False) -> Method:
    """Our step cache of ``profile`` plus guidance reuse (the unconditional branch every
    other step after 3 warm-up steps, its difference to the conditional one forecast)."""
    from studio.engine.caching import apply_step_cache, remove_step_cache
    from studio.engine.caching.cfg_reuse import CfgReuseConfig, apply_cfg_reuse, remove_cfg_reuse
    from studio.engine.profiles import levers_for

    cfg = levers_for(profile, "cpu", tuning, steps, video).step_cache
    reuse = reuse or CfgReuseConfig()

    def setup(t):
        apply_step_cache(t, cfg)
        apply_cfg_reuse(t, reuse)  # outer: a reused unconditional call costs nothing

    def teardown(t):
        remove_cfg_reuse(t)
        remove_step_cache(t)

    return Method(f"ours/{profile}+guidance-reuse", "ours",
                  f"threshold {cfg.threshold:g}, order {cfg.order}; uncond every "
                  f"{reuse.interval} steps after {reuse.warmup_steps}, order {reuse.order}",
                  setup=setup, teardown=teardown)


def ours_with_token_reuse(profile: str, reuse=None, tuning: dict | None = None,
                          steps: int | None = None, video: bool = True) -> Method:
    """Our step cache of ``profile`` plus token reuse on the full steps (each linear layer
    recomputes only the tokens whose input moved; issue 6's video redundancy lever)."""
    from studio.engine.caching import apply_step_cache, remove_step_cache
    from studio.engine.caching.token_reuse import (
        TokenReuseConfig,
        apply_token_reuse,
        remove_token_reuse,
    )
    from studio.engine.profiles import levers_for

    cfg = levers_for(profile, "cpu", tuning, steps, video).step_cache
    reuse = reuse or TokenReuseConfig()

    def setup(t):
        apply_token_reuse(t, reuse)
        apply_step_cache(t, cfg)

    def teardown(t):
        remove_step_cache(t)
        remove_token_reuse(t)

    return Method(f"ours/{profile}+token-reuse", "ours",
                  f"threshold {cfg.threshold:g}, order {cfg.order}; tokens moved > "
                  f"{reuse.threshold:g} recomputed", setup=setup, teardown=teardown)


def diffusers_cache(name: str, config, setting: str) -> Method:
    def setup(t):
        t.enable_cache(copy.deepcopy(config))

    def teardown(t):
        t.disable_cache()

    return Method(name, "peer", setting, setup=setup, teardown=teardown)


def _timestep_callback(pipe):
    return lambda: int(getattr(pipe, "_current_timestep", None) or 0)


def peer_family(name: str, pipe, case: Case, mag_ratios) -> tuple[Callable[[float], Method],
                                                                   list[float], bool]:
    """(make(knob) -> Method, knob grid (ascending speed), continuous?) for one peer."""
    from diffusers import (
        FasterCacheConfig,
        FirstBlockCacheConfig,
        MagCacheConfig,
        PyramidAttentionBroadcastConfig,
        TaylorSeerCacheConfig,
    )

    steps = case.steps
    if name == "fewer-steps":
        def make(k):
            return Method(f"fewer-steps/{int(k)}", "fewer-steps", f"{int(k)} steps",
                          steps=int(k))
        return make, [float(s) for s in range(steps - 1, 1, -1)], False
    if name == "first-block-cache":
        def make(k):
            return diffusers_cache(f"{name}/{k:.3g}", FirstBlockCacheConfig(threshold=k),
                                   f"threshold {k:.3g}")
        return make, [0.02, 4.0], True
    if name == "mag-cache":
        def make(k):
            return diffusers_cache(f"{name}/{k:.3g}", MagCacheConfig(
                threshold=k, max_skip_steps=4, retention_ratio=0.1, num_inference_steps=steps,
                mag_ratios=mag_ratios), f"threshold {k:.3g}, ≤4 skips")
        return make, [0.005, 2.0], True
    if name == "taylorseer":
        def make(k):
            return diffusers_cache(f"{name}/{int(k)}", TaylorSeerCacheConfig(
                cache_interval=int(k), disable_cache_before_step=2, max_order=1,
                taylor_factors_dtype=torch.float32, use_lite_mode=True),
                f"interval {int(k)}, lite")
        return make, [2.0, 3.0, 4.0, 5.0, 6.0, 8.0], False
    if name == "pyramid-attention-broadcast":
        def make(k):
            return diffusers_cache(f"{name}/{int(k)}", PyramidAttentionBroadcastConfig(
                spatial_attention_block_skip_range=int(k),
                spatial_attention_timestep_skip_range=(-1, 1001),
                current_timestep_callback=_timestep_callback(pipe)), f"skip range {int(k)}")
        return make, [2.0, 3.0, 4.0, 6.0, 8.0], False
    if name == "faster-cache":
        def make(k):
            return diffusers_cache(f"{name}/{int(k)}", FasterCacheConfig(
                spatial_attention_block_skip_range=int(k),
                # its first call must compute (diffusers 0.42 fails on an empty cache)
                spatial_attention_timestep_skip_range=(-1, 950),
                unconditional_batch_skip_range=int(k),
                unconditional_batch_timestep_skip_range=(-1, 950),
                current_timestep_callback=_timestep_callback(pipe),
                attention_weight_callback=lambda _: 0.5,
                is_guidance_distilled=case.denoiser_calls_per_step == 1),
                f"skip range {int(k)}")
        return make, [2.0, 3.0, 4.0, 6.0], False
    raise ValueError(f"peer: unknown {name!r}")


PEERS = ("fewer-steps", "first-block-cache", "mag-cache", "taylorseer",
         "pyramid-attention-broadcast", "faster-cache")


def calibrate_mag_ratios(case: Case) -> list[float] | None:
    """MagCache's per-step magnitude ratios for this model, from its own calibration mode."""
    from diffusers import MagCacheConfig

    t = case.pipe.transformer
    try:
        t.enable_cache(MagCacheConfig(calibrate=True, num_inference_steps=case.steps))
    except (ValueError, TypeError, AttributeError):
        return None
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            case.call(case.pipe, case.prompts[:1], 0, case.steps)
    finally:
        t.disable_cache()
    found = re.findall(r"\[([-0-9.,\se]+)\]", buf.getvalue())
    return [float(x) for x in found[0].split(",")] if found else None


# -- running ------------------------------------------------------------------------------
BASELINE = Method("baseline", "baseline", "stock diffusers")


class Runner:
    def __init__(self, case: Case, runs: int, adherence_n: int):
        self.case, self.runs, self.adherence_n = case, runs, adherence_n
        self.baseline: dict | None = None
        self.baseline_out: np.ndarray | None = None
        self.baseline_outs: list[np.ndarray] | None = None  # per quality prompt
        self.flops_per_call: float = 1.0
        self.baseline_details: list[dict] | None = None  # the baseline's evaluator details

    def once(self, method: Method, count: bool = True, prompts: list[str] | None = None,
             seed: int = 0) -> tuple[np.ndarray, float, float, PeakRss]:
        """(output, denoiser flops, seconds, resident-set record) of one run of ``prompts`` (default:
        the case's) from ``seed``. With ``count`` the work is counted (:class:`DenoiserWork` intercepts every torch call in Python, which
        slows a small model down: such a run's seconds are not a latency); without it the
        flops are 0."""
        case, t = self.case, self.case.pipe.transformer
        if method.setup:
            method.setup(t)
        try:
            counter = DenoiserWork(t) if count else contextlib.nullcontext()
            with PeakRss() as rss, counter:
                t0 = time.perf_counter()
                out = case.call(case.pipe, prompts or case.prompts, seed,
                                method.steps or case.steps)
                seconds = time.perf_counter() - t0
        finally:
            if method.teardown:
                method.teardown(t)
        return out, counter.flops if count else 0.0, seconds, rss

    def units(self, method: Method) -> tuple[float, np.ndarray]:
        out, flops, _, _ = self.once(method)
        return flops / self.flops_per_call, out

    def quality_runs(self, method: Method) -> tuple[list[float], list[np.ndarray]]:
        """Counted flops and output of each quality prompt run alone (prompt k, seed k)."""
        flops, outs = [], []
        for k, prompt in enumerate(self.case.quality_prompts or self.case.prompts):
            out, f, _, _ = self.once(method, prompts=[prompt], seed=k)
            flops.append(f)
            outs.append(out)
        return flops, outs

    def work(self, method: Method) -> float:
        """Mean full denoiser calls over the quality prompts (for matching peers)."""
        flops, _ = self.quality_runs(method)
        return float(np.mean(flops)) / self.flops_per_call

    def measure(self, method: Method, adherence: bool = True) -> dict:
        """One row: the work and output of a counted run, then ``runs`` timed runs, each
        between two timed baseline runs once the baseline is known (B M B M ... M B:
        ``runs + 1`` baseline runs): a run's ratio is the mean of its two neighbours' times
        over its own, and the speed-up is the median of those ratios. A slow or fast spell
        of a shared machine (seen here: the same configuration ±40 % from one minute to the
        next) then hits both sides of a ratio rather than one configuration's whole
        measurement, and a steady drift cancels to first order (a baseline run on one side
        only left it in: on 2026-12-03 five such pairs read fast at ×2.97 where twelve
        sandwiched runs read ×3.31)."""
        flops_each, outs = self.quality_runs(method)  # the work and the outputs
        flops, out, highest, growth = float(np.mean(flops_each)), outs[0], 0, 0
        times, base_times, repeatable = [], [], True
        for _ in range(self.runs):  # the latency: timed without the work counter
            if self.baseline is not None:
                base_times.append(self.once(BASELINE, count=False)[2])
            timed, _, seconds, rss = self.once(method, count=False)
            repeatable &= bool(np.array_equal(timed, out))
            times.append(seconds)
            highest, growth = max(highest, rss.highest), max(growth, rss.peak)
        if self.baseline is not None:  # the closing baseline run of the last sandwich
            base_times.append(self.once(BASELINE, count=False)[2])
        if not repeatable:  # state leaking between runs would show here
            print(f"  warning: {method.name}: a timed run's output differs from the first run's",
                  flush=True)
        row = {"case": self.case.name, "method": method.name, "kind": method.kind,
               "setting": method.setting, "latency_s": statistics.median(times),
               "latencies_s": [round(x, 4) for x in times], "peak_rss_mb": highest / 2**20,
               "rss_growth_mb": growth / 2**20,
               "denoiser_gflop": flops / 1e9, "repeatable": repeatable, **method.info}
        if self.baseline is None:  # the baseline: one full denoiser call = this many
            self.baseline_out, self.baseline_outs = out, outs
            self.flops_per_call = flops / (self.case.steps * self.case.denoiser_calls_per_step)
        row["full_denoiser_calls"] = round(flops / self.flops_per_call, 2)
        # the timed prompt is quality prompt 0 (same prompt and seed): its own work, which is
        # what its latency reflects (an adaptive cache's work varies by prompt)
        row["timed_prompt_calls"] = round(flops_each[0] / self.flops_per_call, 2)
        row["quality_prompts"] = len(outs)
        scores = [psnr_ssim(o, b) for o, b in zip(outs, self.baseline_outs, strict=True)]
        psnrs, ssims = [p for p, _ in scores], [q for _, q in scores]
        row["ssim"], row["ssim_worst"] = float(np.mean(ssims)), float(np.min(ssims))
        row["ssim_per_prompt"] = [round(q, 4) for q in ssims]
        # mean PSNR with identical outputs counted as 99 dB (∞ only when all are identical)
        row["psnr_db"] = (float("inf") if all(np.isinf(psnrs))
                          else float(np.mean([min(p, 99.0) for p in psnrs])))
        if self.baseline is not None:
            row["baseline_latencies_s"] = [round(x, 4) for x in base_times]
            ratios = [(before + after) / 2 / m for before, after, m in
                      zip(base_times[:-1], base_times[1:], times, strict=True)]
            row["speedup"] = statistics.median(ratios)
            row["speedups"] = [round(x, 3) for x in ratios]
            if len(ratios) >= 4:  # the middle half of the runs' ratios: how far to trust it
                q1, _, q3 = statistics.quantiles(ratios, n=4)
                row["speedup_quartiles"] = [round(q1, 3), round(q3, 3)]
            row["work_ratio"] = self.baseline["full_denoiser_calls"] / max(
                row["full_denoiser_calls"], 1e-9)
        else:
            row["speedup"] = row["work_ratio"] = 1.0
        if self.case.eval_mode and self.adherence_n and adherence:
            report = self.adherence_report(method)
            row["adherence"] = {k: round(v * 100, 1) for k, v in report.accuracy.items()}
            if method is BASELINE:
                self.baseline_details = report.details
            elif self.baseline_details is not None:  # the same prompts, seeds and batches
                row["adherence_paired"] = paired_report(self.baseline_details, report.details)
        print(f"  {row['method']:<36} {row['latency_s']:.3f}s ×{row['speedup']:.2f} "
              f"calls {row['full_denoiser_calls']:.1f} SSIM {row['ssim']:.4f} (worst "
              f"{row['ssim_worst']:.4f}) PSNR {row['psnr_db']:.1f}", flush=True)
        return row

    def adherence_report(self, method: Method, seed: int = 0):
        """The evaluator's report (``studio.tiny.evaluate.EvalReport``, per-sample details
        included) on ``adherence_n`` held-out prompts (``world.eval_prompts(seed=seed)``,
        batches of 8, seed 0 for every batch) generated under ``method``."""
        from studio.tiny import evaluate

        case, t = self.case, self.case.pipe.transformer
        if method.setup:
            method.setup(t)
        try:
            return evaluate.score_mode(
                lambda caps: _squeeze(case.call(case.pipe, caps, 0, method.steps or case.steps),
                                      case.eval_mode),
                case.eval_mode, n=self.adherence_n, seed=seed, batch_size=8)
        finally:
            if method.teardown:
                method.teardown(t)

    def adherence(self, method: Method, seed: int = 0) -> dict[str, float]:
        """Per attribute, the % of ``adherence_n`` held-out prompts
        (``world.eval_prompts(seed=seed)``, batches of 8) the evaluator scores correct."""
        report = self.adherence_report(method, seed)
        return {k: round(v * 100, 1) for k, v in report.accuracy.items()}


def _squeeze(out: np.ndarray, mode: str) -> np.ndarray:
    return out[:, 0] if mode == "t2i" and out.ndim == 5 else out


def match(runner: Runner, make: Callable[[float], Method], grid: list[float],
          continuous: bool, target: float) -> tuple[Method, float]:
    """The knob setting whose full denoiser calls are nearest ``target`` (bisection for a
    continuous knob, nearest grid point otherwise)."""
    if not continuous:
        best = None
        for k in grid:
            m = make(k)
            u = runner.work(m)
            if best is None or abs(u - target) < abs(best[1] - target):
                best = (m, u)
            if u < target * 0.95:
                break
        return best
    lo, hi = grid
    best = None
    for _ in range(10):
        mid = (lo * hi) ** 0.5  # geometric: thresholds span decades
        m = make(mid)
        u = runner.work(m)
        if best is None or abs(u - target) < abs(best[1] - target):
            best = (m, u)
        if abs(u - target) <= 0.05 * target:
            break
        if u > target:
            lo = mid
        else:
            hi = mid
    return best


def run_case(case: Case, runs: int, adherence_n: int, peers: tuple[str, ...],
             combined: bool = True, peer_adherence: bool = True) -> list[dict]:
    """The rows of one case: the baseline, each profile's step cache (with ``combined``,
    also plus guidance reuse and, for video, token reuse), each usable peer matched to it.

    A profile that takes the same setting as an earlier one (at 50 steps fast takes
    balanced's) makes the same work, so its peers are the ones matched for that earlier
    profile: their rows are repeated under it rather than matched and timed again. Without
    ``peer_adherence`` the peers' rows carry no adherence (the bars concern our cache's;
    scoring 96 clips per peer row costs more than the rest of the run)."""
    print(f"[{case.name}] {case.steps} steps", flush=True)
    runner = Runner(case, runs, adherence_n)
    rows = [runner.measure(BASELINE)]
    runner.baseline = rows[0]
    mag_ratios = calibrate_mag_ratios(case) if "mag-cache" in peers else None
    full = rows[0]["full_denoiser_calls"]
    usable = {}
    for peer in peers:  # is the peer able to skip anything on this model at all?
        if peer == "mag-cache" and mag_ratios is None:
            rows.append(_status_row(case, peer, "not supported on this model"))
            continue
        make, grid, continuous = peer_family(peer, case.pipe, case, mag_ratios)
        try:
            most = runner.work(make(grid[-1]))
        except Exception as exc:  # a peer that breaks on this model is reported, not fatal
            rows.append(_status_row(case, peer, f"fails: {type(exc).__name__}: "
                                                f"{str(exc)[:120]}"))
            continue
        if most >= full * 0.999:
            rows.append(_status_row(case, peer, "skips no denoiser work even at its most "
                                                "aggressive setting: does nothing here"))
            continue
        usable[peer] = (make, grid, continuous)
    matched: dict[str, list[dict]] = {}  # our setting -> the peer rows matched to it
    for profile in PROFILES:
        mine = runner.measure(ours(profile, tuning=case.tuning, steps=case.steps,
                                   video=case.video))
        mine["profile"] = profile
        rows.append(mine)
        if combined and case.guided:  # the lever acts on separate cond/uncond calls
            extra = runner.measure(ours_with_guidance_reuse(profile, tuning=case.tuning,
                                                            steps=case.steps,
                                                            video=case.video))
            extra["profile"] = profile
            rows.append(extra)
        if combined and case.eval_mode == "t2v":  # video: tokens that do not move across steps
            extra = runner.measure(ours_with_token_reuse(profile, tuning=case.tuning,
                                                         steps=case.steps, video=True))
            extra["profile"] = profile
            rows.append(extra)
        target = mine["full_denoiser_calls"]
        if mine["setting"] in matched:  # the same setting as an earlier profile's
            for row in matched[mine["setting"]]:
                rows.append({**copy.deepcopy(row), "profile": profile,
                             "same_as_profile": row["profile"],
                             "status": f"{row['status']} (the {row['profile']} row: same "
                                       f"setting)"})
            continue
        matched[mine["setting"]] = []
        for peer, (make, grid, continuous) in usable.items():
            if peer == "fewer-steps":  # k steps make k calls per step: start next to it
                near = round(target / case.denoiser_calls_per_step)
                grid = [float(k) for k in range(min(near + 1, case.steps - 1), 1, -1)]
            method, _ = match(runner, make, grid, continuous, target)
            row = runner.measure(method, adherence=peer_adherence)
            row.update(profile=profile, peer=peer)
            if abs(row["full_denoiser_calls"] - target) <= 0.05 * target:
                row["status"] = "matched"
            else:
                row["status"] = (f"unmatched: nearest {row['full_denoiser_calls']:.1f} calls "
                                 f"vs {target:.1f}")
            rows.append(row)
            matched[mine["setting"]].append(row)
    return rows


def _status_row(case: Case, peer: str, status: str) -> dict:
    print(f"  {peer:<36} {status}", flush=True)
    return {"case": case.name, "method": peer, "kind": "peer", "peer": peer, "status": status}


# -- reporting ----------------------------------------------------------------------------
def _spread(row: dict) -> str:
    """`` (q1–q3)``: the quartiles of a row's per-run speed-ups, when it has them."""
    q = row.get("speedup_quartiles")
    return f" ({q[0]:.2f}–{q[1]:.2f})" if q else ""


def _adherence_cell(row: dict, attr: str) -> str:
    """``48.4 (−3.2; 8:1*)``: a row's accuracy on ``attr``, with its paired change against
    stock when it has one."""
    value = row["adherence"].get(attr, float("nan"))
    if value != value:  # not scored in this mode (motion on images)
        return "—"
    text = f"{value:.1f}"
    flip = row.get("adherence_paired", {}).get(attr)
    if flip:
        star = "*" if flip["p_value"] < 0.05 else ""
        text += f" ({flip['points']:+.1f}; {flip['lost']}:{flip['gained']}{star})"
    return text


def markdown(rows: list[dict], command: str) -> str:
    lines = [f"Command: `{command}`", "",
             "| case | profile | method | setting | full calls | speed-up (quartiles) | "
             "SSIM (worst) | PSNR dB | peak RSS MB | status |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "latency_s" not in r:
            lines.append(f"| {r['case']} | {r.get('profile', '')} | {r['method']} | | | | | | "
                         f"| {r.get('status', '')} |")
            continue
        psnr = "∞" if r["psnr_db"] == float("inf") else f"{r['psnr_db']:.1f}"
        # runs before 2026-12-05 kept only the growth above the level at each run's start
        rss = f"{r['peak_rss_mb']:.0f}" if "rss_growth_mb" in r else ""
        lines.append(f"| {r['case']} | {r.get('profile', '')} | {r['method']} | {r['setting']} "
                     f"| {r['full_denoiser_calls']:.1f} | ×{r['speedup']:.2f}{_spread(r)} | "
                     f"{r['ssim']:.3f} ({r.get('ssim_worst', r['ssim']):.3f}) | {psnr} | "
                     f"{rss} | {r.get('status', '')} |")
    adh = [r for r in rows if "adherence" in r]
    if adh:
        attrs = sorted({k for r in adh for k in r["adherence"]})
        lines += ["", "Adherence (% correct per attribute, embedded model's evaluator; beside "
                      "each row's figure, paired with stock's on the same prompts and seeds: "
                      "the change in points and the items lost:gained, * when the exact "
                      "McNemar p < 0.05):", "",
                  "| case | method | " + " | ".join(attrs) + " |",
                  "|---|---|" + "---|" * len(attrs)]
        for r in adh:
            lines.append(f"| {r['case']} | {r['method']} | " +
                         " | ".join(_adherence_cell(r, a) for a in attrs) + " |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = sorted({r["case"] for r in rows if "latency_s" in r})
    fig, axes = plt.subplots(1, len(cases), figsize=(4.2 * len(cases), 3.6), squeeze=False)
    for ax, case in zip(axes[0], cases, strict=True):
        by_method: dict[str, list] = {}
        for r in rows:
            if r["case"] == case and "latency_s" in r and r["kind"] != "baseline":
                key = r.get("peer") or r["kind"]
                if r["kind"] == "ours" and "+" in r["method"]:  # ours plus another lever
                    key = "ours+" + r["method"].split("+", 1)[1]
                by_method.setdefault(key, []).append((r["speedup"], r["ssim"]))
        for key, pts in sorted(by_method.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-" if key == "ours" else "x--",
                    label=key, linewidth=2.2 if key == "ours" else 1)
        ax.set_title(case)
        ax.set_xlabel("speed-up vs stock diffusers (×)")
        ax.set_ylabel("SSIM vs stock output")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def plot_path(steps: int) -> Path:
    """The speed-versus-quality plot of a run at ``steps`` (20: the default one)."""
    return PLOT.with_name(f"{PLOT.stem}{steps_suffix(steps)}{PLOT.suffix}")


def write_doc(table: str, plotted: bool, steps: int = DEFAULT_STEPS) -> None:
    """Puts the table (and plot) into docs/PERFORMANCE.md: the block ``cpu`` for the default
    20 steps, ``cpu-<steps>steps`` for another schedule length."""
    if plotted:
        rel = plot_path(steps).relative_to(DOC.parent).as_posix()
        table += f"\n\n![speed versus quality]({rel})"
    if steps == DEFAULT_STEPS:
        write_block("cpu", table, "Step caching on the CPU (`python -m bench cpu`)")
    else:
        write_block(f"cpu-{steps}steps", table,
                    f"Step caching on the CPU at {steps} steps (`python -m bench cpu --steps "
                    f"{steps}`)")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench cpu", description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="timed runs per configuration (≥1)")
    ap.add_argument("--cases", default="", help="comma list of embedded-t2i, embedded-t2v, "
                    "tiny-wan, tiny-flux (default all)")
    ap.add_argument("--peers", default=",".join(PEERS), help="comma list of peers")
    ap.add_argument("--adherence-prompts", type=int, default=32,
                    help="held-out prompts scored per configuration on the embedded model")
    ap.add_argument("--quality-prompts", default=None, metavar="IMAGES,CLIPS",
                    help="prompts the embedded model's work and SSIM are measured over "
                         f"(default {QUALITY_PROMPTS['t2i']},{QUALITY_PROMPTS['t2v']})")
    ap.add_argument("--no-peer-adherence", action="store_true",
                    help="score adherence for the baseline and our cache only")
    ap.add_argument("--quick", action="store_true", help="2 runs, 4 prompts, no doc update")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    ap.add_argument("--steps", type=int, default=DEFAULT_STEPS,
                    help="denoising steps of every case (default 20, the embedded model's "
                         "default; diffusers' Wan and Flux pipelines default to 50 and 28)")
    ap.add_argument("--cache-only", action="store_true",
                    help="our step cache alone per profile: no rows with guidance or token "
                         "reuse added")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs: must be at least 1")
    if not 4 <= args.steps <= 200:
        ap.error(f"--steps: {args.steps} must be in 4..200")
    peers = tuple(p for p in args.peers.split(",") if p)
    bad = set(peers) - set(PEERS)
    if bad:
        ap.error(f"--peers: unknown {', '.join(sorted(bad))}; allowed {', '.join(PEERS)}")
    if args.adherence_prompts < 0:
        ap.error("--adherence-prompts: must be 0 or more")
    quality = None
    if args.quality_prompts:
        try:
            quality = quality_prompt_counts(args.quality_prompts)
        except ValueError as exc:
            ap.error(str(exc))
    if args.quick:
        args.runs, args.adherence_prompts = 2, 4
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    only = {c for c in args.cases.split(",") if c} or None
    rows: list[dict] = []
    started = time.time()
    command = "python -m bench cpu " + " ".join(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = (f"{time.strftime('%Y-%m-%d')}-cpu{steps_suffix(args.steps)}"
            f"{'-quick' if args.quick else ''}.json")

    weights = weights_record(EMBEDDED)

    def save(partial: bool) -> dict:
        """The result so far, written atomically after each case (``partial`` until the
        last), so a run cut off keeps the cases it finished."""
        result = {"command": command.strip(), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                  "seconds": round(time.time() - started, 1), "machine": platform.platform(),
                  "cpu_threads": torch.get_num_threads(), "torch": torch.__version__,
                  "steps": args.steps, "weights": weights, "partial": partial, "rows": rows}
        tmp_file = out / (name + ".tmp")
        tmp_file.write_text(json.dumps(result, indent=1, default=str))
        tmp_file.replace(out / name)
        return result

    with tempfile.TemporaryDirectory() as tmp, torch.inference_mode():
        for case in build_cases(Path(tmp), only, quality):
            case.steps = args.steps
            rows += run_case(case, args.runs, args.adherence_prompts, peers,
                             combined=not args.cache_only,
                             peer_adherence=not args.no_peer_adherence)
            save(partial=True)
    result = save(partial=False)
    table = markdown(rows, result["command"])
    print(table)
    if not args.quick:
        plot(rows, plot_path(args.steps))
        write_doc(table, plotted=True, steps=args.steps)
    print(f"wrote {out / name}")
    return 0
