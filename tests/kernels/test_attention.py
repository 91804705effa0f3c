"""studio.kernels.attention under Triton's interpreter: against the float32 reference and SDPA
on odd shapes, NaN-poisoned outputs, key lengths, layouts, fallbacks, input checks, torch.library
and torch.compile."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from studio.kernels.attention import LAUNCHES, Config, attention, attention_reference, use_config
from studio.kernels.attention.op import attention_fwd

from .helpers import assert_close, launches, poisoned

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def qkv(batch, heads, seq_q, seq_k, head_dim, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, seq_q, head_dim, generator=g).to(dtype)
    k = torch.randn(batch, heads, seq_k, head_dim, generator=g).to(dtype)
    v = torch.randn(batch, heads, seq_k, head_dim, generator=g).to(dtype)
    return q, k, v


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [32, 64, 128])
def test_matches_reference_with_kv_lengths(dtype, head_dim):
    q, k, v = qkv(2, 3, 129, 77, head_dim, dtype)
    kv_lengths = torch.tensor([77, 40], dtype=torch.int32)
    out, lse = poisoned(q.shape, dtype), poisoned((2, 3, 129))
    with launches(LAUNCHES):
        got_out, got_lse = attention(q, k, v, kv_lengths=kv_lengths, out=out, lse=lse)
    assert got_out is out and got_lse is lse
    ref_out, ref_lse = attention_reference(q, k, v, kv_lengths)
    assert_close(out, ref_out, dtype)
    assert_close(lse, ref_lse, torch.float32)


def test_many_small_tiles():
    q, k, v = qkv(1, 2, 129, 77, 32, torch.float16, seed=3)
    kv_lengths = torch.tensor([70], dtype=torch.int32)
    out = poisoned(q.shape, torch.float16)
    with use_config(Config(16, 16)), launches(LAUNCHES):
        attention(q, k, v, kv_lengths=kv_lengths, out=out)
    assert_close(out, attention_reference(q, k, v, kv_lengths)[0], torch.float16)


def test_self_attention_in_sequence_major_layout_matches_sdpa():
    # (batch, seq, heads, dim) in memory, as diffusers' attention dispatch holds it.
    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2)
               for t in qkv(2, 3, 129, 129, 64, torch.float32, seed=1))
    assert not q.is_contiguous()
    with launches(LAUNCHES):
        out, lse = attention(q, k, v, scale=0.3)
    assert out.stride() == q.stride()  # the output keeps the input's layout
    assert_close(out, F.scaled_dot_product_attention(q, k, v, scale=0.3), torch.float32)
    s = (q @ k.transpose(-1, -2)) * 0.3
    assert_close(lse, torch.logsumexp(s, dim=-1), torch.float32)


def test_zero_and_overlong_kv_lengths():
    q, k, v = qkv(2, 1, 33, 20, 32, torch.float16, seed=2)
    out = poisoned(q.shape, torch.float16)
    with launches(LAUNCHES):
        _, lse = attention(q, k, v, kv_lengths=torch.tensor([0, 999], dtype=torch.int32),
                           out=out)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert torch.isneginf(lse[0]).all()
    assert_close(out[1:], attention_reference(q[1:], k[1:], v[1:])[0], torch.float16)


def test_unsupported_head_dim_and_dtype_fall_back_to_the_reference_once(caplog):
    q, k, v = qkv(1, 2, 17, 9, 48, torch.float32)
    with caplog.at_level(logging.WARNING, logger="studio.kernels"):
        with launches(LAUNCHES, triton=0, reference=2):
            out, _ = attention(q, k, v)
            attention(q, k, v)
        with launches(LAUNCHES, triton=0, reference=1):
            out64, _ = attention(*(t.double() for t in qkv(1, 2, 17, 9, 32, torch.float32)))
    assert_close(out, attention_reference(q, k, v)[0], torch.float32)
    assert out64.dtype == torch.float64
    messages = [r.getMessage() for r in caplog.records]
    assert sum("head_dim 48" in m for m in messages) == 1  # once per reason
    assert sum("dtype float64" in m for m in messages) == 1


def _bad(**overrides):
    q, k, v = qkv(2, 3, 5, 7, 32, torch.float32)
    args = dict(q=q, k=k, v=v, kv_lengths=None, out=None, lse=None)
    args.update(overrides)
    return args


@pytest.mark.parametrize("overrides,match", [
    (dict(q=torch.randn(3, 5, 32)), r"^q must be 4-D"),
    (dict(k=torch.randn(2, 3, 7, 32).half()), r"q, k and v must share one dtype"),
    (dict(v=torch.randn(2, 3, 8, 32)), r"^k and v must have the same shape"),
    (dict(k=torch.randn(2, 4, 7, 32), v=torch.randn(2, 4, 7, 32)), r"^k must have q's batch"),
    (dict(q=torch.ones(2, 3, 5, 32, dtype=torch.int32)), r"^q\.dtype must be a floating"),
    (dict(kv_lengths=torch.tensor([1, 2])), r"^kv_lengths\.dtype must be int32, got int64"),
    (dict(kv_lengths=torch.tensor([1], dtype=torch.int32)), r"^kv_lengths must have shape"),
    (dict(out=torch.empty(2, 3, 5, 32, dtype=torch.float16)), r"^out\.dtype must be float32"),
    (dict(out=torch.empty(2, 3, 6, 32)), r"^out must have shape \(2, 3, 5, 32\)"),
    (dict(lse=torch.empty(2, 3, 5, dtype=torch.float16)), r"^lse\.dtype must be float32"),
])
def test_input_checks_name_the_argument(overrides, match):
    args = _bad(**overrides)
    with pytest.raises(ValueError, match=match):
        attention(args.pop("q"), args.pop("k"), args.pop("v"), **args)


def test_custom_op_passes_opcheck():
    q, k, v = qkv(1, 2, 20, 16, 32, torch.float32)
    out, lse = torch.empty_like(q), torch.empty(1, 2, 20)
    torch.library.opcheck(attention_fwd, (q, k, v, torch.tensor([9], dtype=torch.int32), 0.2,
                                          out, lse))


def test_traces_under_torch_compile():
    q, k, v = qkv(1, 2, 20, 16, 32, torch.float32)

    def block(q, k, v):
        out, lse = attention(q * 2, k, v)
        return out + 1, lse

    compiled = torch.compile(block, backend="eager", fullgraph=True)
    with launches(LAUNCHES):
        out, lse = compiled(q, k, v)
    ref_out, ref_lse = attention_reference(q * 2, k, v)
    assert_close(out, ref_out + 1, torch.float32)
    assert_close(lse, ref_lse, torch.float32)


def test_cpu_without_the_interpreter_runs_the_reference_and_says_why():
    code = (
        "import logging, torch\n"
        "logging.basicConfig(level=logging.WARNING)\n"
        "from studio.kernels.attention import LAUNCHES, attention, attention_reference\n"
        "q = torch.randn(1, 2, 9, 32)\n"
        "out, _ = attention(q, q, q); attention(q, q, q)\n"
        "assert torch.allclose(out, attention_reference(q, q, q)[0])\n"
        "print(dict(LAUNCHES))\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[2], timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "{'reference': 2}"
    assert done.stderr.count("TRITON_INTERPRET=1 was not set") == 1
