"""What every op in studio.kernels shares: can Triton run here, log-once fallbacks, checks.

No side effects at import: Triton is imported lazily by each op's ``kernel.py`` (which this
module never imports), nothing is probed until an op is called.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable
from types import ModuleType

import torch

log = logging.getLogger("studio.kernels")

_logged: set[tuple[str, str]] = set()


def log_fallback_once(op: str, reason: str) -> None:
    """Log, once per (op, reason) in this process, that ``op`` runs its torch reference."""
    if (op, reason) in _logged:
        return
    _logged.add((op, reason))
    log.warning("studio.kernels.%s: running the torch reference instead of Triton: %s", op, reason)


def is_interpreted(fn: object) -> bool:
    """True when ``fn`` was decorated with ``triton.jit`` while TRITON_INTERPRET=1 was set."""
    return type(fn).__name__ == "InterpretedFunction"


def triton_blocker(kernel_module: ModuleType | None, kernel_fn_name: str,
                   device: torch.device) -> str | None:
    """Why the Triton kernel cannot run for tensors on ``device``, or None when it can.

    ``kernel_module`` is the op's ``kernel.py`` (None when importing it failed, i.e. Triton is
    not installed). On the CPU the kernel runs only under Triton's interpreter, which must have
    been switched on (TRITON_INTERPRET=1) before ``kernel.py`` was imported: ``triton.jit``
    reads the variable when it decorates.
    """
    if kernel_module is None:
        return "Triton is not installed"
    fn = getattr(kernel_module, kernel_fn_name)
    if is_interpreted(fn):
        return None
    if device.type == "cuda":
        return None
    if device.type == "cpu":
        return ("the tensors are on the CPU and TRITON_INTERPRET=1 was not set when "
                "studio.kernels was imported")
    return f"Triton has no backend for device type {device.type!r}"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def check_same_device(names: Iterable[str], tensors: Iterable[torch.Tensor]) -> None:
    names, tensors = list(names), list(tensors)
    first = tensors[0].device
    for name, t in zip(names[1:], tensors[1:], strict=True):
        if t.device != first:
            raise ValueError(f"{name} must be on the same device as {names[0]} ({first}), "
                             f"got {t.device}")


def check_floating(name: str, t: torch.Tensor) -> None:
    if not t.is_floating_point():
        raise ValueError(f"{name}.dtype must be a floating-point dtype (float16, bfloat16 or "
                         f"float32 run in Triton), got {dtype_name(t.dtype)}")


def check_out(name: str, out: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype,
              device: torch.device) -> None:
    """An output buffer passed by the caller must match exactly what the op writes."""
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(out.shape)}")
    if out.dtype != dtype:
        raise ValueError(f"{name}.dtype must be {dtype_name(dtype)}, got {dtype_name(out.dtype)}")
    if out.device != device:
        raise ValueError(f"{name} must be on {device}, got {out.device}")
    if out.numel() and out.stride(-1) != 1:
        raise ValueError(f"{name} must have a contiguous last dimension (stride 1), "
                         f"got strides {tuple(out.stride())}")


def last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself when its last dimension has stride 1, else a contiguous copy."""
    return t if t.stride(-1) == 1 else t.contiguous()


def next_power_of_2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def check_modulation(name: str, t: torch.Tensor, x: torch.Tensor) -> None:
    """A per-sample modulation (AdaLN scale/shift/gate) must broadcast over x's tokens:
    (batch, dim), (batch, 1, dim) or (batch, seq, dim) for x of shape (batch, seq, dim)."""
    batch, seq, dim = x.shape
    allowed = {(batch, dim), (batch, 1, dim), (batch, seq, dim)}
    if not isinstance(t, torch.Tensor) or tuple(t.shape) not in allowed:
        got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{name} must have shape (batch, dim) = {(batch, dim)}, (batch, 1, dim) "
                         f"or (batch, seq, dim) = {(batch, seq, dim)}; got {got}")
    check_floating(name, t)
    check_same_device(("x", name), (x, t))


def row_strides(t: torch.Tensor) -> tuple[int, int]:
    """(batch stride, token stride) of a modulation tensor; token stride 0 when it broadcasts."""
    if t.dim() == 2 or t.shape[1] == 1:
        return t.stride(0), 0
    return t.stride(0), t.stride(1)


FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
ATTENTION_HEAD_DIMS = (32, 64, 128)


def attention_fallback_reason(kernel_module: ModuleType | None, kernel_fn_name: str,
                              q: torch.Tensor) -> str | None:
    """Why an attention op runs its torch reference instead of Triton (None: Triton runs):
    no usable Triton on this device, a dtype other than fp16/bf16/fp32, or a head dim other
    than 32/64/128."""
    reason = triton_blocker(kernel_module, kernel_fn_name, q.device)
    if reason is not None:
        return reason
    if q.dtype not in FLOAT_DTYPES:
        return f"dtype {dtype_name(q.dtype)} (Triton path: float16, bfloat16, float32)"
    if q.shape[-1] not in ATTENTION_HEAD_DIMS:
        dims = ", ".join(map(str, ATTENTION_HEAD_DIMS))
        return f"head_dim {q.shape[-1]} (Triton path: {dims})"
    return None


def attention_outputs(q: torch.Tensor, out: torch.Tensor | None,
                      lse: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The output (like q) and log-sum-exp ((batch, heads, seq_q) float32, contiguous;
    float64 for float64 q, which only the torch references run) buffers of an attention op:
    allocated when None, checked when given.

    Raises:
        ValueError: a given buffer of the wrong shape, dtype or device, or a strided lse.
    """
    batch, heads, seq_q, _ = q.shape
    if out is None:
        out = torch.empty_like(q)  # keeps q's layout, e.g. (batch, seq, heads, dim) in memory
    else:
        check_out("out", out, tuple(q.shape), q.dtype, q.device)
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    if lse is None:
        lse = torch.empty((batch, heads, seq_q), dtype=lse_dtype, device=q.device)
    else:
        check_out("lse", lse, (batch, heads, seq_q), lse_dtype, q.device)
        if not lse.is_contiguous():
            raise ValueError("lse must be contiguous")
    return out, lse


def dispatch_attention(op: str, q: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                       reason: str | None, launches: Counter,
                       reference: Callable[[], tuple[torch.Tensor, torch.Tensor]],
                       launch: Callable[[], None]) -> None:
    """The body every attention custom op shares: an empty input gives zeros and a -inf
    log-sum-exp; with a fallback ``reason`` the torch ``reference()`` fills ``out``/``lse``
    (the reason logged once); otherwise the Triton ``launch()`` runs. ``launches`` counts
    which path ran ("reference" / "triton"), for tests."""
    if q.numel() == 0:
        out.zero_()
        lse.fill_(float("-inf"))
        return
    if reason is not None:
        log_fallback_once(op, reason)
        launches["reference"] += 1
        ref_out, ref_lse = reference()
        out.copy_(ref_out)
        lse.copy_(ref_lse)
        return
    launches["triton"] += 1
    launch()
