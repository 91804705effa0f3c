"""Flash-style attention forward: checks, launch, ``studio::attention_fwd`` custom op, fallback.

Public entry point: :func:`attention`.
"""

from __future__ import annotations

import contextlib
import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from .. import _runtime as rt
from .reference import attention_reference

try:  # Triton is optional (not installed on macOS, for instance): the reference runs instead.
    from . import kernel as _kernel
except ImportError:  # pragma: no cover - depends on the installation
    _kernel = None

OP = "attention"
SUPPORTED_DTYPES = rt.FLOAT_DTYPES
HEAD_DIMS = rt.ATTENTION_HEAD_DIMS

#: Launches since import, by path ("triton" or "reference"); tests read it to prove which ran.
LAUNCHES: Counter[str] = Counter()


@dataclass(frozen=True)
class Config:
    """A launch configuration: query/key tile sizes (powers of two >= 16) and Triton's
    num_warps / num_stages."""

    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 2


_override: Config | None = None


@contextlib.contextmanager
def use_config(config: Config) -> Iterator[None]:
    """Force a launch configuration in this block (bench/gpu sweeps with it; tests shrink the
    tiles to exercise many blocks). Not thread-safe: a process-wide setting."""
    global _override
    previous, _override = _override, config
    try:
        yield
    finally:
        _override = previous


def pick_config(head_dim: int, dtype: torch.dtype, interpreted: bool) -> Config:
    if _override is not None:
        return _override
    if interpreted:  # the interpreter pays per block operation, not per element
        return Config(64, 64)
    if dtype == torch.float32:
        return Config(64, 32, num_warps=4, num_stages=2)
    if head_dim <= 64:
        return Config(128, 64, num_warps=4, num_stages=3)
    return Config(128, 64, num_warps=8, num_stages=3)


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 kv_lengths: torch.Tensor | None) -> None:
    """Raise ValueError naming the argument when the inputs are malformed."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, heads, seq, head_dim), "
                             f"got shape {tuple(t.shape)}")
        rt.check_floating(name, t)
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k and v must share one dtype, got {rt.dtype_name(q.dtype)}, "
                         f"{rt.dtype_name(k.dtype)}, {rt.dtype_name(v.dtype)}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and "
                         f"{tuple(v.shape)}")
    if k.shape[0] != q.shape[0] or k.shape[1] != q.shape[1] or k.shape[3] != q.shape[3]:
        raise ValueError(f"k must have q's batch, heads and head_dim {tuple(q.shape[:2])}, "
                         f"{q.shape[3]}; got shape {tuple(k.shape)}")
    if q.shape[3] == 0:
        raise ValueError("head_dim must be positive (32, 64 or 128 run in Triton), got 0")
    rt.check_same_device(("q", "k", "v"), (q, k, v))
    if kv_lengths is not None:
        if kv_lengths.dtype != torch.int32:
            raise ValueError(f"kv_lengths.dtype must be int32, got "
                             f"{rt.dtype_name(kv_lengths.dtype)}")
        if tuple(kv_lengths.shape) != (q.shape[0],):
            raise ValueError(f"kv_lengths must have shape (batch,) = ({q.shape[0]},), "
                             f"got {tuple(kv_lengths.shape)}")
        rt.check_same_device(("q", "kv_lengths"), (q, kv_lengths))


def fallback_reason(q: torch.Tensor) -> str | None:
    """Why this call runs the torch reference instead of Triton; None when Triton runs."""
    return rt.attention_fallback_reason(_kernel, "attention_fwd_kernel", q)


def _launch(q, k, v, kv_lengths, scale, out, lse) -> None:
    batch, heads, seq_q, head_dim = q.shape
    seq_k = k.shape[2]
    interpreted = rt.is_interpreted(_kernel.attention_fwd_kernel)
    cfg = pick_config(head_dim, q.dtype, interpreted)
    grid = (-(-seq_q // cfg.block_m), batch * heads)
    _kernel.attention_fwd_kernel[grid](
        q, k, v, out, lse, kv_lengths if kv_lengths is not None else q,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        heads, seq_q, seq_k,
        scale * _kernel.LOG2E,
        HAS_KV_LEN=kv_lengths is not None,
        HEAD_DIM=head_dim,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        IEEE_FP32=q.dtype == torch.float32,
        DOT_IN_FP32=interpreted and q.dtype == torch.bfloat16,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )


@torch.library.custom_op("studio::attention_fwd", mutates_args=("out", "lse"))
def attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  kv_lengths: torch.Tensor | None, scale: float,
                  out: torch.Tensor, lse: torch.Tensor) -> None:
    """Custom op behind :func:`attention`: writes ``out`` and ``lse`` in place."""
    rt.dispatch_attention(OP, q, out, lse, fallback_reason(q), LAUNCHES,
                          lambda: attention_reference(q, k, v, kv_lengths, scale),
                          lambda: _launch(q, k, v, kv_lengths, scale, out, lse))


@attention_fwd.register_fake
def _attention_fwd_fake(q, k, v, kv_lengths, scale, out, lse) -> None:
    return None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
              kv_lengths: torch.Tensor | None = None, scale: float | None = None,
              out: torch.Tensor | None = None,
              lse: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention forward ``softmax(q kᵀ · scale) v`` without a causal mask (FlashAttention-2
    style online softmax: Dao, "FlashAttention-2", ICLR 2024), fp32 accumulation.

    Args:
        q: (batch, heads, seq_q, head_dim); k, v: (batch, heads, seq_k, head_dim). Any
            batch/head/seq strides (a (batch, seq, heads, head_dim) tensor ``.transpose(1, 2)``
            is read in place); a non-contiguous head dim is copied. float16, bfloat16 or
            float32 with head_dim 32, 64 or 128 run in Triton; other float dtypes and head
            dims run the torch reference (logged once).
        kv_lengths: optional (batch,) int32: keys at index >= kv_lengths[b] are masked for
            batch item b (joint text+image sequences with padded text). Values are clamped to
            [0, seq_k]; 0 valid keys give output 0 and log-sum-exp -inf.
        scale: softmax scale, default 1/sqrt(head_dim).
        out: optional output buffer, shape of q, q's dtype, contiguous head dim.
        lse: optional (batch, heads, seq_q) float32 contiguous buffer for the log-sum-exp.

    Returns:
        (out, lse): out like q in q's dtype; lse (batch, heads, seq_q) float32, the natural
        log-sum-exp of the scaled masked scores (ring attention merges partial results by it).

    Raises:
        ValueError: malformed inputs (wrong rank, mismatched shapes/dtypes/devices,
            non-int32 kv_lengths, bad output buffers), naming the argument.
    """
    check_inputs(q, k, v, kv_lengths)
    batch, heads, seq_q, head_dim = q.shape
    q, k, v = (rt.last_dim_contiguous(t) for t in (q, k, v))
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    out, lse = rt.attention_outputs(q, out, lse)
    torch.ops.studio.attention_fwd(q, k, v, kv_lengths, scale, out, lse)
    return out, lse
