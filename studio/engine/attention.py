"""Our attention kernels inside any diffusers denoiser: a scoped attention backend.

:func:`apply_attention` installs a diffusers model hook on the denoiser; for the duration of
each of its forward calls (and only then, only on this model) a ``TorchFunctionMode`` routes
``F.scaled_dot_product_attention`` to one of our ops in :mod:`studio.kernels`:

* ``flash``: :func:`studio.kernels.attention.attention` (flash-style, fp32 accumulation);
* ``sage``: :func:`studio.kernels.sage_attention.sage_attention` (INT8 Q·Kᵀ, FP8 or 16-bit
  P·V, after SageAttention);
* ``sparse``: video self-attention (queries and keys both the latent video tokens) through
  :func:`studio.kernels.block_sparse_attention.block_sparse_attention` with a local
  spatio-temporal window over the (frames, height, width) token grid read from the
  denoiser's input; every other attention call (text cross-attention, single images) runs
  ``sage`` or ``flash`` as ``sparse_inner`` says.

Why a routed function rather than per-family attention processors: every diffusers family
reaches PyTorch's SDPA in the end, including those whose processors call it directly (SD3,
the SD/SDXL UNet, CogVideoX, HiDream) and so ignore ``set_attention_backend``; routing at that
one function covers them all without copying any processor, and leaves RoPE, QK-norm and the
projections to diffusers. Calls the kernels do not cover (an attention mask, causal or
dropout, grouped-query heads) run SDPA unchanged; the reason is logged once per kind.

Under regional ``torch.compile`` (:mod:`studio.engine.compile`) the same router is reached
through diffusers' attention dispatcher instead (its native backend wrapped, see
``_RootHook``): a mode active over compiled code breaks the graph at every Python-implemented
tensor method. There, processors that call SDPA directly keep SDPA.

Source for the technique of routing through a torch function mode: PyTorch's
``TorchFunctionMode`` (``torch.overrides``), as used by ``torch.utils.flop_counter``.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import Counter

import torch
import torch.nn.functional as F
from diffusers.hooks import HookRegistry, ModelHook
from torch.overrides import TorchFunctionMode

from studio.engine.attention_config import (  # noqa: F401  (re-exported)
    ATTENTION_ENV,
    KERNELS,
    AttentionConfig,
    attention_override,
)
from studio.engine.compile import count_outside_graph
from studio.engine.hooks import remove_hook

log = logging.getLogger(__name__)

_HOOK = "studio_attention_router"


class AttentionStats(Counter):
    """Attention calls by path: ``flash``, ``sage``, ``sparse``, ``sdpa`` (not routed)."""


_LOGGED: set[str] = set()
_BROKEN: set[str] = set()  # kernels that failed at run time in this process


def _kernel_failures() -> tuple[type[BaseException], ...]:
    """The errors that mean "our kernel cannot run here, SDPA instead": torch's and a
    missing module's, and Triton's own (CompilationError, OutOfResources, PTXASError derive
    from ``triton.errors.TritonError``, an ``Exception``, not a RuntimeError)."""
    try:
        from triton.errors import TritonError
    except ImportError:
        return (RuntimeError, ImportError)
    return (RuntimeError, ImportError, TritonError)


KERNEL_FAILURES = _kernel_failures()


def _log_once(reason: str) -> None:
    if reason not in _LOGGED:
        _LOGGED.add(reason)
        log.info("attention: SDPA kept for %s", reason)


def _unrouted_reason(q, k, v, attn_mask, dropout_p, is_causal, enable_gqa) -> str | None:
    if attn_mask is not None:
        return "calls with an attention mask"
    if is_causal:
        return "causal attention"
    if dropout_p:
        return "attention dropout"
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return f"{q.dim()}-D inputs (the kernels take (batch, heads, seq, head_dim))"
    if k.shape[1] != q.shape[1] or v.shape[1] != q.shape[1] or enable_gqa:
        return "grouped-query attention"
    if k.shape[-1] != q.shape[-1] or v.shape[-1] != q.shape[-1]:
        return "different query/key/value head dims"
    return None


class _Router(TorchFunctionMode):
    def __init__(self, config: AttentionConfig, stats: AttentionStats):
        super().__init__()
        self.config, self.stats = config, stats
        self.grid: tuple[int, int, int] | None = None  # the running forward's token grid
        self.timestep: float | None = None  # the running forward's (highest) timestep
        self.layouts: dict = {}  # block-sparse layouts by grid and settings

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
                 "enable_gqa")
        bound = dict(zip(names, args, strict=False)) | kwargs
        return self.attend(bound["query"], bound["key"], bound["value"],
                           bound.get("attn_mask"), bound.get("dropout_p", 0.0),
                           bound.get("is_causal", False), bound.get("scale"),
                           bound.get("enable_gqa", False), lambda: func(*args, **kwargs))

    def attend(self, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa, sdpa):
        """One SDPA call (q, k, v: (batch, heads, seq, head_dim)) through our kernel, or
        ``sdpa()`` (the call unchanged) where the kernels do not apply or have failed."""
        reason = _unrouted_reason(q, k, v, attn_mask, dropout_p, is_causal, enable_gqa)
        if reason is not None:
            _log_once(reason)
            count_outside_graph(self.stats, "sdpa")
            return sdpa()
        if self.config.kernel in _BROKEN:
            count_outside_graph(self.stats, "sdpa")
            return sdpa()
        try:
            return self.route(q, k, v, scale)
        except KERNEL_FAILURES as exc:  # e.g. a Triton compile failure
            _BROKEN.add(self.config.kernel)
            log.warning("attention: %s kernel failed (%s: %s); SDPA from now on",
                        self.config.kernel, type(exc).__name__, str(exc)[:200])
            count_outside_graph(self.stats, "sdpa")
            return sdpa()

    def route(self, q, k, v, scale):
        cfg = self.config
        kernel = cfg.kernel
        if kernel == "sparse":
            layout = self.video_layout(q, k)
            if layout is not None:
                from studio.kernels.block_sparse_attention import block_sparse_attention

                count_outside_graph(self.stats, "sparse")
                return block_sparse_attention(q, k, v, layout, scale=scale)[0]
            kernel = cfg.sparse_inner
        count_outside_graph(self.stats, kernel)
        if kernel == "sage":
            from studio.kernels.sage_attention import sage_attention

            block_m, block_n = cfg.sage_tiles or (None, None)
            return sage_attention(q, k, v, scale=scale, pv_fp8=cfg.pv_fp8, block_m=block_m,
                                  block_n=block_n)[0]
        from studio.kernels.attention import attention

        return attention(q, k, v, scale=scale)[0]

    def video_layout(self, q, k):
        """The block-sparse layout for video self-attention, None for any other call."""
        if self.grid is None:
            return None
        below = self.config.sparse_below_timestep
        if below < 1000.0 and (self.timestep is None or self.timestep >= below):
            return None  # the dense warm-up (an unknown timestep stays dense too)
        frames, rows, cols = self.grid
        n = frames * rows * cols
        if frames < 2 or q.shape[2] != n or k.shape[2] != n:
            return None
        key = (self.grid, self.config.sparse_window, self.config.block,
               self.config.sparse_sink_frames, q.device)
        layout = self.layouts.get(key)
        if layout is None:
            from studio.kernels.block_sparse_attention import BlockSparseLayout
            from studio.kernels.block_sparse_attention.mask import build_video_mask

            b = self.config.block
            mask = build_video_mask(frames, rows, cols, 0, b, b, self.config.sparse_window,
                                    device=q.device,
                                    sink_frames=min(self.config.sparse_sink_frames, frames))
            layout = self.layouts[key] = BlockSparseLayout.from_mask(mask, b, b)
        return layout


def token_grid(transformer: torch.nn.Module, hidden_states: torch.Tensor
               ) -> tuple[int, int, int] | None:
    """(frames, rows, cols) of the latent tokens for a 5-D (B, C, F, H, W) input and the
    model's ``patch_size`` (Wan, LTX-style 3-D patching); None for any other layout."""
    patch = getattr(getattr(transformer, "config", None), "patch_size", None)
    if hidden_states is None or hidden_states.dim() != 5 or patch is None:
        return None
    if isinstance(patch, int):
        patch = (1, patch, patch)
    pt, ph, pw = (int(p) for p in patch)
    _, _, f, h, w = hidden_states.shape
    return f // pt, h // ph, w // pw


#: The router of the compiled denoiser whose forward is running on each device (see
#: _RootHook), read by the dispatcher route that replaces diffusers' native attention backend.
_DISPATCH_ROUTERS: dict[torch.device, _Router] = {}
_DEVICE_LOCKS: dict[torch.device, threading.RLock] = {}
_LOCKS_LOCK = threading.Lock()


def _device_lock(device: torch.device) -> threading.RLock:
    with _LOCKS_LOCK:
        return _DEVICE_LOCKS.setdefault(device, threading.RLock())


def _install_dispatch_route() -> bool:
    """Wraps diffusers' native attention backend (``dispatch_attention_fn``'s default, which
    calls SDPA on (batch, heads, seq, head_dim) views) so that, while a compiled denoiser's
    forward runs, its calls go through that denoiser's router; outside such a forward the
    wrapper calls the original unchanged. Idempotent; False when this diffusers has no
    dispatcher registry."""
    try:
        from diffusers.models.attention_dispatch import (
            AttentionBackendName,
            _AttentionBackendRegistry,
        )
    except ImportError:  # pragma: no cover - older diffusers
        return False
    backends = _AttentionBackendRegistry._backends
    native = backends.get(AttentionBackendName.NATIVE)
    if native is None:
        return False
    if getattr(native, "_studio_routed", False):
        return True

    @functools.wraps(native)
    def routed_native(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                      scale=None, enable_gqa=False, return_lse=False, _parallel_config=None):
        router = _DISPATCH_ROUTERS.get(query.device)
        if router is None or return_lse or _parallel_config is not None:
            return native(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                          return_lse, _parallel_config)
        q, k, v = (x.permute(0, 2, 1, 3) for x in (query, key, value))  # (B, H, S, D) views
        out = router.attend(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                            lambda: native(query, key, value, attn_mask, dropout_p, is_causal,
                                           scale, enable_gqa).permute(0, 2, 1, 3))
        return out.permute(0, 2, 1, 3)

    routed_native._studio_routed = True
    backends[AttentionBackendName.NATIVE] = routed_native
    return True


class _RootHook(ModelHook):
    """Around each forward of the denoiser: its router, as a torch function mode (eager), or
    (blocks compiled by :mod:`studio.engine.compile`) through diffusers' attention dispatcher.
    A mode active over compiled code makes dynamo trace every tensor method through it, and
    the Python-implemented ones (``Tensor.unflatten``, used by Flux's and Wan's processors)
    break the graph; the dispatcher route is one plain function call per attention. Under
    compile, processors that call SDPA directly (SD3, the UNets) keep SDPA (logged once).
    The dispatcher route holds one router per device: compiled forwards on one device from
    several threads take turns.
    The router object lives as long as the hook (the compiled code guards on it)."""

    def __init__(self, config: AttentionConfig, stats: AttentionStats):
        super().__init__()
        self.config = config
        self.router = _Router(config, stats)

    def new_forward(self, module, *args, **kwargs):
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        self.router.grid = token_grid(module, hidden) if torch.is_tensor(hidden) else None
        self.router.timestep = None
        if self.router.grid is not None and self.config.sparse_below_timestep < 1000.0:
            t = kwargs.get("timestep", args[1] if len(args) > 1 else None)
            self.router.timestep = float(t.max()) if torch.is_tensor(t) and t.numel() else None
        if not (getattr(module, "_studio_compiled", None) and torch.is_tensor(hidden)
                and _install_dispatch_route()):
            with self.router:  # eager: the torch function mode (per thread)
                return self.fn_ref.original_forward(*args, **kwargs)
        _log_once("processors that call SDPA directly in a compiled denoiser (under "
                  "torch.compile the kernels are reached through diffusers' dispatcher)")
        device = hidden.device
        # One router per device at a time: compiled forwards on the same device from two
        # threads take turns (they share the device anyway); nested forwards in one thread
        # stack (re-entrant lock, the outer router restored after).
        with _device_lock(device):
            previous = _DISPATCH_ROUTERS.get(device)
            _DISPATCH_ROUTERS[device] = self.router
            try:
                return self.fn_ref.original_forward(*args, **kwargs)
            except KERNEL_FAILURES as exc:
                # In compiled code our kernels run after the router's try/except has been
                # traced away, so a kernel that fails to build (Triton) surfaces here: mark
                # it broken (the guards on _BROKEN then recompile to SDPA) and run the step
                # again.
                kernel = self.config.kernel
                if kernel in _BROKEN or not _raised_in_kernels(exc):
                    raise
                _BROKEN.add(kernel)
                log.warning("attention: %s kernel failed under torch.compile (%s: %s); SDPA "
                            "from now on", kernel, type(exc).__name__, str(exc)[:200])
                return self.fn_ref.original_forward(*args, **kwargs)
            finally:
                if previous is None:
                    _DISPATCH_ROUTERS.pop(device, None)
                else:
                    _DISPATCH_ROUTERS[device] = previous


def _raised_in_kernels(exc: BaseException) -> bool:
    """Whether ``exc`` came from studio.kernels or Triton (by the frames it passed through)."""
    tb = exc.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename.replace("\\", "/")
        if "/studio/kernels/" in name or "/triton/" in name:
            return True
        tb = tb.tb_next
    return False


def apply_attention(transformer: torch.nn.Module, config: AttentionConfig) -> AttentionStats:
    """Routes the denoiser's attention through our kernels (see the module docstring).

    ``kernel='sdpa'`` removes the routing. Returns the live call counts by path.
    """
    remove_attention(transformer)
    stats = AttentionStats()
    if config.kernel == "sdpa":
        return stats
    HookRegistry.check_if_exists_or_initialize(transformer).register_hook(
        _RootHook(config, stats), _HOOK)
    transformer._studio_attention = (config, stats)
    return stats


def remove_attention(transformer: torch.nn.Module) -> None:
    """Back to PyTorch's SDPA (no-op when not routed)."""
    if getattr(transformer, "_studio_attention", None) is None:
        return
    remove_hook(transformer, _HOOK)  # the hooks put on after it keep working
    transformer._studio_attention = None
