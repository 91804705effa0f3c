"""Guidance reuse: skip the unconditional branch of classifier-free guidance on some steps.

With CFG each step runs the denoiser twice, on the prompt (cond) and without it (uncond),
and the guided prediction is ``uncond + g · (cond − uncond)``. The difference
``Δ = cond − uncond`` changes slowly along the trajectory, more slowly than either branch.
After a warm-up, this lever computes the unconditional branch only on every ``interval``-th
step; on the others it forecasts Δ at the current timestep from the last full steps (Newton
divided differences, :mod:`.forecast`) and returns ``uncond ≈ cond − Δ`` without calling the
denoiser: about half the denoiser work of those steps.

Sources: reusing the guidance residual across steps is FasterCache's CFG cache (Lv et al.,
"FasterCache: Training-Free Video Diffusion Model Acceleration with High Quality", 2024),
which also notes the cond/uncond difference varies slowly; skipping guidance on later steps
is "Adaptive Guidance" (Castillo et al., 2023). Here Δ is forecast in the timestep, as our step
cache forecasts features.

It acts on pipelines that run the branches as separate calls inside diffusers' cache contexts
``"cond"`` then ``"uncond"`` (Wan, Wan VACE, the embedded model, FLUX.1 true CFG); calls in any
other context pass through. Install it after the step cache so it is the outer hook (a
reused unconditional call then costs nothing at all). It cannot go with CFG parallelism (the
unconditional rank does not have the conditional output).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from diffusers.hooks import HookRegistry, ModelHook
from diffusers.hooks.hooks import BaseState, StateManager

from studio.engine.caching.forecast import forecast
from studio.engine.caching.step_cache import TimestepReader
from studio.engine.hooks import remove_hook

_HOOK = "studio_cfg_reuse"


@dataclass(frozen=True)
class CfgReuseConfig:
    """When the unconditional branch is computed.

    Attributes:
        interval: after the warm-up, compute it on every ``interval``-th step (1: always,
            numerically stock; 2: every other step), 1..8.
        warmup_steps: the first steps compute both branches (the layout forms early), 0..100.
        order: forecast order of Δ in the timestep (0: reuse the last Δ), 0..2.

    Raises:
        ValueError: a field outside its range.
    """

    interval: int = 2
    warmup_steps: int = 3
    order: int = 1

    def __post_init__(self):
        for name, low, high in (("interval", 1, 8), ("warmup_steps", 0, 100), ("order", 0, 2)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"{name}: {value!r} must be an integer in {low}..{high}")


@dataclass
class CfgReuseStats:
    """Unconditional calls computed and reused since the last reset."""

    computed: int = 0
    reused: int = 0
    decisions: list[tuple[int, bool]] = field(default_factory=list)  # (step, reused)


class _NoState(BaseState):
    def reset(self):
        pass


class _CfgReuseHook(ModelHook):
    _is_stateful = True  # diffusers hands it the pipeline's cache context

    def __init__(self, config: CfgReuseConfig, stats: CfgReuseStats):
        super().__init__()
        self.config, self.stats = config, stats
        self.state_manager = StateManager(_NoState)
        self._clear()

    def _clear(self):
        self.step = 0
        self.last_t: float | None = None
        self.cond: torch.Tensor | None = None
        self.times: list[float] = []
        self.deltas: list[torch.Tensor] = []

    def initialize_hook(self, module):
        self._timestep = TimestepReader(module)
        return module

    def new_forward(self, module, *args, **kwargs):
        context = self.state_manager._context
        name = context.name if context is not None else None
        forward = self.fn_ref.original_forward
        if name == "cond":
            t = self._timestep(args, kwargs)
            if t is None or (self.last_t is not None and t >= self.last_t):
                self._clear()  # a new trajectory (a new job)
            self.last_t = t
            self.step += 1
            out = forward(*args, **kwargs)
            self.cond = out[0] if isinstance(out, tuple) else out.sample
            return out
        if name != "uncond" or self.cond is None:
            return forward(*args, **kwargs)
        t = self._timestep(args, kwargs)
        cfg = self.config
        reuse = (self.deltas and t is not None and self.step > cfg.warmup_steps
                 and (self.step - cfg.warmup_steps) % cfg.interval != 0)
        self.stats.decisions.append((self.step, bool(reuse)))
        if reuse:
            self.stats.reused += 1
            delta = forecast(self.times, self.deltas, t, cfg.order)
            sample = self.cond - delta.to(self.cond.dtype)
            kind = self._kind
            return (sample,) if kind is tuple else kind(sample=sample)
        out = forward(*args, **kwargs)
        self._kind = type(out)
        self.stats.computed += 1
        sample = out[0] if isinstance(out, tuple) else out.sample
        if t is not None:
            keep = cfg.order + 1
            self.times = (self.times + [t])[-keep:]
            self.deltas = (self.deltas + [self.cond - sample])[-keep:]
        return out

    def reset_state(self, module):
        self.state_manager.reset()
        self._clear()
        return module


def apply_cfg_reuse(denoiser: torch.nn.Module, config: CfgReuseConfig) -> CfgReuseStats:
    """Installs guidance reuse on ``denoiser`` (replacing an earlier one); install it after
    the step cache. Returns the live statistics.

    Raises:
        ValueError: the denoiser runs under CFG parallelism.
    """
    registry = HookRegistry.check_if_exists_or_initialize(denoiser)
    if registry.get_hook("studio_cfg_parallel") is not None:
        raise ValueError("guidance reuse: the denoiser runs CFG parallel (the unconditional "
                         "rank does not see the conditional output)")
    remove_cfg_reuse(denoiser)
    stats = CfgReuseStats()
    registry.register_hook(_CfgReuseHook(config, stats), _HOOK)
    denoiser._studio_cfg_reuse = stats
    return stats


def remove_cfg_reuse(denoiser: torch.nn.Module) -> None:
    """Removes guidance reuse (no-op when absent)."""
    remove_hook(denoiser, _HOOK)
    denoiser._studio_cfg_reuse = None


def reset_cfg_reuse(denoiser: torch.nn.Module) -> CfgReuseStats | None:
    """Forgets the trajectory and starts fresh statistics (call before each job)."""
    registry = HookRegistry.check_if_exists_or_initialize(denoiser)
    hook = registry.get_hook(_HOOK)
    if hook is None:
        return None
    hook.reset_state(denoiser)
    hook.stats = CfgReuseStats()
    denoiser._studio_cfg_reuse = hook.stats
    return hook.stats
