"""Token-level reuse: recompute a linear layer only for the tokens whose input changed.

Every layer of a diffusion transformer block except the attention product itself works on
each token alone (Q/K/V/output projections, the feed-forward network, cross-attention K/V on
the text). Between two denoising steps many tokens barely move, in videos most of all (a
still background over many frames), and the text tokens do not move at all. This hook on
each such ``nn.Linear`` keeps the last input and output of every token and, on the next call,
recomputes only the tokens whose input moved by more than ``threshold`` (relative L1 per
token) since the input their cached output was computed from; the others keep their cached
output. The reference input of a token is refreshed only when it is recomputed, so a token's
drift is bounded by the threshold however many steps it is reused.

When more than ``max_fraction`` of the tokens changed, the layer runs in full (gathering
would cost more than it saves). State is per cache context (CFG branch) and per batch item,
and cleared when a new trajectory starts (the timestep does not decrease) or by
:func:`reset_token_reuse`.

Sources: token-wise feature caching for diffusion transformers, ToCa (Zou et al.,
"Accelerating Diffusion Transformers with Token-wise Feature Caching", ICLR 2025); the
text K/V case is diffusers' TextKVCache idea; the change-since-reference bound is ours.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from diffusers.hooks import HookRegistry, ModelHook
from diffusers.hooks.hooks import BaseState, CacheContext, StateManager

from studio.engine.caching.step_cache import TimestepReader, transformer_blocks
from studio.engine.hooks import remove_hook

_ROOT = "studio_token_reuse_root"
_LINEAR = "studio_token_reuse_linear"
_DEFAULT_CONTEXT = "studio-default"


@dataclass(frozen=True)
class TokenReuseConfig:
    """Settings of token-level reuse.

    Attributes:
        threshold: relative L1 change of a token's input (against the input its cached
            output came from) above which it is recomputed; 0 recomputes every token that
            changed at all (exact).
        max_fraction: above this fraction of changed tokens the layer runs in full.
        min_tokens: layers called with fewer tokens than this always run in full.

    Raises:
        ValueError: (at construction) a field out of range, naming it.
    """

    threshold: float = 0.05
    max_fraction: float = 0.6
    min_tokens: int = 16

    def __post_init__(self):
        if not (0.0 <= self.threshold <= 10.0):
            raise ValueError(f"threshold: {self.threshold} is outside 0..10")
        if not (0.0 < self.max_fraction <= 1.0):
            raise ValueError(f"max_fraction: {self.max_fraction} is outside (0, 1]")
        if self.min_tokens < 1:
            raise ValueError(f"min_tokens: {self.min_tokens} must be at least 1")


class TokenReuseStats:
    """Token rows computed and reused over all hooked layers (since the last reset)."""

    def __init__(self):
        self.computed = 0
        self.reused = 0

    @property
    def reuse_fraction(self) -> float:
        total = self.computed + self.reused
        return self.reused / total if total else 0.0


class _LinearState(BaseState):
    def __init__(self):
        self.reset()

    def reset(self):
        self.inputs: torch.Tensor | None = None
        self.outputs: torch.Tensor | None = None


class _LinearHook(ModelHook):
    _is_stateful = True

    def __init__(self, manager: StateManager, config: TokenReuseConfig, stats: TokenReuseStats):
        super().__init__()
        self.state_manager, self.config, self.stats = manager, config, stats

    def new_forward(self, module, x, *args, **kwargs):
        if args or kwargs or x.dim() != 3 or x.shape[1] < self.config.min_tokens:
            return self.fn_ref.original_forward(x, *args, **kwargs)
        state: _LinearState = self.state_manager.get_state()
        if state.inputs is None or state.inputs.shape != x.shape or \
                state.inputs.dtype != x.dtype:
            return self._full(state, module, x)
        change = _token_change(x, state.inputs)  # (B, L)
        stale = change > self.config.threshold
        n = int(stale.sum())
        total = stale.numel()
        if n > self.config.max_fraction * total:
            return self._full(state, module, x)
        if n:
            rows = stale.nonzero(as_tuple=True)
            fresh = self.fn_ref.original_forward(x[rows])
            state.inputs[rows] = x[rows]
            state.outputs[rows] = fresh
        self.stats.computed += n
        self.stats.reused += total - n
        return state.outputs.clone()

    def _full(self, state, module, x):
        out = self.fn_ref.original_forward(x)
        state.inputs, state.outputs = x.detach().clone(), out.detach().clone()
        self.stats.computed += x.shape[0] * x.shape[1]
        return out

    def reset_state(self, module):
        self.state_manager.reset()
        return module


def _token_change(x: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Relative L1 change per token: (B, L, D) x2 -> (B, L) float32."""
    num = (x.float() - ref.float()).abs().mean(-1)
    return num / ref.float().abs().mean(-1).clamp_min(1e-6)


class _RootHook(ModelHook):
    """Gives context-less calls a context and clears all token state on a new trajectory."""

    _is_stateful = True

    def __init__(self, manager: StateManager, linears: list[torch.nn.Module]):
        super().__init__()
        self.state_manager = manager
        self.linears = linears
        self.last_timestep: dict[str, float] = {}

    def initialize_hook(self, module):
        self._timestep = TimestepReader(module)
        return module

    def new_forward(self, module, *args, **kwargs):
        t = self._timestep(args, kwargs)
        own = self.state_manager._context is None
        if own:
            self.state_manager.set_context(CacheContext(_DEFAULT_CONTEXT))
        try:
            name = self.state_manager._context.name
            last = self.last_timestep.get(name)
            if t is None or (last is not None and t >= last):
                self._reset_context()
            self.last_timestep[name] = t
            return self.fn_ref.original_forward(*args, **kwargs)
        finally:
            if own:
                self.state_manager.set_context(None)

    def _reset_context(self):
        self.state_manager.get_state().reset()

    def reset_state(self, module):
        self.state_manager.reset()
        self.last_timestep.clear()
        return module


def apply_token_reuse(transformer: torch.nn.Module, config: TokenReuseConfig
                      ) -> TokenReuseStats:
    """Installs token-level reuse on every ``nn.Linear`` inside the transformer's blocks.

    Args:
        transformer: a diffusers transformer with a block list (see
            :func:`studio.engine.caching.step_cache.transformer_blocks`).
        config: the reuse settings.

    Returns:
        The live statistics (token rows computed / reused).

    Raises:
        ValueError: the model has no block list.
    """
    remove_token_reuse(transformer)
    linears = [m for block in transformer_blocks(transformer) for m in block.modules()
               if isinstance(m, torch.nn.Linear)]
    stats = TokenReuseStats()
    # one state manager per layer: each layer keeps its own tokens, per context
    root_manager = _MultiStateManager()
    for linear in linears:
        manager = StateManager(_LinearState)
        root_manager.children.append(manager)
        HookRegistry.check_if_exists_or_initialize(linear).register_hook(
            _LinearHook(manager, config, stats), _LINEAR)
    HookRegistry.check_if_exists_or_initialize(transformer).register_hook(
        _RootHook(root_manager, linears), _ROOT)
    transformer._studio_token_reuse = stats
    transformer._studio_token_reuse_linears = linears
    return stats


class _MultiStateManager(StateManager):
    """Drives the context of every layer's state manager at once."""

    def __init__(self):
        super().__init__(_LinearState)
        self.children: list[StateManager] = []

    def set_context(self, context):
        super().set_context(context)
        for child in self.children:
            child.set_context(context)

    def get_state(self):  # the root's "state" clears every layer of the current context
        return _ContextView(self)

    def reset(self, *args, **kwargs):
        super().reset()
        for child in self.children:
            child.reset()


class _ContextView:
    def __init__(self, manager: _MultiStateManager):
        self.manager = manager

    def reset(self):
        for child in self.manager.children:
            if child._context is not None:
                child.get_state().reset()


def remove_token_reuse(transformer: torch.nn.Module) -> None:
    """Removes the hooks (no-op when none are installed)."""
    linears = getattr(transformer, "_studio_token_reuse_linears", None)
    if not linears:
        return
    remove_hook(transformer, _ROOT)  # the hooks outside it keep working, in order
    for linear in linears:
        remove_hook(linear, _LINEAR)
    transformer._studio_token_reuse = None
    transformer._studio_token_reuse_linears = None


def reset_token_reuse(transformer: torch.nn.Module) -> TokenReuseStats | None:
    """Clears every layer's tokens and the counts; call before each job."""
    stats = getattr(transformer, "_studio_token_reuse", None)
    if stats is None:
        return None
    HookRegistry.check_if_exists_or_initialize(transformer).get_hook(_ROOT).reset_state(
        transformer)
    stats.computed = stats.reused = 0
    return stats
