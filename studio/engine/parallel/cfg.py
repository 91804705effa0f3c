"""CFG parallelism: the conditional and unconditional branches of classifier-free guidance
on two ranks, combined at each step — for every family, through one denoiser hook.

Two ways pipelines run the branches, both handled:

* one call per branch, wrapped in ``transformer.cache_context("cond" / "uncond")`` (Wan,
  Flux true-CFG): rank 0 computes the "cond" call, rank 1 the "uncond" call; at the "uncond"
  call both ranks exchange their outputs (one all-gather), so each returns the right tensor
  for each call. Rank 1 returns an empty placeholder from the "cond" call and fills it in
  place at the exchange, before the pipeline combines the two (the pipelines read the cond
  output only after the uncond call). It learns the output's shape by computing the first
  "cond" call itself, and again whenever the input's shape changes (a job at another size).
* one batched call (SD 1.5/SDXL/SD3, LTX: the batch is [uncond, cond]): each rank computes
  its half of every batched tensor argument and the halves are all-gathered.

Each rank does half of the denoiser's work per step. Source: CFG parallelism as in xDiT
(Fang et al., "xDiT: an Inference Engine for Diffusion Transformers with Massive
Parallelism", 2024).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from diffusers.hooks import HookRegistry, ModelHook
from diffusers.hooks.hooks import BaseState, StateManager

from studio.engine.hooks import remove_hook

_HOOK = "studio_cfg_parallel"


class _NoState(BaseState):
    def reset(self):
        pass


def _split(value, rank: int, batch: int):
    if torch.is_tensor(value) and value.dim() > 0 and value.shape[0] == batch:
        return value.chunk(2)[rank]
    if isinstance(value, dict):
        return {k: _split(v, rank, batch) for k, v in value.items()}
    return value


class CfgParallelHook(ModelHook):
    """See the module docstring. ``stats`` counts the calls this rank computed."""

    _is_stateful = True  # so diffusers hands it the pipeline's cache context

    def __init__(self, group=None):
        super().__init__()
        self.state_manager = StateManager(_NoState)
        self.group = group
        self.rank = dist.get_rank(group)
        if dist.get_world_size(group) != 2:
            raise ValueError(f"cfg parallel: the group has {dist.get_world_size(group)} ranks; "
                             f"it needs exactly 2")
        self.pending: torch.Tensor | None = None
        self.template = None  # (input shape, output type, shape, dtype, device) of the last learned cond call
        self.computed = 0

    def _gather(self, mine: torch.Tensor) -> list[torch.Tensor]:
        parts = [torch.empty_like(mine) for _ in range(2)]
        dist.all_gather(parts, mine.contiguous(), group=self.group)
        return parts

    def new_forward(self, module, *args, **kwargs):
        context = self.state_manager._context
        name = context.name if context is not None else None
        if name in ("cond", "uncond"):
            return self._branch_call(name, args, kwargs)
        return self._batched_call(args, kwargs)

    def _branch_call(self, name, args, kwargs):
        forward = self.fn_ref.original_forward
        if name == "cond":
            hidden = kwargs.get("hidden_states", args[0] if args else None)
            key = tuple(hidden.shape) if torch.is_tensor(hidden) else None
            if self.rank == 0 or self.template is None or self.template[0] != key:
                # rank 1 computes a cond call itself whenever the input's shape is new
                # (first call, or a job at another size) to learn the output's shape
                out = forward(*args, **kwargs)
                self.computed += 1
                sample = out[0] if isinstance(out, tuple) else out.sample
                self.template = (key, type(out), sample.shape, sample.dtype, sample.device)
                self.pending = sample
                return out
            _, kind, shape, dtype, device = self.template
            self.pending = torch.empty(shape, dtype=dtype, device=device)
            return self._wrap(kind, self.pending)
        # uncond: rank 1 computes it; the ranks swap results
        if self.rank == 1:
            out = forward(*args, **kwargs)
            self.computed += 1
            mine = out[0] if isinstance(out, tuple) else out.sample
        else:
            mine = self.pending
        cond, uncond = self._gather(mine)
        if self.rank == 1:
            self.pending.copy_(cond)  # the placeholder returned by the cond call
            return out
        return self._wrap(self.template[1], uncond)

    def reset_state(self, module):
        """Between jobs: forget the placeholder and the learned output shape."""
        self.state_manager.reset()
        self.pending = self.template = None
        return module

    @staticmethod
    def _wrap(kind, sample):
        if kind is tuple:
            return (sample,)
        return kind(sample=sample)

    def _batched_call(self, args, kwargs):
        hidden = kwargs.get("hidden_states", kwargs.get("sample", args[0] if args else None))
        batch = hidden.shape[0]
        if batch % 2:
            raise ValueError(f"cfg parallel: a batched call of {batch} items cannot be split "
                             f"into the two guidance halves")
        args = tuple(_split(a, self.rank, batch) for a in args)
        kwargs = {k: _split(v, self.rank, batch) for k, v in kwargs.items()}
        out = self.fn_ref.original_forward(*args, **kwargs)
        self.computed += 1
        sample = out[0] if isinstance(out, tuple) else out.sample
        full = torch.cat(self._gather(sample))
        return self._wrap(type(out), full)


def apply_cfg_parallel(denoiser: torch.nn.Module, group=None) -> CfgParallelHook:
    """Installs CFG parallelism on ``denoiser`` for a 2-rank ``group`` (default: the whole
    initialized world, which must have 2 ranks). Install it after the other optimization
    hooks so it is the outermost. Returns the hook (``computed`` counts this rank's calls).

    Raises:
        ValueError: the group does not have exactly 2 ranks.
        ParallelConfigError: a denoiser whose outputs this hook does not split (LTX-2 returns
            video and audio, and runs extra one-item guidance calls); use ring there.
    """
    if type(denoiser).__name__.startswith("LTX2"):
        from studio.engine.parallel.config import ParallelConfigError

        raise ParallelConfigError(
            "cfg parallel: LTX-2's denoiser returns video and audio and runs one-item "
            "guidance calls that cannot be split into the two halves; use ring (sequence) "
            "parallel for LTX-2")
    hook = CfgParallelHook(group)
    HookRegistry.check_if_exists_or_initialize(denoiser).register_hook(hook, _HOOK)
    return hook


def remove_cfg_parallel(denoiser: torch.nn.Module) -> None:
    """Removes the hook (no-op when absent)."""
    remove_hook(denoiser, _HOOK)
