"""Our fused DiT block ops inside diffusers' Wan transformer blocks.

A Wan block (``WanTransformerBlock``: Wan 2.1/2.2 and the embedded model) spends, besides its
matmuls and attention, several memory-bound passes per token: the AdaLN norm and modulation
(``norm1(x) * (1 + scale) + shift``, and again around the feed-forward), the query/key
RMSNorm followed by the rotary embedding, and the gated residual adds. With the fused ops on,
the block runs

* :func:`studio.kernels.adaln_norm.adaln_norm` for ``norm1`` and ``norm3`` with their
  modulation (one pass each instead of four or five);
* :func:`studio.kernels.qk_norm_rope.qk_norm_rope` for the self-attention's query and key
  (RMSNorm across heads and RoPE in one pass), inside :class:`FusedWanAttnProcessor`;
* :func:`studio.kernels.gated_residual.gated_residual` for both gated residuals;

and everything else (projections, attention through ``dispatch_attention_fn`` and so through
our attention router or diffusers' backends and context parallelism, cross-attention, the
feed-forward) as diffusers does. The math is the stock block's (fp32 statistics and
modulation, output in the stream's dtype), so outputs agree with stock to rounding.

How it goes in: :func:`install` replaces each block's ``forward`` (and its self-attention
processor) with a switchable one *before* any diffusers hook wraps the block, so the step
cache's and parallel plans' hooks keep wrapping it; :func:`set_fused` then turns the fused
path on or off per job without touching any hook. A block that already carries hooks at
install time stays stock.

On the CPU the ops run their torch references (Triton needs a GPU or the interpreter), so the
profiles turn this on for CUDA only.
"""

from __future__ import annotations

import logging
import types
from collections import Counter

import torch

from studio.engine.compile import count_outside_graph

log = logging.getLogger(__name__)


class FusedStats(Counter):
    """Calls of the fused path by op: ``adaln_norm``, ``qk_norm_rope``, ``gated_residual``."""


def _wan_classes():
    from diffusers.models.transformers.transformer_wan import (
        WanAttnProcessor,
        WanTransformerBlock,
    )

    return WanTransformerBlock, WanAttnProcessor


def _modulation(block, temb: torch.Tensor):
    """The six modulation tensors of a Wan block, as its stock forward computes them:
    (batch, 1, dim) for a per-sample timestep, (batch, seq, dim) for per-token timesteps
    (Wan 2.2 TI2V), float32."""
    if temb.ndim == 4:  # (batch, seq, 6, dim)
        return [t.squeeze(2) for t in
                (block.scale_shift_table.unsqueeze(0) + temb.float()).chunk(6, dim=2)]
    return list((block.scale_shift_table + temb.float()).chunk(6, dim=1))


def _fused_block_forward(block, hidden_states, encoder_hidden_states, temb, rotary_emb):
    from studio.kernels.adaln_norm import adaln_norm
    from studio.kernels.gated_residual import gated_residual

    if not block._studio_fused:
        return type(block).forward(block, hidden_states, encoder_hidden_states, temb,
                                   rotary_emb)
    stats = block._studio_fused_stats
    shift, scale, gate, c_shift, c_scale, c_gate = _modulation(block, temb)
    x = adaln_norm(hidden_states, scale, shift, norm="layer", eps=block.norm1.eps)
    y = block.attn1(x, None, None, rotary_emb)
    hidden_states = gated_residual(hidden_states, gate, y)
    x = block.norm2(hidden_states.float()).type_as(hidden_states)
    hidden_states = hidden_states + block.attn2(x, encoder_hidden_states, None, None)
    x = adaln_norm(hidden_states, c_scale, c_shift, norm="layer", eps=block.norm3.eps)
    hidden_states = gated_residual(hidden_states, c_gate, block.ffn(x))
    count_outside_graph(stats, "adaln_norm", 2)
    count_outside_graph(stats, "gated_residual", 2)
    return hidden_states


def _processor_class():
    from diffusers.models.attention_dispatch import dispatch_attention_fn
    from diffusers.models.transformers.transformer_wan import _get_qkv_projections

    _, stock = _wan_classes()

    class FusedWanAttnProcessor(stock):
        """Wan's attention processor with the query/key RMSNorm and RoPE fused
        (:func:`studio.kernels.qk_norm_rope.qk_norm_rope`) for self-attention with rotary
        embeddings; every other call (cross-attention, the image branch of Wan 2.1 I2V, an
        attention mask, the fused path off) is the stock processor's."""

        def __call__(self, attn, hidden_states, encoder_hidden_states=None,
                     attention_mask=None, rotary_emb=None):
            norms_fit = (isinstance(attn.norm_q, torch.nn.RMSNorm)
                         and isinstance(attn.norm_k, torch.nn.RMSNorm)
                         and attn.norm_q.weight is not None and attn.norm_k.weight is not None)
            if (not getattr(attn, "_studio_fused", False) or encoder_hidden_states is not None
                    or rotary_emb is None or attention_mask is not None or not norms_fit
                    or attn.add_k_proj is not None):
                return super().__call__(attn, hidden_states, encoder_hidden_states,
                                        attention_mask, rotary_emb)
            from studio.kernels.qk_norm_rope import qk_norm_rope

            query, key, value = _get_qkv_projections(attn, hidden_states, None)
            cos, sin = rotary_emb
            eps_q = attn.norm_q.eps if attn.norm_q.eps is not None else \
                torch.finfo(query.dtype).eps
            eps_k = attn.norm_k.eps if attn.norm_k.eps is not None else \
                torch.finfo(key.dtype).eps
            query = qk_norm_rope(query, attn.norm_q.weight, cos, sin, heads=attn.heads,
                                 norm="all", eps=eps_q).unflatten(2, (attn.heads, -1))
            key = qk_norm_rope(key, attn.norm_k.weight, cos, sin, heads=attn.heads,
                               norm="all", eps=eps_k).unflatten(2, (attn.heads, -1))
            value = value.unflatten(2, (attn.heads, -1))
            count_outside_graph(attn._studio_fused_stats, "qk_norm_rope", 2)
            out = dispatch_attention_fn(query, key, value, attn_mask=None, dropout_p=0.0,
                                        is_causal=False, backend=self._attention_backend,
                                        parallel_config=self._parallel_config)
            out = out.flatten(2, 3).type_as(query)
            return attn.to_out[1](attn.to_out[0](out))

    return FusedWanAttnProcessor


_PROCESSOR = None


def install(transformer: torch.nn.Module) -> FusedStats | None:
    """Makes ``transformer``'s Wan blocks switchable to the fused ops (off until
    :func:`set_fused`). Idempotent. Returns the live call counts, or None when the model has
    no Wan blocks (other families stay stock)."""
    global _PROCESSOR
    existing = getattr(transformer, "_studio_fused_stats", None)
    if existing is not None:
        return existing
    block_cls, stock_processor = _wan_classes()
    blocks = [b for b in getattr(transformer, "blocks", ()) if isinstance(b, block_cls)]
    if not blocks:
        return None
    if _PROCESSOR is None:
        _PROCESSOR = _processor_class()
    stats = FusedStats()
    skipped = 0
    for block in blocks:
        hooks = getattr(getattr(block, "_diffusers_hook", None), "hooks", None)
        if hooks:
            skipped += 1  # a hook already wraps the stock forward: leave the block stock
            continue
        block._studio_fused = False
        block._studio_fused_stats = stats
        block.forward = types.MethodType(_fused_block_forward, block)
        attn = block.attn1
        current = attn.processor
        if type(current) is stock_processor:
            processor = _PROCESSOR()
            processor._attention_backend = current._attention_backend
            processor._parallel_config = current._parallel_config
            attn.set_processor(processor)
        attn._studio_fused = False
        attn._studio_fused_stats = stats
    if skipped:
        log.info("fused block ops: %d of %d blocks already had hooks and stay stock",
                 skipped, len(blocks))
    transformer._studio_fused_stats = stats
    return stats


def set_fused(transformer: torch.nn.Module, on: bool) -> bool:
    """Turns the fused path of an :func:`install`-ed transformer on or off. Returns whether
    any block runs fused now."""
    count = 0
    for block in getattr(transformer, "blocks", ()):
        if hasattr(block, "_studio_fused"):
            block._studio_fused = on
            block.attn1._studio_fused = on
            count += 1
    return on and count > 0


__all__ = ["FusedStats", "install", "set_fused"]
