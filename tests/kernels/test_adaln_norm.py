"""studio.kernels.adaln_norm under Triton's interpreter: LayerNorm/RMSNorm with AdaLN
modulation against the torch reference and torch's own LayerNorm, NaN-poisoned outputs, input
checks, torch.library and torch.compile."""

from __future__ import annotations

import pytest
import torch

from studio.kernels.adaln_norm import LAUNCHES, adaln_norm, adaln_norm_reference
from studio.kernels.adaln_norm.op import adaln_norm_op

from .helpers import assert_close, launches, poisoned

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def inputs(batch, seq, dim, mod_shape, dtype, mod_dtype=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(batch, seq, dim, generator=g) * 3 + 1).to(dtype)
    scale = (0.5 * torch.randn(*mod_shape, generator=g)).to(mod_dtype or dtype)
    shift = torch.randn(*mod_shape, generator=g).to(mod_dtype or dtype)
    return x, scale, shift


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("norm", ["layer", "rms"])
@pytest.mark.parametrize("mod", ["batch", "batch1", "token"])
def test_matches_reference(dtype, norm, mod):
    batch, seq, dim = 2, 77, 1000  # odd dim: masked tail; several programs under the interpreter
    mod_shape = {"batch": (batch, dim), "batch1": (batch, 1, dim), "token": (batch, seq, dim)}
    x, scale, shift = inputs(batch, seq, dim, mod_shape[mod], dtype)
    out = poisoned(x.shape, dtype)
    with launches(LAUNCHES):
        got = adaln_norm(x, scale, shift, norm=norm, eps=1e-6, out=out)
    assert got is out
    assert_close(out, adaln_norm_reference(x, scale, shift, norm, 1e-6), dtype)


def test_layer_norm_matches_torch_layer_norm_with_float32_modulation():
    # Wan keeps x in bf16 and its modulation in float32.
    x, scale, shift = inputs(2, 13, 96, (2, 1, 96), torch.bfloat16, mod_dtype=torch.float32)
    with launches(LAUNCHES):
        out = adaln_norm(x, scale, shift)
    ln = torch.nn.LayerNorm(96, elementwise_affine=False, eps=1e-6)
    expected = (ln(x.float()) * (1 + scale) + shift).to(torch.bfloat16)
    assert out.dtype == torch.bfloat16
    assert_close(out, expected, torch.bfloat16)


@pytest.mark.parametrize("kwargs,match", [
    (dict(norm="group"), r"^norm must be one of 'layer', 'rms', got 'group'"),
    (dict(x=torch.randn(5, 8)), r"^x must be 3-D \(batch, seq, dim\)"),
    (dict(scale=torch.randn(2, 3, 8)), r"^scale must have shape \(batch, dim\) = \(2, 8\)"),
    (dict(shift=torch.randn(8)), r"^shift must have shape"),
    (dict(scale=torch.ones(2, 8, dtype=torch.int64)), r"^scale\.dtype must be a floating"),
    (dict(eps=-1.0), r"^eps must be >= 0"),
    (dict(out=torch.empty(2, 5, 8, dtype=torch.float16)), r"^out\.dtype must be float32"),
])
def test_input_checks_name_the_argument(kwargs, match):
    args = dict(x=torch.randn(2, 5, 8), scale=torch.randn(2, 8), shift=torch.randn(2, 8))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        adaln_norm(args.pop("x"), args.pop("scale"), args.pop("shift"), **args)


def test_custom_op_passes_opcheck_and_compiles():
    x, scale, shift = inputs(2, 5, 40, (2, 40), torch.float32)
    torch.library.opcheck(adaln_norm_op, (x, scale, shift, True, 1e-5, torch.empty_like(x)))

    def modulate(x, scale, shift):
        return adaln_norm(x, scale, shift, norm="rms", eps=1e-5) * 2

    compiled = torch.compile(modulate, backend="eager", fullgraph=True)
    with launches(LAUNCHES):
        got = compiled(x, scale, shift)
    assert_close(got, adaln_norm_reference(x, scale, shift, "rms", 1e-5) * 2, torch.float32)
