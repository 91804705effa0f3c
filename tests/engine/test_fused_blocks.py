"""Our fused DiT block ops inside real diffusers Wan blocks, interpreted on the CPU.

On, the blocks must run the Triton kernels (launch counters prove it) and give the stock
block's output within float32 rounding, for a per-sample timestep (Wan 2.1) and per-token
timesteps (Wan 2.2 TI2V, the embedded model); off, bit-identical to stock; the step cache's
hooks must keep wrapping the switchable blocks.
"""

from __future__ import annotations

import torch
from diffusers import WanTransformer3DModel

from studio.engine import fused_blocks
from studio.kernels.adaln_norm import op as adaln_op
from studio.kernels.gated_residual import op as gated_op
from studio.kernels.qk_norm_rope import op as qk_op


def tiny_wan(layers=2) -> WanTransformer3DModel:
    torch.manual_seed(0)
    model = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=3, attention_head_dim=32, in_channels=4,
        out_channels=4, text_dim=16, freq_dim=16, ffn_dim=64, num_layers=layers,
        cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=32).eval()
    with torch.no_grad():  # away from the zero-initialised defaults: every term matters
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    return model


def call(model, x, text, t):
    with torch.no_grad():
        return model(x, t, text, return_dict=False)[0]


def launches():
    return (adaln_op.LAUNCHES["triton"], qk_op.LAUNCHES["triton"],
            gated_op.LAUNCHES["triton"])


def test_fused_blocks_match_stock_and_run_triton():
    model = tiny_wan()
    x, text = torch.randn(1, 4, 3, 6, 10), torch.randn(1, 7, 16)  # 45 tokens, odd
    per_sample = torch.tensor([700.0])
    per_token = torch.linspace(0, 900, 45)[None]  # TI2V-style: one timestep per token
    want = [call(model, x, text, t) for t in (per_sample, per_token)]
    stats = fused_blocks.install(model)
    assert fused_blocks.install(model) is stats  # idempotent
    # installed but off: the stock path, bit for bit
    for t, w in zip((per_sample, per_token), want, strict=True):
        torch.testing.assert_close(call(model, x, text, t), w, atol=0, rtol=0)
    assert sum(stats.values()) == 0
    assert fused_blocks.set_fused(model, True)
    for t, w in zip((per_sample, per_token), want, strict=True):
        before = launches()
        got = call(model, x, text, t)
        after = launches()
        # per block: 2 AdaLN norms, query and key, 2 gated residuals
        assert [a - b for a, b in zip(after, before, strict=True)] == [4, 4, 4]
        torch.testing.assert_close(got, w, atol=2e-5, rtol=1e-4)
    assert stats == {"adaln_norm": 8, "qk_norm_rope": 8, "gated_residual": 8}
    fused_blocks.set_fused(model, False)
    torch.testing.assert_close(call(model, x, text, per_sample), want[0], atol=0, rtol=0)


def test_step_cache_hooks_wrap_the_fused_blocks():
    from studio.engine.caching import StepCacheConfig, apply_step_cache, remove_step_cache

    model = tiny_wan(layers=3)
    x, text, t = torch.randn(1, 4, 1, 6, 10), torch.randn(1, 7, 16), torch.tensor([500.0])
    want = call(model, x, text, t)
    stats = fused_blocks.install(model)
    fused_blocks.set_fused(model, True)
    apply_step_cache(model, StepCacheConfig(threshold=0.0))
    torch.testing.assert_close(call(model, x, text, t), want, atol=2e-5, rtol=1e-4)
    assert stats["adaln_norm"] == 6  # the cache's hooks called through the fused blocks
    remove_step_cache(model)
    fused_blocks.set_fused(model, False)
    torch.testing.assert_close(call(model, x, text, t), want, atol=0, rtol=0)


def test_blocks_with_hooks_already_stay_stock_and_other_families_are_left_alone():
    from diffusers import FluxTransformer2DModel

    from studio.engine.caching import StepCacheConfig, apply_step_cache

    model = tiny_wan()
    apply_step_cache(model, StepCacheConfig(threshold=0.0))  # hooks first
    stats = fused_blocks.install(model)
    assert not fused_blocks.set_fused(model, True)  # no block could be made switchable
    x, text, t = torch.randn(1, 4, 1, 6, 10), torch.randn(1, 7, 16), torch.tensor([500.0])
    call(model, x, text, t)
    assert sum(stats.values()) == 0
    flux = FluxTransformer2DModel(patch_size=1, in_channels=4, num_layers=1,
                                  num_single_layers=1, attention_head_dim=16,
                                  num_attention_heads=2, joint_attention_dim=8,
                                  pooled_projection_dim=8, axes_dims_rope=(4, 6, 6))
    assert fused_blocks.install(flux) is None
