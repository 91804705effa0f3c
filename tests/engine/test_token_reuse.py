"""Token-level reuse: only the tokens whose input moved are recomputed; state is per CFG
branch, per batch item and per trajectory."""

from __future__ import annotations

import pytest
import torch
from diffusers import WanTransformer3DModel

from studio.engine.caching.token_reuse import (
    TokenReuseConfig,
    apply_token_reuse,
    remove_token_reuse,
    reset_token_reuse,
)


class TwoLinearBlocks(torch.nn.Module):
    """A stand-in transformer: blocks of one token-wise linear layer each."""

    def __init__(self, dim=8):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(dim, dim) for _ in range(2))

    def forward(self, hidden_states, timestep):
        for block in self.blocks:
            hidden_states = block(hidden_states)
        return hidden_states


def test_config_rejects_bad_fields():
    with pytest.raises(ValueError, match="threshold"):
        TokenReuseConfig(threshold=-0.1)
    with pytest.raises(ValueError, match="max_fraction"):
        TokenReuseConfig(max_fraction=0)
    with pytest.raises(ValueError, match="min_tokens"):
        TokenReuseConfig(min_tokens=0)


def test_only_moved_tokens_are_recomputed():
    model = TwoLinearBlocks()
    stats = apply_token_reuse(model, TokenReuseConfig(threshold=0.01, min_tokens=1))
    x = torch.randn(2, 20, 8)
    with torch.no_grad():
        first = model(x, torch.tensor([900.0]))
        moved = x.clone()
        moved[0, :3] += 1.0                 # 3 tokens of item 0 move a lot
        moved[1] *= 1.0001                  # item 1 drifts by 0.01 %: below the threshold
        assert stats.computed == 2 * 40
        second = model(moved, torch.tensor([800.0]))
    # layer 1 recomputes the 3 moved rows; layer 2 sees them change and recomputes them too
    assert stats.computed == 2 * 40 + 2 * 3 and stats.reused == 2 * 37
    remove_token_reuse(model)
    with torch.no_grad():
        exact = model(moved, torch.tensor([800.0]))
    torch.testing.assert_close(second[0, :3], exact[0, :3])
    torch.testing.assert_close(second[0, 3:], first[0, 3:])  # reused as they were
    torch.testing.assert_close(second[1], first[1])
    assert not torch.equal(second[1], exact[1])  # the drift was within the tolerance


def wan():
    torch.manual_seed(0)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=4,
        out_channels=4, text_dim=16, freq_dim=16, ffn_dim=32, num_layers=2,
        cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=32).eval()


def trajectory(model, contexts, steps=(999.0, 850.0, 700.0, 500.0, 300.0)):
    """Calls per step and context; the latents follow the first context's output."""
    torch.manual_seed(1)
    x = torch.randn(1, 4, 3, 8, 8)
    texts = {c: torch.randn(1, 20, 16) for c in ("cond", "uncond")}
    outs = []
    with torch.no_grad():
        for t in steps:
            step_out = {}
            for ctx in contexts:
                with model.cache_context(ctx):
                    step_out[ctx] = model(x, torch.tensor([t]), texts[ctx], return_dict=False)[0]
            outs.append(step_out)
            x = x - 0.15 * step_out[contexts[0]]
    return outs


def test_threshold_zero_matches_no_reuse_and_reuses_the_text():
    model = wan()
    want = trajectory(model, ("cond", "uncond"))
    stats = apply_token_reuse(model, TokenReuseConfig(threshold=0.0))
    got = trajectory(model, ("cond", "uncond"))
    assert stats.reused > 0  # the cross-attention K/V of the unchanged text tokens
    for g, w in zip(got, want, strict=True):
        for ctx in g:
            torch.testing.assert_close(g[ctx], w[ctx], atol=1e-5, rtol=1e-5)


def test_no_leak_between_branches_or_trajectories():
    config = TokenReuseConfig(threshold=0.2)
    shared, cond_only, uncond_only = wan(), wan(), wan()
    for m in (shared, cond_only, uncond_only):
        apply_token_reuse(m, config)
    both = trajectory(shared, ("cond", "uncond"))
    alone_c = trajectory(cond_only, ("cond",))
    # the uncond-only model must follow the same latents: drive it with cond's path
    alone_u = []
    torch.manual_seed(1)
    x = torch.randn(1, 4, 3, 8, 8)
    texts = {c: torch.randn(1, 20, 16) for c in ("cond", "uncond")}
    with torch.no_grad():
        for i, t in enumerate((999.0, 850.0, 700.0, 500.0, 300.0)):
            with uncond_only.cache_context("uncond"):
                alone_u.append(uncond_only(x, torch.tensor([t]), texts["uncond"],
                                           return_dict=False)[0])
            x = x - 0.15 * both[i]["cond"]
    for i in range(5):
        torch.testing.assert_close(both[i]["cond"], alone_c[i]["cond"], atol=0, rtol=0)
        torch.testing.assert_close(both[i]["uncond"], alone_u[i], atol=0, rtol=0)
    assert shared._studio_token_reuse.reused > 0
    again = trajectory(shared, ("cond", "uncond"))  # a new trajectory starts clean
    for a, b in zip(again, both, strict=True):
        torch.testing.assert_close(a["cond"], b["cond"], atol=0, rtol=0)
    reset_token_reuse(shared)
    assert shared._studio_token_reuse.computed == 0
