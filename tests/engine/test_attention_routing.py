"""Our attention kernels inside real diffusers denoisers, interpreted on the CPU.

The routing must send the model's attention through the Triton kernels (the launch counters
prove it), give the SDPA result within each kernel's tolerance, fall back to SDPA for calls
the kernels do not cover, and leave the model stock once removed.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from diffusers import DiffusionPipeline, WanPipeline, WanTransformer3DModel

from studio.engine.attention import AttentionConfig, apply_attention, remove_attention
from studio.engine.models.registry import DEFAULT_EMBEDDED, EMBEDDED_DIR
from studio.engine.pipelines.base import derive_pipeline
from studio.engine.pipelines.wan import fit_token_timesteps
from studio.kernels.attention import op as flash_op
from studio.kernels.sage_attention import op as sage_op


def tiny_wan(heads=2, head_dim=32, layers=2) -> WanTransformer3DModel:
    torch.manual_seed(0)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=heads, attention_head_dim=head_dim,
        in_channels=4, out_channels=4, text_dim=16, freq_dim=16, ffn_dim=32,
        num_layers=layers, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32).eval()


def call(model, x, text, t=500.0):
    with torch.no_grad():
        return model(x, torch.tensor([t]), text, return_dict=False)[0]


def test_config_rejects_bad_fields():
    with pytest.raises(ValueError, match="kernel"):
        AttentionConfig(kernel="xformers")
    with pytest.raises(ValueError, match="sparse_window"):
        AttentionConfig(kernel="sparse", sparse_window=(1, -1, 2))
    with pytest.raises(ValueError, match="block"):
        AttentionConfig(block=48)


def test_flash_routing_runs_triton_and_matches_sdpa():
    model = tiny_wan()
    x, text = torch.randn(1, 4, 3, 6, 10), torch.randn(1, 7, 16)  # 45 tokens, odd
    want = call(model, x, text)
    before = flash_op.LAUNCHES["triton"]
    stats = apply_attention(model, AttentionConfig(kernel="flash"))
    got = call(model, x, text)
    # 2 blocks x (self + cross attention)
    assert stats["flash"] == 4 and flash_op.LAUNCHES["triton"] - before == 4
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    remove_attention(model)
    torch.testing.assert_close(call(model, x, text), want, atol=0, rtol=0)


def test_a_triton_build_error_falls_back_to_sdpa(monkeypatch):
    """Triton's own errors (CompilationError, OutOfResources, PTXASError) are not
    RuntimeErrors: a kernel that does not build on the GPU is marked broken on them too, and
    the call (and every later one) runs SDPA instead of failing the job."""
    from triton.runtime.errors import OutOfResources

    import studio.engine.attention as routing

    def too_big(*args, **kwargs):
        raise OutOfResources(262144, 232448, "shared memory")

    model = tiny_wan()
    x, text = torch.randn(1, 4, 3, 6, 10), torch.randn(1, 7, 16)
    want = call(model, x, text)
    stats = apply_attention(model, AttentionConfig(kernel="flash"))
    monkeypatch.setattr(flash_op, "_launch", too_big)
    try:
        got = call(model, x, text)
        assert "flash" in routing._BROKEN
        assert stats["sdpa"] == 4  # every call ran SDPA: the failed one, and the later ones
        torch.testing.assert_close(got, want, atol=0, rtol=0)
    finally:
        routing._BROKEN.discard("flash")
        remove_attention(model)


@pytest.mark.parametrize("signal", ["block", "output"])
def test_taking_one_lever_off_keeps_the_others_and_leaves_stock(signal):
    """diffusers' registry rewires cleanly only the hook registered last. Jobs swap levers
    in a long-lived engine: routing on, the step cache put on after it, the routing taken
    off (a later profile), then the cache. The cache must keep running once the routing is
    gone, and with both gone the model must be stock to the bit. Before, taking the routing
    off silently turned the cache off, and taking the cache off then put the routing back."""
    from studio.engine.caching import StepCacheConfig, apply_step_cache, remove_step_cache

    model = tiny_wan()
    x, text = torch.randn(1, 4, 3, 6, 10), torch.randn(1, 7, 16)
    want = call(model, x, text)
    routed = apply_attention(model, AttentionConfig(kernel="flash"))
    cache = apply_step_cache(model, StepCacheConfig(signal=signal, threshold=0.0))
    call(model, x, text)
    assert routed["flash"] == 4 and cache.calls == 1
    remove_attention(model)
    got = call(model, x, text, t=400.0)
    assert routed["flash"] == 4  # the routing is off
    assert cache.calls == 2  # and the cache still runs
    torch.testing.assert_close(got, call_stock(x, text, t=400.0), atol=0, rtol=0)
    remove_step_cache(model)
    assert cache.calls == 2 and routed["flash"] == 4
    torch.testing.assert_close(call(model, x, text), want, atol=0, rtol=0)
    assert cache.calls == 2 and routed["flash"] == 4  # neither came back


def call_stock(x, text, t):
    return call(tiny_wan(), x, text, t=t)


def test_sage_routing_is_close_to_sdpa():
    model = tiny_wan()
    x, text = torch.randn(1, 4, 3, 6, 10), torch.randn(1, 7, 16)
    want = call(model, x, text)
    before = sage_op.LAUNCHES["triton"]
    stats = apply_attention(model, AttentionConfig(kernel="sage"))
    got = call(model, x, text)
    assert stats["sage"] == 4 and sage_op.LAUNCHES["triton"] - before == 4
    cos = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0)
    assert cos > 0.999 and not torch.equal(got, want)


def test_sparse_routing_uses_the_video_token_grid():
    model = tiny_wan()
    x, text = torch.randn(1, 4, 4, 8, 8), torch.randn(1, 7, 16)  # grid 4 x 4 x 4 = 64 tokens
    want = call(model, x, text)
    # a window covering the whole clip keeps every block: dense attention again
    wide = apply_attention(model, AttentionConfig(kernel="sparse", sparse_window=(4, 4, 4),
                                                  block=16))
    torch.testing.assert_close(call(model, x, text), want, atol=2e-5, rtol=1e-4)
    assert wide["sparse"] == 2 and wide["flash"] == 2  # self-attn sparse, cross-attn flash
    narrow = apply_attention(model, AttentionConfig(kernel="sparse", sparse_window=(0, 1, 1),
                                                    block=16))
    got = call(model, x, text)
    assert narrow["sparse"] == 2 and torch.isfinite(got).all()
    assert not torch.allclose(got, want, atol=1e-3)  # frames no longer see each other
    remove_attention(model)


def test_sparse_runs_dense_above_its_timestep():
    """The dense warm-up: at timesteps at or above ``sparse_below_timestep`` video
    self-attention runs the inner kernel whole (the same output as the dense kernel), below
    it the sparse layout."""
    model = tiny_wan()
    x, text = torch.randn(1, 4, 4, 8, 8), torch.randn(1, 7, 16)
    config = AttentionConfig(kernel="sparse", sparse_window=(0, 1, 1), block=16,
                             sparse_below_timestep=600.0)
    stats = apply_attention(model, config)
    early, late = call(model, x, text, t=800.0), call(model, x, text, t=599.0)
    # t=800: 2 self-attention calls dense + 2 cross; t=599: 2 sparse + 2 cross
    assert stats["sparse"] == 2 and stats["flash"] == 6
    apply_attention(model, AttentionConfig(kernel="flash"))
    torch.testing.assert_close(early, call(model, x, text, t=800.0), atol=0, rtol=0)
    assert not torch.allclose(late, call(model, x, text, t=599.0), atol=1e-3)
    # a Wan 2.2 TI2V-style per-token timestep counts by its highest value
    apply_attention(model, config)
    with torch.no_grad():
        model(x, torch.full((1, 64), 500.0), text, return_dict=False)
    assert model._studio_attention[1]["sparse"] == 2
    remove_attention(model)


def test_masked_calls_stay_on_sdpa():
    model = torch.nn.Module()
    stats = apply_attention(model, AttentionConfig(kernel="flash"))
    from studio.engine.attention import _Router

    q = torch.randn(1, 2, 5, 32)
    mask = torch.ones(5, 5, dtype=torch.bool)
    with _Router(AttentionConfig(kernel="flash"), stats):
        out = torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, q, q))
    assert stats["sdpa"] == 1 and stats["flash"] == 0


def test_embedded_model_steps_through_interpreted_kernels_match_sdpa():
    """Two denoising steps of the embedded model (head dim 64) via Triton ≈ via SDPA."""
    base = DiffusionPipeline.from_pretrained(EMBEDDED_DIR / DEFAULT_EMBEDDED,
                                             local_files_only=True)
    pipe = derive_pipeline(WanPipeline, base, expand_timesteps=base.config.expand_timesteps)
    fit_token_timesteps(pipe.transformer)  # as the Wan runner does (a no-op for patch 2)

    def run():
        return pipe("a small red star on a grass background", height=64, width=64,
                    num_frames=1, num_inference_steps=2, guidance_scale=4.0,
                    generator=torch.Generator().manual_seed(0), output_type="np",
                    max_sequence_length=32).frames[0]

    want = run()
    before = flash_op.LAUNCHES["triton"]
    stats = apply_attention(pipe.transformer, AttentionConfig(kernel="flash"))
    got = run()
    remove_attention(pipe.transformer)
    assert stats["flash"] > 0 and flash_op.LAUNCHES["triton"] - before == stats["flash"]
    np.testing.assert_allclose(got, want, atol=2e-3)


@pytest.mark.parametrize("capability,attention,precision", [
    ((9, 0), "sdpa", "fp8-rowwise"), ((8, 9), "sage", "fp8-dynamic"),
    ((8, 0), "sage", "int8-dynamic")])
def test_cuda_profiles_follow_the_device_capability(monkeypatch, capability, attention,
                                                    precision):
    """On Hopper the balanced profile keeps SDPA (cuDNN's attention is PyTorch's default
    there and matched or beat our sage kernel on the H200); below it sage runs. The fast
    profile's precision is our fp8 row-wise linears from 9.0, torchao's below."""
    from studio.engine.profiles import levers_for

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert levers_for("balanced", "cuda").attention == attention
    assert levers_for("fast", "cuda").attention == "sparse"
    assert levers_for("fast", "cuda").precision == precision
    monkeypatch.setenv("STUDIO_ATTENTION", "sage")  # forced: kept on any device
    assert levers_for("balanced", "cuda").attention == "sage"


def test_profiles_route_attention_on_cuda_only():
    from studio.engine.profiles import apply_levers, levers_for

    assert {levers_for(p, "cpu").attention for p in ("quality", "balanced", "fast")} == {"sdpa"}
    assert levers_for("balanced", "cuda").attention == "sage"
    assert levers_for("fast", "cuda").attention == "sparse"
    model = tiny_wan()
    x, text = torch.randn(1, 4, 3, 6, 10), torch.randn(1, 7, 16)
    apply_levers([model], levers_for("balanced", "cuda"))
    call(model, x, text)
    assert model._studio_attention[1]["sage"] == 4
    apply_levers([model], levers_for("balanced", "cuda"))  # a new job: counts start again
    assert model._studio_attention[1]["sage"] == 0
    apply_levers([model], levers_for("exact", "cuda"))
    assert model._studio_attention is None


@pytest.mark.parametrize("capability", [(9, 0), (8, 0)])
def test_a_models_studio_json_tunes_a_profiles_attention_on_cuda(monkeypatch, capability):
    """fast runs sparse with a dense warm-up (dense at timesteps >= 900); a model's studio.json
    may set the profile's attention in the STUDIO_ATTENTION format (the embedded model turns
    sparsity off: no setting held its adherence, bench kernel-quality). sage tuned in follows
    the device rule (SDPA on Hopper); the CPU keeps SDPA; STUDIO_ATTENTION still wins; a bad
    value names the studio.json field."""
    from studio.engine.models.registry import EMBEDDED_ID, ModelRegistry
    from studio.engine.profiles import FAST_SPARSE_BELOW_TIMESTEP, levers_for

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    stock = levers_for("fast", "cuda").attention_settings()
    assert stock.kernel == "sparse" and stock.sparse_inner == "sage"
    assert stock.sparse_below_timestep == FAST_SPARSE_BELOW_TIMESTEP < 1000
    embedded = ModelRegistry(include_hf_cache=False).resolve(EMBEDDED_ID).tuning
    assert embedded["attention"] == {"fast": "sage"}
    fast = levers_for("fast", "cuda", embedded)
    assert fast.attention == ("sdpa" if capability >= (9, 0) else "sage")
    assert levers_for("fast", "cpu", embedded).attention == "sdpa"
    tuned = levers_for("fast", "cuda", {"attention": {"fast": "sparse,below=450"}})
    assert tuned.attention == "sparse"
    assert tuned.attention_settings().sparse_below_timestep == 450.0
    assert levers_for("balanced", "cuda", {"attention": {"fast": "sage"}}).attention == \
        levers_for("balanced", "cuda").attention  # other profiles untouched
    monkeypatch.setenv("STUDIO_ATTENTION", "flash")
    assert levers_for("fast", "cuda", embedded).attention == "flash"
    monkeypatch.delenv("STUDIO_ATTENTION")
    with pytest.raises(ValueError, match="studio.json attention.fast: kernel: 'xformers'"):
        levers_for("fast", "cuda", {"attention": {"fast": "xformers"}})


def test_studio_attention_env_forces_a_kernel_on_every_profile(monkeypatch):
    """STUDIO_ATTENTION runs a kernel (its torch emulation on the CPU) under any profile,
    exact included, so its numerics can be judged on a real model; unset, the profile's own
    choice comes back."""
    from studio.engine.attention import attention_override
    from studio.engine.profiles import apply_levers, levers_for

    monkeypatch.setenv("STUDIO_ATTENTION", "sage,pv_fp8")
    exact = levers_for("exact", "cpu")
    assert exact.attention == "sage" and exact.attention_config.pv_fp8 is True
    assert exact.step_cache is None  # only the attention is forced
    assert levers_for("balanced", "cpu").attention == "sage"
    model = tiny_wan()
    x, text = torch.randn(1, 4, 3, 6, 10), torch.randn(1, 7, 16)
    want = call(model, x, text)
    notes = apply_levers([model], exact)
    assert any("STUDIO_ATTENTION" in n for n in notes)
    got = call(model, x, text)
    assert model._studio_attention[0].pv_fp8 is True and model._studio_attention[1]["sage"] == 4
    cos = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0)
    assert 0.99 < cos < 1.0
    monkeypatch.setenv("STUDIO_ATTENTION", "sage,pv_fp8,tiles=16x32")  # finer quant blocks
    apply_levers([model], levers_for("exact", "cpu"))
    finer = call(model, x, text)
    assert not torch.equal(finer, got)  # the tiles reached the kernel's quantization
    assert torch.nn.functional.cosine_similarity(finer.flatten(), want.flatten(), dim=0) > 0.99
    monkeypatch.setenv("STUDIO_ATTENTION", "sage")  # same kernel, other settings: re-routed
    apply_levers([model], levers_for("exact", "cpu"))
    assert model._studio_attention[0].pv_fp8 is None
    monkeypatch.delenv("STUDIO_ATTENTION")
    apply_levers([model], levers_for("exact", "cpu"))
    assert model._studio_attention is None
    torch.testing.assert_close(call(model, x, text), want, atol=0, rtol=0)
    sparse = attention_override("sparse,window=0x2x2,inner=flash")
    assert (sparse.sparse_window, sparse.sparse_inner) == ((0, 2, 2), "flash")
    assert attention_override("sage,pv_fp8,tiles=64x128").sage_tiles == (64, 128)
    assert attention_override("sparse,below=450").sparse_below_timestep == 450.0
    for bad, word in (("xformers", "kernel"), ("sage,fp4", "option"),
                      ("sparse,window=2x2", "window: "), ("sparse,window=ax2x2", "window"),
                      ("sage,tiles=64x100", "tiles: "), ("sage,tiles=big", "tiles"),
                      ("sage,pv_fp8,tiles=64x16", "tiles: block_n 16 with pv_fp8"),
                      (",,", "names no kernel"), ("sparse,sink=-1", "sink: "),
                      ("sparse,below=soon", "below"), ("sparse,below=1001", "below: ")):
        with pytest.raises(ValueError, match=f"STUDIO_ATTENTION.*{word}"):
            attention_override(bad)
    assert attention_override("  ") is None
