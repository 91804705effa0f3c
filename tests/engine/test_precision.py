"""Low-precision weights on a tiny real Wan transformer (CPU): each setting transforms the
weights it says it does and stays close to the float32 output; unsupported settings are
refused with the reason; the executor keeps one runner per precision."""

from __future__ import annotations

import pytest
import torch
from diffusers import WanTransformer3DModel

from studio.engine.executor import JobExecutor
from studio.engine.models.registry import ModelRegistry
from studio.engine.precision import PRECISIONS, apply_precision, precision_supported

CPU = torch.device("cpu")


def model():
    torch.manual_seed(0)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=32, in_channels=8,
        out_channels=8, text_dim=32, freq_dim=32, ffn_dim=256, num_layers=2,
        cross_attn_norm=True, qk_norm="rms_norm_across_heads").eval()


def output(m):
    torch.manual_seed(1)
    x, t, e = torch.randn(1, 8, 3, 8, 8), torch.tensor([500.0]), torch.randn(1, 7, 32)
    dtype = next(m.parameters()).dtype
    with torch.no_grad():
        return m(x.to(dtype) if dtype.is_floating_point and dtype.itemsize == 2 else x, t,
                 e.to(dtype) if dtype.is_floating_point and dtype.itemsize == 2 else e,
                 return_dict=False)[0].float()


@pytest.mark.parametrize("precision,min_cos", [
    ("bf16", 0.999), ("fp16", 0.9999), ("fp8-storage", 0.99), ("int8-weight", 0.999),
    ("int8-dynamic", 0.995)])
def test_each_precision_transforms_the_weights_and_stays_close(precision, min_cos):
    reference = output(model())
    m = model()
    note = apply_precision(m, precision, CPU)
    assert note
    weight = m.blocks[0].ffn.net[0].proj.weight
    if precision in ("bf16", "fp16"):
        assert weight.dtype == (torch.bfloat16 if precision == "bf16" else torch.float16)
    elif precision == "fp8-storage":
        assert weight.dtype == torch.float8_e4m3fn
    else:
        assert type(weight).__name__ != "Parameter" or type(weight.data).__name__ != "Tensor"
        assert "Int8" in type(weight).__name__ or "Affine" in type(weight).__name__
    got = output(m)
    cos = torch.nn.functional.cosine_similarity(got.flatten(), reference.flatten(), dim=0)
    assert cos >= min_cos and not torch.equal(got, reference)


def test_unsupported_and_unknown_precisions_are_refused():
    assert "CUDA" in precision_supported("fp8-dynamic", CPU)
    with pytest.raises(ValueError, match="precision fp8-dynamic: fp8 matrix multiplies"):
        apply_precision(model(), "fp8-dynamic", CPU)
    with pytest.raises(ValueError, match="precision: 'int4' is not one of"):
        apply_precision(model(), "int4", CPU)
    assert "as-loaded" in PRECISIONS


def test_executor_loads_one_runner_per_precision(tiny_models):
    registry = ModelRegistry(include_hf_cache=False)
    entry = registry.resolve(str(tiny_models["wan-t2v"]))
    executor = JobExecutor(registry, CPU, max_loaded=3)
    plain, _ = executor.runner_for(entry)
    quant, _ = executor.runner_for(entry, "int8-weight")
    again, load_s = executor.runner_for(entry, "int8-weight")
    assert quant is again and load_s == 0.0 and plain is not quant
    assert executor.load_count == 2
    assert "int8-weight" in quant.precision_notes[0]
    assert plain.base.transformer.blocks[0].ffn.net[0].proj.weight.dtype == torch.float32


def test_fp8_rowwise_swaps_the_block_linears_and_stays_close():
    """Our fp8 row-wise precision on the CPU's torch._scaled_mm: every block linear with
    16-aligned features becomes an fp8 layer, the output stays close to float32, and the
    precision is refused off Hopper with the reason."""
    from studio.engine.precision import Fp8RowwiseLinear, apply_fp8_rowwise

    reference = output(model())
    m = model()
    swapped = apply_fp8_rowwise(m, fuse_qkv=False)
    layers = [mod for mod in m.modules() if isinstance(mod, Fp8RowwiseLinear)]
    assert swapped == len(layers) == 2 * 10  # per block: q, k, v, out x 2 attentions + 2 ffn
    assert m.blocks[0].ffn.net[0].proj.weight_fp8.dtype == torch.float8_e4m3fn
    assert isinstance(m.proj_out, torch.nn.Linear)  # outside the blocks: left alone
    got = output(m)
    cos = torch.nn.functional.cosine_similarity(got.flatten(), reference.flatten(), dim=0)
    assert cos >= 0.99 and not torch.equal(got, reference)
    assert "CUDA" in precision_supported("fp8-rowwise", CPU)


@pytest.mark.parametrize("family", ["wan", "flux"])
def test_fp8_rowwise_with_fused_qkv_matches_it_without(family):
    """Fusing the attention projections first changes no number (concatenated weights, the
    same per-row scales), drops the separate projections and leaves fewer, larger GEMMs."""
    from diffusers import FluxTransformer2DModel

    from studio.engine.precision import Fp8RowwiseLinear, apply_fp8_rowwise

    def build():
        if family == "wan":
            return model()
        torch.manual_seed(0)
        return FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=1,
                                      num_single_layers=1, attention_head_dim=16,
                                      num_attention_heads=2, joint_attention_dim=32,
                                      pooled_projection_dim=32,
                                      axes_dims_rope=(4, 6, 6)).eval()

    def run(m):
        if family == "wan":
            return output(m)
        g = torch.Generator().manual_seed(2)
        with torch.no_grad():
            return m(hidden_states=torch.randn(1, 24, 16, generator=g),
                     encoder_hidden_states=torch.randn(1, 5, 32, generator=g),
                     pooled_projections=torch.randn(1, 32, generator=g),
                     timestep=torch.tensor([0.5]), img_ids=torch.zeros(24, 3),
                     txt_ids=torch.zeros(5, 3), return_dict=False)[0]

    separate, fused = build(), build()
    n_separate = apply_fp8_rowwise(separate, fuse_qkv=False)
    n_fused = apply_fp8_rowwise(fused)
    assert n_fused < n_separate
    attn = fused.blocks[0].attn1 if family == "wan" else fused.transformer_blocks[0].attn
    assert attn.fused_projections and attn.to_q is None
    assert isinstance(attn.to_qkv, Fp8RowwiseLinear)
    torch.testing.assert_close(run(fused), run(separate), atol=2e-3, rtol=1e-3)
