"""studio.kernels.qk_norm_rope under Triton's interpreter: RMSNorm + RoPE against the torch
reference and against diffusers' own Wan and Flux code paths, NaN-poisoned outputs, input
checks, torch.library and torch.compile."""

from __future__ import annotations

import pytest
import torch

from studio.kernels.qk_norm_rope import LAUNCHES, qk_norm_rope, qk_norm_rope_reference
from studio.kernels.qk_norm_rope.op import qk_norm_rope_op

from .helpers import assert_close, launches, poisoned

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def tables(batch, seq, head_dim, seed=1):
    g = torch.Generator().manual_seed(seed)
    angle = torch.rand(batch, seq, head_dim // 2, generator=g) * 6.3
    angle = angle.repeat_interleave(2, dim=-1)
    return angle.cos(), angle.sin()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("norm", ["head", "all"])
@pytest.mark.parametrize("seq,heads,head_dim,cos_batch", [
    (77, 3, 64, 1), (129, 3, 32, 2), (5, 2, 48, 1), (1, 1, 128, 2)])
def test_matches_reference(dtype, norm, seq, heads, head_dim, cos_batch):
    batch = 2
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(batch, seq, heads * head_dim, generator=g) * 2 + 0.5).to(dtype)
    weight = (1 + 0.3 * torch.randn(head_dim if norm == "head" else heads * head_dim,
                                    generator=g)).to(dtype)
    cos, sin = tables(cos_batch, seq, head_dim)
    out = poisoned(x.shape, dtype)
    with launches(LAUNCHES):
        got = qk_norm_rope(x, weight, cos, sin, heads=heads, norm=norm, out=out)
    assert got is out
    assert_close(out, qk_norm_rope_reference(x, weight, cos, sin, heads, 1e-6, norm), dtype)


def test_matches_diffusers_wan_attention_path():
    """Wan: RMSNorm across heads (norm_q) then its processor's rotary embedding."""
    from diffusers.models.transformers.transformer_wan import WanAttention, WanRotaryPosEmbed

    torch.manual_seed(0)
    attn = WanAttention(dim=192, heads=3, dim_head=64, eps=1e-6, cross_attention_dim_head=None)
    with torch.no_grad():
        attn.norm_q.weight.copy_(1 + 0.2 * torch.randn(192))
    rope = WanRotaryPosEmbed(attention_head_dim=64, patch_size=(1, 2, 2), max_seq_len=64)
    latents = torch.randn(1, 4, 3, 10, 6)  # 3 x 5 x 3 = 45 tokens
    cos, sin = rope(latents)
    q = attn.to_q(torch.randn(1, 45, 192))
    with torch.no_grad():
        want = attn.norm_q(q).unflatten(2, (3, -1))
        x1, x2 = want.unflatten(-1, (-1, 2)).unbind(-1)
        c, s = cos[..., 0::2], sin[..., 1::2]
        rotated = torch.empty_like(want)
        rotated[..., 0::2] = x1 * c - x2 * s
        rotated[..., 1::2] = x1 * s + x2 * c
        with launches(LAUNCHES):
            got = qk_norm_rope(q, attn.norm_q.weight, cos, sin, heads=3, norm="all")
    assert_close(got.unflatten(2, (3, -1)), rotated, torch.float32)


def test_matches_diffusers_flux_attention_path():
    """Flux: RMSNorm per head then diffusers' apply_rotary_emb (real form, pairs)."""
    from diffusers.models.embeddings import FluxPosEmbed, apply_rotary_emb
    from diffusers.models.normalization import RMSNorm

    torch.manual_seed(0)
    norm = RMSNorm(32, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.2 * torch.randn(32))
    ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(7.0), torch.arange(5.0),
                                     indexing="ij"), -1).reshape(-1, 3)  # 35 tokens
    cos, sin = FluxPosEmbed(theta=10000, axes_dim=[8, 12, 12])(ids)
    q = torch.randn(2, 35, 4 * 32)
    with torch.no_grad():
        want = apply_rotary_emb(norm(q.unflatten(2, (4, -1))), (cos, sin), sequence_dim=1)
        with launches(LAUNCHES):
            got = qk_norm_rope(q, norm.weight, cos, sin, heads=4, norm="head")
    assert_close(got.unflatten(2, (4, -1)), want, torch.float32)


@pytest.mark.parametrize("kwargs,match", [
    (dict(norm="layer"), r"^norm must be one of 'head', 'all'"),
    (dict(x=torch.randn(5, 8)), r"^x must be 3-D"),
    (dict(heads=3), r"^heads must be a positive divisor of x's last dim 16"),
    (dict(heads=16), r"^head_dim must be even"),
    (dict(weight=torch.ones(16)), r"^weight must have shape \(8,\) for norm 'head'"),
    (dict(cos=torch.ones(5, 4)), r"^cos and sin must both be \(seq, head_dim\) = \(5, 8\)"),
    (dict(sin=torch.ones(3, 5, 8)), r"^cos and sin must both be"),
    (dict(weight=torch.ones(8, dtype=torch.int32)), r"^weight\.dtype must be a floating"),
    (dict(eps=-1.0), r"^eps must be >= 0"),
    (dict(out=torch.empty(2, 5, 16, dtype=torch.float16)), r"^out\.dtype must be float32"),
])
def test_input_checks_name_the_argument(kwargs, match):
    args = dict(x=torch.randn(2, 5, 16), weight=torch.ones(8), cos=torch.ones(5, 8),
                sin=torch.zeros(5, 8), heads=2)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        qk_norm_rope(args.pop("x"), args.pop("weight"), args.pop("cos"), args.pop("sin"),
                     **args)


def test_custom_op_passes_opcheck_and_compiles():
    x, w = torch.randn(2, 5, 64), torch.rand(32) + 0.5
    cos, sin = tables(1, 5, 32)
    torch.library.opcheck(qk_norm_rope_op, (x, w, cos, sin, 2, False, 1e-6, torch.empty_like(x)))

    def f(x, w, cos, sin):
        return qk_norm_rope(x, w, cos, sin, heads=2) * 2

    compiled = torch.compile(f, backend="eager", fullgraph=True)
    with launches(LAUNCHES):
        got = compiled(x, w, cos, sin)
    assert_close(got, qk_norm_rope_reference(x, w, cos, sin, 2) * 2, torch.float32)
