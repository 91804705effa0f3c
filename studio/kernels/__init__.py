"""Hot ops in Triton, each beside its plain-torch reference: one folder per op.

- ``attention``: flash-style attention forward with optional per-batch key lengths and LSE.
- ``sage_attention``: SageAttention (int8 Q·Kᵀ, fp8 or 16-bit P·V).
- ``block_sparse_attention``: block-sparse attention over local video windows plus text.
- ``adaln_norm``: LayerNorm / RMSNorm fused with AdaLN modulation.
- ``gated_residual``: ``x + gate * y``.
- ``qk_norm_rope``: query/key RMSNorm (per head or across heads) fused with RoPE.

Import the op you need (``from studio.kernels.attention import attention``); this package
imports none of them, so importing it loads neither torch nor Triton. On the CPU the Triton
paths run only under Triton's interpreter, switched on with TRITON_INTERPRET=1 *before* the
op is imported; otherwise each op runs its torch reference and logs why, once.
"""
