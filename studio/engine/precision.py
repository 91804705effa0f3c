"""Low-precision weights for the denoiser, chosen by the optimization profile.

=================  ======================================================================
``as-loaded``      the dtype the model was loaded in (float32 on the CPU, bf16 on GPUs)
``bf16``/``fp16``  the denoiser cast to bfloat16 / float16 (compute in that dtype)
``fp8-storage``    weights stored in float8 e4m3, upcast per layer to the compute dtype
                   (diffusers ``enable_layerwise_casting``): memory only, no fp8 math
``int8-weight``    torchao int8 weight-only quantization of the blocks' linear layers
``int8-dynamic``   torchao int8 weights and per-token dynamic int8 activations
``fp8-dynamic``    torchao float8 weights and dynamic float8 activations (CUDA compute
                   capability >= 8.9 only)
``fp8-rowwise``    ours: float8 weights per output channel, activations quantized per token
                   by one Triton pass (:mod:`studio.kernels.fp8_linear`), products by
                   ``torch._scaled_mm`` with row-wise scales (CUDA compute capability >= 9.0).
                   torchao's eager fp8 path spends more on its activation quantization than
                   the fp8 product saves (bench/gpu/engine.py times both in one run)
=================  ======================================================================

The transforms replace weights in place, so a runner keeps one precision for its lifetime:
the executor loads one runner per (model, precision) and its LRU evicts what is not used.

Sources: torchao (PyTorch's quantization library: ``Int8WeightOnlyConfig``,
``Int8DynamicActivationInt8WeightConfig``, ``Float8DynamicActivationFloat8WeightConfig``);
diffusers' layerwise casting; SmoothQuant-style per-token activation scales come from
torchao's dynamic int8 recipe.
"""

from __future__ import annotations

import torch

PRECISIONS = ("as-loaded", "bf16", "fp16", "fp8-storage", "int8-weight", "int8-dynamic",
              "fp8-dynamic", "fp8-rowwise")


def precision_supported(precision: str, device: torch.device) -> str | None:
    """Why ``precision`` cannot run on ``device`` (None when it can).

    Raises:
        ValueError: an unknown precision (names the allowed ones).
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision: {precision!r} is not one of {', '.join(PRECISIONS)}")
    if precision in ("int8-weight", "int8-dynamic", "fp8-dynamic"):
        try:
            import torchao  # noqa: F401
        except ImportError:
            return "torchao is not installed"
    if precision in ("fp8-dynamic", "fp8-rowwise"):
        if device.type != "cuda":
            return "fp8 matrix multiplies need a CUDA GPU"
        need = (8, 9) if precision == "fp8-dynamic" else (9, 0)  # row-wise scales: Hopper+
        if torch.cuda.get_device_capability(device) < need:
            cap = torch.cuda.get_device_capability(device)
            return (f"{'row-wise ' if need == (9, 0) else ''}fp8 matrix multiplies need "
                    f"compute capability >= {need[0]}.{need[1]} (this GPU: {cap[0]}.{cap[1]})")
    return None


class Fp8RowwiseLinear(torch.nn.Module):
    """A ``torch.nn.Linear`` whose product runs in float8 with row-wise scales
    (:func:`studio.kernels.fp8_linear.fp8_linear`): weight (out, in) float8 e4m3 with one
    float32 scale per output channel, quantized once here; activations per token at each call.
    Input (..., in_features) in the compute dtype; output (..., out_features) in the same."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        from studio.kernels.fp8_linear import fp8_linear, quantize_weight_fp8

        super().__init__()
        self._fp8_linear = fp8_linear  # imported once here, not on every call
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight_fp8, weight_scale = quantize_weight_fp8(linear.weight)
        self.register_buffer("weight_fp8", weight_fp8)
        self.register_buffer("weight_scale", weight_scale)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._fp8_linear(x, self.weight_fp8, self.weight_scale, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8 row-wise"


def fuse_qkv_projections(denoiser: torch.nn.Module) -> int:
    """diffusers' fused attention projections (``AttentionMixin.fuse_qkv_projections``: q, k, v
    of self-attention in one linear, k, v of cross-attention in one), with the separate
    projections the fused path no longer calls dropped so that nothing holds or quantizes
    them twice. Exact (concatenated weights). Returns the attention modules fused; 0 for a
    model without the API or whose processors refuse it (a ValueError from diffusers)."""
    fuse = getattr(denoiser, "fuse_qkv_projections", None)
    if fuse is None:
        return 0
    try:
        fuse()
    except (ValueError, AttributeError):
        return 0
    fused = 0
    for module in denoiser.modules():
        if not getattr(module, "fused_projections", False):
            continue
        fused += 1
        unused = (("to_q", "to_k", "to_v") if hasattr(module, "to_qkv")
                  else ("to_k", "to_v") if hasattr(module, "to_kv") else ())
        unused += (("add_q_proj", "add_k_proj", "add_v_proj")
                   if hasattr(module, "to_added_qkv")
                   else ("add_k_proj", "add_v_proj") if hasattr(module, "to_added_kv") else ())
        for name in unused:
            if isinstance(getattr(module, name, None), torch.nn.Module):
                setattr(module, name, None)
    return fused


def apply_fp8_rowwise(denoiser: torch.nn.Module, fuse_qkv: bool = True) -> int:
    """Swaps the blocks' linear layers (:func:`_block_linears_filter`) whose feature counts are
    multiples of 16 for :class:`Fp8RowwiseLinear`, in place, after fusing the attention
    projections (:func:`fuse_qkv_projections`; one activation quantization and one larger
    GEMM for q, k, v) unless ``fuse_qkv`` is False. Returns how many linears were swapped.
    Runs on any device where ``torch._scaled_mm`` does (tests use the CPU's)."""
    if fuse_qkv:
        fuse_qkv_projections(denoiser)
    swaps = [(name, module) for name, module in denoiser.named_modules()
             if _block_linears_filter(module, name)
             and module.in_features % 16 == 0 and module.out_features % 16 == 0]
    for name, module in swaps:
        parent_name, _, child = name.rpartition(".")
        parent = denoiser.get_submodule(parent_name) if parent_name else denoiser
        setattr(parent, child, Fp8RowwiseLinear(module))
    return len(swaps)


def _block_linears_filter(module: torch.nn.Module, fqn: str) -> bool:
    """torchao filter: the linear layers inside the transformer/UNet blocks (embeddings,
    norms and the output projection stay in the compute dtype, as the recipes advise)."""
    return isinstance(module, torch.nn.Linear) and any(
        part in fqn for part in ("blocks.", "transformer_blocks.", "single_transformer_blocks.",
                                 "down_blocks.", "up_blocks.", "mid_block."))


def apply_precision(denoiser: torch.nn.Module, precision: str, device: torch.device) -> str:
    """Transforms ``denoiser``'s weights in place to ``precision``.

    Returns:
        A note for the user ("" for as-loaded).

    Raises:
        ValueError: an unknown precision, or one this device cannot run (with the reason).
    """
    reason = precision_supported(precision, device)
    if reason is not None:
        raise ValueError(f"precision {precision}: {reason}")
    if precision == "as-loaded":
        return ""
    if precision in ("bf16", "fp16"):
        denoiser.to(torch.bfloat16 if precision == "bf16" else torch.float16)
        return f"denoiser in {precision}"
    if precision == "fp8-storage":
        compute = next(denoiser.parameters()).dtype
        denoiser.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn,
                                          compute_dtype=compute)
        return f"denoiser weights stored in fp8 e4m3, computed in {str(compute)[6:]}"
    if precision == "fp8-rowwise":
        swapped = apply_fp8_rowwise(denoiser)
        return f"denoiser linear layers in fp8 with row-wise scales: {swapped} (studio kernels)"
    from torchao.quantization import (
        Float8DynamicActivationFloat8WeightConfig,
        Int8DynamicActivationInt8WeightConfig,
        Int8WeightOnlyConfig,
        quantize_,
    )

    config = {"int8-weight": Int8WeightOnlyConfig,
              "int8-dynamic": Int8DynamicActivationInt8WeightConfig,
              "fp8-dynamic": Float8DynamicActivationFloat8WeightConfig}[precision]()
    quantize_(denoiser, config, filter_fn=_block_linears_filter)
    return f"denoiser linear layers quantized: {precision} (torchao)"
