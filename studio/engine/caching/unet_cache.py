"""Deep-feature step cache for the SD / SDXL UNet (``UNet2DConditionModel``).

A UNet's deep path (down blocks 2.., the mid block, up blocks ..-2) changes slowly between
steps, while its shallow path (the first down block and the last up block, at full latent
resolution) carries the detail. On a skipped step only the shallow path runs: the first down
block (the probe), then the last up block, fed with the fresh skip connections of the first
down block and a *forecast* of what the deep path would have given it; the deep blocks pass
their inputs through without computing. The decision is the same forecast-error budget as
the transformer cache (:mod:`.step_cache`): the probe's output is compared with its forecast
from the last full steps, and the error accumulated since the last full step must stay under
the threshold. Per CFG batch item (the SD pipelines batch both branches), per cache context,
reset on a new trajectory.

Source: DeepCache (Ma, Fang and Wang, "DeepCache: Accelerating Diffusion Models for Free",
CVPR 2024) for caching the high-level UNet features and recomputing the shallow branch; the
adaptive decision and the forecast are those of :mod:`.step_cache` (TeaCache, TaylorSeer).
"""

from __future__ import annotations

import torch
from diffusers.hooks import HookRegistry, ModelHook
from diffusers.hooks.hooks import StateManager

from studio.engine.caching.step_cache import (
    StepCacheConfig,
    StepCacheStats,
    _forecast_list,
    _ProbeHook,
    _RootHook,
    _TrajectoryState,
)
from studio.engine.hooks import remove_hook

_ROOT, _PROBE, _DEEP = "studio_unet_cache_root", "studio_unet_cache_probe", "studio_unet_cache_deep"


def is_unet(model: torch.nn.Module) -> bool:
    """Whether ``model`` has the down/mid/up layout this cache needs (>= 2 down and up blocks)."""
    return (len(getattr(model, "down_blocks", [])) >= 2 and len(getattr(model, "up_blocks", []))
            >= 2 and getattr(model, "mid_block", None) is not None)


class _ShallowProbeHook(_ProbeHook):
    """On the first down block: runs it and decides from its output feature."""

    def initialize_hook(self, module):
        return module

    def new_forward(self, module, *args, **kwargs):
        output = self.fn_ref.original_forward(*args, **kwargs)
        hidden = output[0] if isinstance(output, tuple) else output
        state: _TrajectoryState = self.state_manager.get_state()
        state.compute = self._decide(state, hidden)
        state.probed = True
        if state.compute:
            state.probe_residual = hidden
        return output


class _DeepHook(ModelHook):
    """On each deep block: passes through on skipped steps; ``up_blocks[-2]`` returns the
    forecast deep feature then, and records it on full steps."""

    _is_stateful = True

    def __init__(self, state: StateManager, config: StepCacheConfig, kind: str, outputs: int = 0):
        super().__init__()
        self.state_manager, self.config, self.kind, self.outputs = state, config, kind, outputs

    def new_forward(self, module, *args, **kwargs):
        state: _TrajectoryState = self.state_manager.get_state()
        if state.compute:
            out = self.fn_ref.original_forward(*args, **kwargs)
            if self.kind == "deep-out":
                keep = self.config.order + 1
                state.full_steps += 1
                state.times = (state.times + [state.timestep])[-keep:]
                state.probe_residuals = (state.probe_residuals + [state.probe_residual])[-keep:]
                state.deep_residuals = (state.deep_residuals + [(out, None)])[-keep:]
            return out
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        if self.kind == "down":
            return hidden, tuple(hidden for _ in range(self.outputs))
        if self.kind == "deep-out":
            return _forecast_list(state.times, [d[0] for d in state.deep_residuals],
                                  state.timestep, self.config.order)
        return hidden


def apply_unet_cache(unet: torch.nn.Module, config: StepCacheConfig) -> StepCacheStats:
    """Installs the deep-feature cache on a diffusers ``UNet2DConditionModel``.

    Returns:
        The live statistics (full and skipped calls).

    Raises:
        ValueError: the model has not the down/mid/up block layout.
    """
    if not is_unet(unet):
        raise ValueError(f"unet cache: {type(unet).__name__} has no down/mid/up blocks")
    remove_unet_cache(unet)
    state = StateManager(_TrajectoryState)
    stats = StepCacheStats()
    reg = HookRegistry.check_if_exists_or_initialize
    reg(unet).register_hook(_RootHook(state, stats), _ROOT)
    reg(unet.down_blocks[0]).register_hook(_ShallowProbeHook(state, config), _PROBE)
    for block in unet.down_blocks[1:]:
        outputs = len(block.resnets) + (1 if getattr(block, "downsamplers", None) else 0)
        reg(block).register_hook(_DeepHook(state, config, "down", outputs), _DEEP)
    reg(unet.mid_block).register_hook(_DeepHook(state, config, "mid"), _DEEP)
    for block in unet.up_blocks[:-2]:
        reg(block).register_hook(_DeepHook(state, config, "up"), _DEEP)
    reg(unet.up_blocks[-2]).register_hook(_DeepHook(state, config, "deep-out"), _DEEP)
    unet._studio_step_cache = stats
    unet._studio_unet_cache = True
    return stats


def remove_unet_cache(unet: torch.nn.Module) -> None:
    """Removes the hooks (no-op when none are installed)."""
    if not getattr(unet, "_studio_unet_cache", False):
        return
    remove_hook(unet, _ROOT)  # the hooks outside it keep working, in order
    remove_hook(unet.down_blocks[0], _PROBE)
    for block in [*unet.down_blocks[1:], unet.mid_block, *unet.up_blocks[:-1]]:
        remove_hook(block, _DEEP)
    unet._studio_step_cache = None
    unet._studio_unet_cache = False
