"""studio.kernels.fp8_linear under Triton's interpreter: the row-wise fp8 quantizer against its
torch reference (odd shapes, several dtypes, a strided input, poisoned buffers, rows of zeros),
the fp8 product through ``torch._scaled_mm`` (the CPU's) against the float32 emulation and the
float32 product, input checks and torch.library."""

from __future__ import annotations

import pytest
import torch

from studio.kernels.fp8_linear import (
    LAUNCHES,
    fp8_linear,
    fp8_linear_reference,
    quantize_rows_fp8,
    quantize_rows_fp8_reference,
    quantize_weight_fp8,
)
from studio.kernels.fp8_linear.op import quantize_rows_fp8_op

from .helpers import launches, quality


@pytest.mark.parametrize("rows,features,dtype", [(77, 96, torch.bfloat16),
                                                 (129, 300, torch.float16),
                                                 (5, 1000, torch.float32)], ids=str)
def test_quantizer_matches_the_reference(rows, features, dtype):
    g = torch.Generator().manual_seed(rows)
    x = (torch.randn(rows, features, generator=g) * torch.rand(rows, 1, generator=g) * 9)
    x[3] = 0.0  # a row of zeros: scale falls back to fp32's tiny, values stay 0
    x = x.to(dtype)
    out = torch.full((rows, features), float("nan")).to(torch.float8_e4m3fn)
    scales = torch.full((rows, 1), float("nan"))
    with launches(LAUNCHES):
        quantize_rows_fp8(x, out=out, scales=scales)
    want, want_scales = quantize_rows_fp8_reference(x)
    assert not torch.isnan(out.float()).any() and not torch.isnan(scales).any()
    assert torch.equal(out.float(), want.float())  # round-to-nearest-even, as Tensor.to
    torch.testing.assert_close(scales, want_scales, rtol=0, atol=0)
    assert (out[3].float() == 0).all()


def test_quantizer_reads_a_strided_input():
    x = torch.randn(40, 64, dtype=torch.bfloat16)
    strided = torch.randn(40, 2, 64, dtype=torch.bfloat16)[:, 1]  # row stride 128
    strided.copy_(x)
    with launches(LAUNCHES):
        got, got_scales = quantize_rows_fp8(strided)
    want, want_scales = quantize_rows_fp8_reference(x)
    assert torch.equal(got.float(), want.float()) and torch.equal(got_scales, want_scales)


@pytest.mark.parametrize("dtype,bias", [(torch.bfloat16, True), (torch.float32, False)],
                         ids=str)
def test_fp8_linear_matches_its_emulation_and_the_float32_product(dtype, bias):
    g = torch.Generator().manual_seed(1)
    linear = torch.nn.Linear(96, 48, bias=bias)
    x = torch.randn(2, 37, 96, generator=g).to(dtype)
    w8, ws = quantize_weight_fp8(linear.weight)
    b = linear.bias.detach().to(dtype) if bias else None
    with launches(LAUNCHES):
        out = fp8_linear(x, w8, ws, b)
    assert out.shape == (2, 37, 48) and out.dtype == dtype
    emulated = fp8_linear_reference(x, w8, ws, b)
    cos, rel = quality(out, emulated)
    assert cos > 0.9999 and rel < 0.01, (cos, rel)  # the same numbers up to bf16 output
    exact = torch.nn.functional.linear(x.float(), linear.weight.detach(),
                                       None if b is None else b.float())
    cos, rel = quality(out, exact)
    assert cos > 0.998 and rel < 0.06, (cos, rel)  # fp8's 3 mantissa bits


def test_input_checks_name_the_argument():
    w8, ws = quantize_weight_fp8(torch.randn(32, 48))
    with pytest.raises(ValueError, match="multiples of 16"):
        fp8_linear(torch.randn(3, 40), *quantize_weight_fp8(torch.randn(32, 40)))
    with pytest.raises(ValueError, match="weight_fp8 must be"):
        fp8_linear(torch.randn(3, 32), w8, ws)
    with pytest.raises(ValueError, match="weight_scale must be"):
        fp8_linear(torch.randn(3, 48), w8, ws[:4])
    with pytest.raises(ValueError, match="x must be a 2-D"):
        quantize_rows_fp8(torch.randn(2, 3, 4))
    with pytest.raises(ValueError, match="scales must be"):
        quantize_rows_fp8(torch.randn(4, 16), scales=torch.empty(4))


def test_custom_op_passes_opcheck():
    x = torch.randn(9, 32, dtype=torch.bfloat16)
    out = torch.empty(9, 32, dtype=torch.float8_e4m3fn)
    # test_schema is left out: it compares mutated float8 tensors with arithmetic the CPU
    # does not implement for float8 ("mul_cpu_reduced_float")
    torch.library.opcheck(quantize_rows_fp8_op, (x, out, torch.empty(9, 1)),
                          test_utils=("test_autograd_registration", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))


def test_under_torch_compile_the_quantizer_is_traced_as_torch_ops():
    """Traced by torch.compile, fp8_linear quantizes with the torch reference (which inductor
    can fuse into the producer of x) instead of calling the opaque custom op: neither path of
    the op runs, and the result equals the eager (Triton) one."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(37, 96, generator=g).to(torch.bfloat16)
    w8, ws = quantize_weight_fp8(torch.randn(48, 96, generator=g))
    with launches(LAUNCHES):
        eager = fp8_linear(x * 2.0, w8, ws)
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: fp8_linear(x * 2.0, w8, ws), backend="eager",
                             fullgraph=True)
    with launches(LAUNCHES, triton=0, reference=0):
        out = compiled(x)
    assert torch.equal(out, eager)
    torch._dynamo.reset()
