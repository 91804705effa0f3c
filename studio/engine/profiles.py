"""Optimization profiles: which levers each named profile turns on, on each kind of device.

A request names a profile (``exact``, ``quality``, ``balanced``, ``fast``); the runner turns
it into :class:`ProfileLevers` with :func:`levers_for` and applies them to the loaded model
with :func:`apply_levers` before the job, undoing what the previous job set. ``exact`` is
numerically the stock diffusers result (every lever off).

Per-model tuning: a model folder's ``studio.json`` may carry ``"step_cache": {"balanced":
{"threshold": 0.2}, ...}``, calibrated for that model with ``python -m bench calibrate``; its
fields replace the profile's defaults for that model. A profile's entry may also be a list of
such settings, each with the schedule length it was calibrated at (``"steps": 20``): a job
takes the one calibrated nearest its own number of steps (a 20-step trajectory allows fewer
skips in a row than a 50-step one; :func:`tuning_for_steps`). A setting with ``"video": true``
(or false) was calibrated on clips (or images) only and holds only for such jobs: a clip's
output and an image may need different settings for the same quality, and the calibration
measures each.

The table of levers, as shipped (``python -m studio.engine.profiles`` prints it):
see :data:`PROFILE_TABLE_HEADER` and :func:`profile_table`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import torch

from studio.core.request import PROFILES
from studio.engine.caching import (
    StepCacheConfig,
    StepCacheStats,
    apply_step_cache,
    remove_step_cache,
    reset_step_cache,
)
from studio.engine.caching.cfg_reuse import (
    CfgReuseConfig,
    apply_cfg_reuse,
    remove_cfg_reuse,
    reset_cfg_reuse,
)
from studio.engine.caching.step_cache import transformer_blocks

log = logging.getLogger(__name__)

# Default cache settings per profile (the embedded model's calibration; studio.json overrides).
DEFAULT_STEP_CACHE = {
    "quality": StepCacheConfig(threshold=0.08, order=1, warmup_steps=3, max_consecutive_skips=1),
    "balanced": StepCacheConfig(threshold=0.25, order=1, warmup_steps=2, max_consecutive_skips=2),
    "fast": StepCacheConfig(threshold=0.6, order=1, warmup_steps=2, max_consecutive_skips=4),
}


# Attention per profile on CUDA devices (studio.engine.attention). quality keeps PyTorch's SDPA;
# balanced runs our INT8 SageAttention-style kernel where SDPA's default is FlashAttention-2;
# fast adds block-sparse local windows for video self-attention. On Hopper (compute capability
# >= 9.0) PyTorch's default SDPA is cuDNN's attention, which ran 1.5-1.9x FlashAttention-2 and
# as fast as our sage kernel at the Wan 720p shape and faster at the Flux 1024² shape on an
# H200 (bench/results/2026-11-30-h200-run3-run.log): balanced keeps SDPA there.
GPU_ATTENTION = {"quality": "sdpa", "balanced": "sage", "fast": "sparse"}
SDPA_WINS_FROM_CAPABILITY = (9, 0)
# fast's sparse attention runs dense (sage) at timesteps >= this (0-1000): the dense warm-up of
# Sparse VideoGen and Radial Attention, by noise level. On the embedded model every later start
# of sparsity held more of the stock adherence (motion -59, -23, -12, -3 points sparse from
# timestep 1000, 700, 450, 250; bench/results/2026-12-07-kernel-quality-*.json) and none held
# all of it: its studio.json turns sparsity off (``"attention": {"fast": "sage"}``). 900 is
# the first ~35 % of a 50-step Wan schedule at shift 5 dense, near those papers' warm-ups;
# its quality on real Wan weights is not measured yet.
FAST_SPARSE_BELOW_TIMESTEP = 900.0


@dataclass(frozen=True)
class ProfileLevers:
    """The levers one profile turns on for one model on one device.

    Attributes:
        profile: the profile's name.
        step_cache: forecast step cache settings, or None (off).
        precision: the denoiser's weight precision (:mod:`studio.engine.precision`):
            ``"as-loaded"`` (the model's dtype) or a low-precision transform; a runner is
            loaded per precision.
        attention: ``"sdpa"`` (PyTorch's, via diffusers) or one of our kernels routed in by
            :mod:`studio.engine.attention`: ``"flash"``, ``"sage"``, ``"sparse"``.
        compile: whether the denoiser's repeated blocks are compiled with torch.compile
            (:mod:`studio.engine.compile`); off in every profile until the GPU benchmark
            has measured it.
        guidance_reuse: when the unconditional branch is computed
            (:class:`~studio.engine.caching.cfg_reuse.CfgReuseConfig`: every other step after
            a warm-up, its difference to the conditional one forecast in between), or None
            (always). Off unless the model's ``studio.json`` turns it on for the profile
            (``"guidance_reuse": {"balanced": {"interval": 2}}``, from ``python -m bench
            calibrate``); off under CFG parallelism.
        fused_blocks: the DiT blocks' AdaLN norms, QK-norm + RoPE and gated residuals run
            our fused kernels (:mod:`studio.engine.fused_blocks`; Wan-family blocks; the
            math is stock's, so outputs agree to rounding).
        attention_config: the full attention settings when the ``STUDIO_ATTENTION``
            environment variable forces them (every profile, any device; see
            :func:`studio.engine.attention.attention_override`), else None.
        attention_tuned: the model's own attention settings for this profile on CUDA, from
            its studio.json (``"attention": {"fast": "sage"}``, the ``STUDIO_ATTENTION``
            format), else None.
    """

    profile: str
    step_cache: StepCacheConfig | None = None
    precision: str = "as-loaded"
    attention: str = "sdpa"
    compile: bool = False
    guidance_reuse: CfgReuseConfig | None = None
    attention_config: object | None = None  # an AttentionConfig forced by STUDIO_ATTENTION
    fused_blocks: bool = False
    attention_tuned: object | None = None  # an AttentionConfig from the model's studio.json

    def attention_settings(self):
        """The :class:`~studio.engine.attention.AttentionConfig` this profile runs."""
        from studio.engine.attention import AttentionConfig

        if self.attention_config is not None:
            return self.attention_config
        if self.attention_tuned is not None:
            return self.attention_tuned
        sparse = self.attention == "sparse"
        return AttentionConfig(kernel=self.attention, sparse_inner="sage" if sparse else "flash",
                               sparse_below_timestep=FAST_SPARSE_BELOW_TIMESTEP if sparse
                               else 1000.0)

    def describe(self) -> str:
        """One line for the user: what this run turned on."""
        parts = []
        if self.step_cache is not None:
            parts.append(f"step cache ({self.step_cache.describe()})")
        if self.guidance_reuse is not None:
            parts.append(f"guidance reuse (unconditional branch every "
                         f"{self.guidance_reuse.interval} steps after "
                         f"{self.guidance_reuse.warmup_steps})")
        parts.append(f"precision {self.precision}")
        parts.append(f"attention {self.attention}")
        if self.fused_blocks:
            parts.append("fused block ops")
        if self.compile:
            parts.append("torch.compile")
        return f"profile {self.profile}: " + ", ".join(parts)


def tuning_for_steps(entry: dict | list | None, steps: int | None, where: str,
                     video: bool | None = None) -> dict | None:
    """The calibrated setting of one profile for a job of ``steps`` denoising steps.

    Args:
        entry: a studio.json ``step_cache.<profile>`` value: one setting (a dict, for every
            step count) or a list of settings each with ``"steps"``, the schedule length it
            was calibrated at, and optionally ``"video"``: true for a setting calibrated on
            clips only (jobs of 2+ frames), false for one calibrated on images only; a
            setting without it holds for both.
        steps: the job's number of steps; None takes the first setting that holds.
        where: the field's name for errors (``"studio.json step_cache.fast"``).
        video: whether the job makes a clip (None: unknown; only settings without
            ``"video"`` hold).
    Returns:
        The setting's fields without ``"steps"`` and ``"video"`` (None: no entry, or none
        that holds for the job). Of a list, among the settings that hold, the one
        calibrated nearest ``steps`` on a log scale; at the same distance one naming the
        job's kind wins over one for both, then the shorter schedule.
    Raises:
        ValueError: a list item that is not a dict with a positive integer ``"steps"``, or
            a ``"video"`` that is not true or false.
    """
    import math

    if not entry:
        return None
    if isinstance(entry, dict):
        return {k: v for k, v in entry.items() if k not in ("steps", "video")}
    if not isinstance(entry, list):
        raise ValueError(f"{where}: expected a setting or a list of settings, got "
                         f"{type(entry).__name__}")
    for i, item in enumerate(entry):
        n = item.get("steps") if isinstance(item, dict) else None
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{where}[{i}]: each setting of a list needs \"steps\", the "
                             "positive integer number of steps it was calibrated at")
        if not isinstance(item.get("video", False), bool):
            raise ValueError(f"{where}[{i}].video: must be true (clips only) or false "
                             f"(images only), got {item['video']!r}")
    held = [it for it in entry if "video" not in it or (video is not None
                                                        and it["video"] == video)]
    if not held:
        return None
    if steps is None:
        chosen = held[0]
    else:
        chosen = min(held, key=lambda it: (abs(math.log(max(steps, 1) / it["steps"])),
                                           "video" not in it, it["steps"]))
    setting = {k: v for k, v in chosen.items() if k not in ("steps", "video")}
    if setting.get("schedule") and steps is not None and steps != chosen["steps"]:
        setting["schedule"] = stretch_schedule(setting["schedule"], chosen["steps"], steps,
                                               f"{where} schedule")
    return setting


def levers_from_step(levers: ProfileLevers, start: int) -> ProfileLevers:
    """``levers`` for a trajectory that starts at step ``start`` of its schedule (image to
    image at strength s runs the last ``int(steps * s)`` steps, so ``start = steps -
    int(steps * s)``): the step cache's schedule counts calls from the trajectory's first
    call, so its indices move back by ``start`` (those before it are dropped; the warm-up
    still computes the first calls in full)."""
    cache = levers.step_cache
    if cache is None or not cache.schedule or start <= 0:
        return levers
    return replace(levers, step_cache=replace(
        cache, schedule=tuple(i - start for i in cache.schedule if i >= start)))


def stretch_schedule(schedule, length: int, steps: int, where: str) -> list[int]:
    """A step cache ``schedule`` (full-call indices of a ``length``-step trajectory) for a
    trajectory of ``steps`` steps: each index moved to the same place along it
    (``round(i * (steps - 1) / (length - 1))``), duplicates dropped.

    Raises:
        ValueError: an index that is not an integer in ``0..length - 1``, naming ``where``.
    """
    if any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < length
           for i in schedule):
        raise ValueError(f"{where}: {list(schedule)} must be step indices in 0..{length - 1}")
    if length <= 1:
        return sorted(set(schedule))
    return sorted({round(i * (steps - 1) / (length - 1)) for i in schedule})


def levers_for(profile: str, device: torch.device | str = "cpu",
               tuning: dict | None = None, steps: int | None = None,
               video: bool | None = None) -> ProfileLevers:
    """The levers of ``profile`` on ``device`` for a model with ``tuning`` (its studio.json),
    for a job of ``steps`` denoising steps making a clip (``video``) or an image (picks among
    step cache settings calibrated at several schedule lengths and per kind of output,
    :func:`tuning_for_steps`; None: the first that holds for both kinds).

    Raises:
        ValueError: an unknown profile (names the allowed ones), or bad tuning values.
    """
    if profile not in PROFILES:
        raise ValueError(f"optimization.profile: {profile!r} is not one of "
                         f"{', '.join(PROFILES)}")
    from studio.engine.attention import AttentionConfig, attention_override

    forced = attention_override()
    if profile == "exact":
        if forced is None:
            return ProfileLevers(profile)
        return ProfileLevers(profile, attention=forced.kernel, attention_config=forced)
    cache = DEFAULT_STEP_CACHE[profile]
    override = tuning_for_steps(((tuning or {}).get("step_cache") or {}).get(profile), steps,
                                f"studio.json step_cache.{profile}", video)
    if override:
        try:
            cache = replace(cache, **override)
        except TypeError as exc:
            raise ValueError(f"studio.json step_cache.{profile}: {exc}") from exc
    reuse = ((tuning or {}).get("guidance_reuse") or {}).get(profile)
    if reuse is not None:
        try:
            reuse = CfgReuseConfig(**reuse)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"studio.json guidance_reuse.{profile}: {exc}") from exc
    # On the CPU the Triton kernels cannot run (the interpreter is for tests): SDPA stays.
    kind = torch.device(device).type
    attention = GPU_ATTENTION[profile] if kind == "cuda" else "sdpa"
    if forced is not None:
        attention = forced.kernel
    precision = "as-loaded"
    capability = None  # None: not a CUDA device present here (the table's defaults)
    if kind == "cuda":
        dev = torch.device(device)
        if torch.cuda.is_available() and (dev.index or 0) < torch.cuda.device_count():
            capability = torch.cuda.get_device_capability(dev)
    tuned = None
    tuned_text = ((tuning or {}).get("attention") or {}).get(profile)
    if tuned_text is not None:
        try:
            tuned = attention_override(str(tuned_text))
        except ValueError as exc:
            raise ValueError(f"studio.json attention.{profile}: "
                             f"{str(exc).removeprefix('STUDIO_ATTENTION: ')}") from None
        if kind != "cuda" or forced is not None or tuned is None:
            tuned = None  # the CPU keeps SDPA; STUDIO_ATTENTION wins
        else:
            attention = tuned.kernel
            if tuned == AttentionConfig(kernel=tuned.kernel):  # no options: the plain kernel
                tuned = None
    if (forced is None and tuned is None and attention == "sage" and capability is not None
            and capability >= SDPA_WINS_FROM_CAPABILITY):
        attention = "sdpa"
    if kind == "cuda" and profile == "fast":
        # ours (fp8 row-wise linears) on Hopper+: x1.13-1.15 per step on the H200 where
        # torchao's eager fp8-dynamic ran x0.67-0.97 (bench/results/2026-11-30-h200-run3-*)
        precision = ("fp8-rowwise" if capability is None or capability >= (9, 0)
                     else "fp8-dynamic" if capability >= (8, 9) else "int8-dynamic")
    return ProfileLevers(profile, step_cache=cache, attention=attention, precision=precision,
                         guidance_reuse=reuse, attention_config=forced,
                         fused_blocks=kind == "cuda", attention_tuned=tuned)


def _uncacheable_reason(module: torch.nn.Module) -> str:
    """Why the step cache cannot go on ``module`` ("" when it can)."""
    try:
        transformer_blocks(module)
    except ValueError as exc:
        return str(exc)
    return ""


def apply_levers(denoisers: list[torch.nn.Module], levers: ProfileLevers) -> list[str]:
    """Sets ``levers`` on the job's denoisers, replacing what an earlier job set.

    Returns:
        Notes for the user (what was on, what could not be applied and why).
    """
    from studio.engine import fused_blocks
    from studio.engine.attention import ATTENTION_ENV, AttentionConfig, apply_attention

    notes = []
    wanted = levers.attention_settings()
    for module in denoisers:
        if module is None:
            continue
        # switchable before any hook wraps the blocks (off unless the profile says so)
        fused_blocks.install(module)
        fused_blocks.set_fused(module, levers.fused_blocks)
        current = getattr(module, "_studio_attention", None)
        if (current[0] if current else AttentionConfig()) != wanted:
            apply_attention(module, wanted)
        routed = getattr(module, "_studio_attention", None)
        if routed:
            routed[1].clear()  # counts per job
        from studio.engine.caching.unet_cache import apply_unet_cache, is_unet, remove_unet_cache

        if levers.step_cache is None:
            remove_step_cache(module)
            remove_unet_cache(module)
            module._studio_step_cache_config = None
        elif is_unet(module):
            if getattr(module, "_studio_step_cache_config", None) != levers.step_cache:
                apply_unet_cache(module, levers.step_cache)
                module._studio_step_cache_config = levers.step_cache
            reset_step_cache(module)
        elif _uncacheable_reason(module):
            notes.append(f"{_uncacheable_reason(module)}; ran without it")
        else:
            current = getattr(module, "_studio_step_cache_config", None)
            if current != levers.step_cache:
                remove_cfg_reuse(module)  # it must stay outside the step cache's hook
                apply_step_cache(module, levers.step_cache)
                module._studio_step_cache_config = levers.step_cache
            reset_step_cache(module)
        notes += _set_guidance_reuse(module, levers.guidance_reuse)
    if levers.profile != "exact":
        notes.insert(0, levers.describe())
    if levers.attention_config is not None:
        notes.append(f"attention forced to {wanted.kernel} by {ATTENTION_ENV}")
    return notes


def _set_guidance_reuse(module: torch.nn.Module, config: CfgReuseConfig | None) -> list[str]:
    """Installs (outside the step cache), resets or removes guidance reuse on a DiT
    denoiser; returns a note when it cannot run."""
    from diffusers.hooks import HookRegistry

    from studio.engine.caching.unet_cache import is_unet

    if config is None or is_unet(module):
        remove_cfg_reuse(module)
        return []

    if HookRegistry.check_if_exists_or_initialize(module).get_hook(
            "studio_cfg_parallel") is not None:
        remove_cfg_reuse(module)
        return ["guidance reuse: off under CFG parallelism (each rank computes one branch)"]
    if getattr(module, "_studio_cfg_reuse", None) is None or \
            getattr(module, "_studio_cfg_reuse_config", None) != config:
        apply_cfg_reuse(module, config)
        module._studio_cfg_reuse_config = config
    else:
        reset_cfg_reuse(module)
    return []


def attention_stats(denoisers: list[torch.nn.Module]) -> dict[str, int]:
    """Attention calls by path over the job's denoisers (empty when not routed)."""
    total: dict[str, int] = {}
    for m in denoisers:
        routed = getattr(m, "_studio_attention", None) if m is not None else None
        if routed:
            for path, n in routed[1].items():
                total[path] = total.get(path, 0) + n
    return total


def cache_stats(denoisers: list[torch.nn.Module]) -> StepCacheStats | None:
    """The step cache's counts over the job's denoisers (None when the cache is off)."""
    found = [getattr(m, "_studio_step_cache", None) for m in denoisers if m is not None]
    found = [s for s in found if s is not None]
    if not found:
        return None
    total = StepCacheStats()
    for s in found:
        total.full_calls += s.full_calls
        total.skipped_calls += s.skipped_calls
    return total


PROFILE_TABLE_HEADER = ("| profile | device | step cache | precision | attention | fused block "
                        "ops | compile |")


def profile_table() -> str:
    """The markdown table of every profile's levers on each kind of device."""
    rows = [PROFILE_TABLE_HEADER, "|---|---|---|---|---|---|---|"]
    for profile in PROFILES:
        for device in ("cpu", "cuda"):
            lv = levers_for(profile, device)
            c = lv.step_cache
            cache = (f"{c.signal} signal, threshold {c.threshold:g}, order {c.order}, warm-up "
                     f"{c.warmup_steps}, ≤{c.max_consecutive_skips} skips" if c else "off")
            precision = lv.precision
            if precision == "fp8-rowwise":
                precision = ("fp8-rowwise (fp8-dynamic at compute capability 8.9, int8-dynamic "
                             "below)")
            attention = lv.attention
            if device == "cuda" and attention == "sage":
                attention = "sage (sdpa from compute capability 9.0)"
            if device == "cuda" and attention == "sparse":
                attention = (f"sparse below timestep {FAST_SPARSE_BELOW_TIMESTEP:g}, sage above "
                             f"(a model's studio.json may turn it off)")
            rows.append(f"| {profile} | {device} | {cache} | {precision} | {attention} | "
                        f"{'on' if lv.fused_blocks else 'off'} | "
                        f"{'on' if lv.compile else 'off'} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(profile_table())
