"""studio.kernels.gated_residual under Triton's interpreter: ``x + gate * y`` against the torch
reference, NaN-poisoned outputs, input checks and torch.library."""

from __future__ import annotations

import pytest
import torch

from studio.kernels.gated_residual import LAUNCHES, gated_residual, gated_residual_reference
from studio.kernels.gated_residual.op import gated_residual_op

from .helpers import assert_close, launches, poisoned


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("gate_shape", [(2, 1000), (2, 1, 1000), (2, 77, 1000)], ids=str)
def test_matches_reference(dtype, gate_shape):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 77, 1000, generator=g).to(dtype)
    y = torch.randn(2, 77, 1000, generator=g).to(dtype)
    gate = torch.randn(*gate_shape, generator=g).to(torch.float32 if len(gate_shape) == 2
                                                    else dtype)
    out = poisoned(x.shape, dtype)
    with launches(LAUNCHES):
        got = gated_residual(x, gate, y, out=out)
    assert got is out
    assert_close(out, gated_residual_reference(x, gate, y), dtype)


@pytest.mark.parametrize("kwargs,match", [
    (dict(x=torch.randn(5, 8)), r"^x must be 3-D \(batch, seq, dim\)"),
    (dict(y=torch.randn(2, 6, 8)), r"^y must have x's shape \(2, 5, 8\)"),
    (dict(gate=torch.randn(3, 8)), r"^gate must have shape \(batch, dim\) = \(2, 8\)"),
    (dict(y=torch.ones(2, 5, 8, dtype=torch.int32)), r"^y\.dtype must be a floating"),
    (dict(out=torch.empty(2, 5, 9)), r"^out must have shape \(2, 5, 8\)"),
])
def test_input_checks_name_the_argument(kwargs, match):
    args = dict(x=torch.randn(2, 5, 8), gate=torch.randn(2, 8), y=torch.randn(2, 5, 8))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        gated_residual(args.pop("x"), args.pop("gate"), args.pop("y"), **args)


def test_custom_op_passes_opcheck():
    x, y, gate = torch.randn(2, 5, 40), torch.randn(2, 5, 40), torch.randn(2, 1, 40)
    torch.library.opcheck(gated_residual_op, (x, gate, y, torch.empty_like(x)))
