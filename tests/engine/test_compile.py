"""Regional torch.compile of a denoiser (studio.engine.compile): the repeated blocks are the
ones compiled, the result equals the eager run (the eager backend keeps the math), it
stacks with the step cache, and it can be undone."""

from __future__ import annotations

import pytest
import torch
from diffusers import WanTransformer3DModel

from studio.engine.caching import StepCacheConfig, apply_step_cache, remove_step_cache
from studio.engine.compile import compile_denoiser, compiled_blocks, uncompile_denoiser


def tiny_wan():
    torch.manual_seed(0)
    return WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2,
                                 attention_head_dim=16, in_channels=4, out_channels=4,
                                 text_dim=32, freq_dim=32, ffn_dim=64, num_layers=3,
                                 rope_max_seq_len=32).eval()


def run(model, steps=(999.0, 900.0, 780.0, 640.0, 500.0, 350.0)):
    torch.manual_seed(1)
    x, text = torch.randn(1, 4, 3, 8, 8), torch.randn(1, 7, 32)
    with torch.no_grad():
        return [model(x, torch.tensor([t]), text, return_dict=False)[0] for t in steps]


def test_the_repeated_blocks_compile_and_match_the_eager_run():
    model = tiny_wan()
    want = run(model)
    note = compile_denoiser(model, backend="eager")
    blocks = compiled_blocks(model)
    assert len(blocks) == 3 and all(type(b).__name__ == "WanTransformerBlock" for b in blocks)
    assert all(b._compiled_call_impl is not None for b in blocks)
    assert model._compiled_call_impl is None  # the blocks, not the whole model
    assert note == "torch.compile (eager) on 3 blocks"
    for got, expected in zip(run(model), want, strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    # the same settings again: nothing recompiled; other settings replace them
    first = blocks[0]._compiled_call_impl
    compile_denoiser(model, backend="eager")
    assert blocks[0]._compiled_call_impl is first
    compile_denoiser(model, backend="aot_eager")
    assert blocks[0]._compiled_call_impl is not first
    uncompile_denoiser(model)
    assert all(b._compiled_call_impl is None for b in blocks)
    assert model._studio_compiled is None


@pytest.mark.parametrize("signal", ["block", "output"])
def test_it_stacks_with_the_step_cache(signal):
    config = StepCacheConfig(threshold=10.0, warmup_steps=3, max_consecutive_skips=1,
                             signal=signal)
    model = tiny_wan()
    stats = apply_step_cache(model, config)
    want = run(model)
    remove_step_cache(model)
    compile_denoiser(model, backend="eager")
    compiled_stats = apply_step_cache(model, config)
    got = run(model)
    remove_step_cache(model)
    uncompile_denoiser(model)
    assert compiled_stats.skipped_calls == stats.skipped_calls > 0
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_model_without_blocks_is_refused():
    with pytest.raises(ValueError, match="compile: Linear has no repeated blocks"):
        compile_denoiser(torch.nn.Linear(4, 4), backend="eager")


def test_routed_attention_and_fused_blocks_count_calls_without_recompiling():
    """The attention router's and the fused blocks' call counters run outside the compiled
    graphs (count_outside_graph): traced, each count was a constant guarded on, and every
    forward recompiled. Compiled, the attention goes through diffusers' dispatcher; the
    graphs break only at the counters; the same shapes again compile nothing; the counts
    are exact; the output equals the eager routed run."""
    from torch._dynamo.utils import counters

    from studio.engine import fused_blocks
    from studio.engine.attention import AttentionConfig, apply_attention, remove_attention

    model = tiny_wan()
    fused_blocks.install(model)
    fused_blocks.set_fused(model, True)
    stats = apply_attention(model, AttentionConfig(kernel="flash"))
    want = run(model)
    eager_calls = dict(stats)
    torch._dynamo.reset()
    counters.clear()
    compile_denoiser(model, backend="eager")
    run(model, steps=(999.0, 900.0))
    # routed through diffusers' dispatcher, not a torch function mode over the compiled
    # blocks (under a mode, Tensor.unflatten in the processor broke the graph): the only
    # breaks left are the counters'
    assert counters["graph_break"]
    assert all("count_outside_graph" in reason for reason in counters["graph_break"])
    frames = counters["frames"]["ok"]
    got = run(model)
    assert counters["frames"]["ok"] == frames  # the same shapes: nothing compiled again
    # 14 forwards in all (6 eager, 2 + 6 compiled): each counts what an eager one does
    assert {k: v * 14 // 6 for k, v in eager_calls.items()} == dict(stats)
    assert model._studio_fused_stats["adaln_norm"] == 2 * 3 * 14  # two per block per call
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    uncompile_denoiser(model)
    remove_attention(model)
    torch._dynamo.reset()


def test_a_kernel_failing_inside_compiled_code_falls_back_to_sdpa(monkeypatch):
    """Compiled, the router's try/except around the kernel is traced away: a kernel that
    raises (a Triton build failure, say) surfaces at the hook, which marks the kernel broken,
    recompiles to SDPA and runs the step again, as the eager router does. Nothing is left in
    the dispatcher's per-device slot, after success or failure."""
    import studio.engine.attention as routing
    from studio.engine.attention import AttentionConfig, apply_attention, remove_attention
    from studio.kernels.attention import op as attention_op

    model = tiny_wan()
    want = run(model, steps=(999.0,))  # stock SDPA
    stats = apply_attention(model, AttentionConfig(kernel="flash"))
    torch._dynamo.reset()
    compile_denoiser(model, backend="eager")

    def out_of_memory(*args, **kwargs):
        raise RuntimeError("CUDA out of memory (planted)")

    def broken(*args, **kwargs):
        raise RuntimeError("triton: failed to build the kernel (planted)")

    try:
        # a RuntimeError that is not the kernels' is raised, not retried
        with monkeypatch.context() as patch:
            patch.setattr(model.blocks[0].attn1, "forward", out_of_memory)
            with pytest.raises(RuntimeError, match="out of memory"):
                run(model, steps=(999.0,))
        assert "flash" not in routing._BROKEN and routing._DISPATCH_ROUTERS == {}
        monkeypatch.setattr(attention_op, "attention_reference", broken)
        got = run(model, steps=(999.0,))
        assert "flash" in routing._BROKEN
        assert stats["sdpa"] == 6 and routing._DISPATCH_ROUTERS == {}  # 3 blocks x 2
        torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    finally:
        routing._BROKEN.discard("flash")
        uncompile_denoiser(model)
        remove_attention(model)
        torch._dynamo.reset()
