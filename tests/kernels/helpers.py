"""Shared checks for the kernel tests: NaN-poisoned buffers, per-dtype tolerances, launches."""

from __future__ import annotations

import contextlib
from collections import Counter

import torch

# Per-dtype tolerances of a kernel against its float32-math reference. bf16 allows one bf16
# ulp more: the interpreter rounds float32 -> bfloat16 by truncation, the GPU to nearest.
TOLERANCES = {
    torch.float32: dict(atol=2e-5, rtol=2e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
}


def poisoned(shape, dtype=torch.float32) -> torch.Tensor:
    """A buffer full of NaN: any element the kernel forgets to write stays NaN."""
    return torch.full(tuple(shape), float("nan"), dtype=dtype)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert not torch.isnan(actual).any(), "unwritten (NaN) elements in the output"
    torch.testing.assert_close(actual.float(), expected.float(), **TOLERANCES[dtype])


def quality(actual: torch.Tensor, expected: torch.Tensor) -> tuple[float, float]:
    """(cosine similarity, relative L1 error) of two tensors, in float64."""
    a, e = actual.double().flatten(), expected.double().flatten()
    cos = torch.nn.functional.cosine_similarity(a, e, dim=0).item()
    return cos, ((a - e).abs().sum() / e.abs().sum()).item()


@contextlib.contextmanager
def launches(counter: Counter, triton: int = 1, reference: int = 0):
    """Assert the op ran its Triton kernel ``triton`` times and its reference ``reference``
    times inside the block (the interpreter really ran, no silent fallback)."""
    before = dict(counter)
    yield
    ran = {k: counter[k] - before.get(k, 0) for k in ("triton", "reference")}
    assert ran == {"triton": triton, "reference": reference}, f"launches: {ran}"
