"""Ring attention over a process group, on our attention kernel (which returns the
log-sum-exp), with the key/value exchange of each ring step overlapped with the attention
of the previous block.

Each of the ``n`` ranks holds ``S/n`` query, key and value tokens. In ``n`` steps every rank
attends its queries to every rank's key/value block, merging the partial results with their
log-sum-exps (the online-softmax merge of FlashAttention); while it computes step ``i`` it
already sends its current block to the next rank and receives the next block from the
previous one (asynchronous point-to-point, ``batch_isend_irecv``), so the exchange hides
behind the compute. diffusers' ring template all-gathers every block up front instead
(``rotate_method="allgather"``: one exposed collective, ``n`` blocks of memory).

Sources: Liu et al., "Ring Attention with Blockwise Transformers for Near-Infinite
Context", 2023; the log-sum-exp merge from Dao et al., "FlashAttention", 2022.

Models enter through diffusers' context-parallel plans: :func:`install_ring_backend` makes
a transformer's attention processors call :func:`context_parallel_attention` (ring when the
ring degree is > 1 alone; diffusers' unified template with our log-sum-exp forward when
Ulysses and ring are combined), scoped to that transformer's forward.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from diffusers.hooks import HookRegistry, ModelHook

from studio.kernels.attention import attention

_HOOK = "studio_ring_attention"
# the registered diffusers backend whose slot our function fills during the forward: it
# is one diffusers accepts for context parallelism, and its signature is the one we take
BACKEND = "_native_flash"


def _merge(out, lse, block_out, block_lse):
    """Online-softmax merge of two partial attentions (out, lse in float32, or float64 for
    float64 inputs)."""
    if out is None:
        return block_out, block_lse
    new_lse = torch.logaddexp(lse, block_lse)
    out = out * torch.exp(lse - new_lse)[..., None] + block_out * torch.exp(
        block_lse - new_lse)[..., None]
    return out, new_lse


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor,
                     scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention with a key mask, in plain torch (float32 scores).

    Args:
        q: (batch, heads, queries, head_dim); k, v: (batch, heads, keys, head_dim).
        valid: (batch, keys) bool, True where a key may be attended.

    Returns:
        out (batch, heads, queries, head_dim) in q's dtype (0 where no key is valid) and the
        log-sum-exp (batch, heads, queries) float32 (-inf where no key is valid).
    """
    import math

    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    scores = torch.matmul(q.to(work), k.to(work).transpose(-1, -2)) * scale
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    weights = torch.exp(scores - torch.where(torch.isinf(lse), 0.0, lse)[..., None])
    return torch.matmul(weights, v.to(work)).to(q.dtype), lse


def ring_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, group,
                   scale: float | None = None, overlap: bool = True,
                   block_tokens: list[int] | None = None, shared_tokens: int = 0,
                   key_valid: list[torch.Tensor] | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of the local queries to the whole ring's keys and values.

    Args:
        query, key, value: (batch, local_tokens, heads, head_dim), diffusers' model layout.
        group: the ring's process group (its rank order is the ring order).
        scale: softmax scale (default 1/sqrt(head_dim)).
        overlap: exchange the next block while computing this one (False: wait for each
            exchange before computing, for measuring what the overlap hides).
        block_tokens: key/value tokens each rank sends (its own, not shared ones) when they
            differ (an uneven split); blocks then travel padded to the longest and the
            padding is masked. None: every rank sends as many as this one.
        shared_tokens: trailing key/value tokens that every rank holds alike (text kept
            whole on every rank): attended once, with the rank's own block, never sent.
        key_valid: per rank (in group order), a (batch, that rank's tokens) bool mask of the
            keys that may be attended (padding masked); those blocks run the masked torch
            path. None: every key is valid.

    Returns:
        out (batch, local_tokens, heads, head_dim) in query's dtype, and the log-sum-exp
        (batch, local_tokens, heads) float32 over all keys of the ring.

    Bytes each rank sends per call: ``(n - 1) × (key + value)`` bytes of its own (padded)
    block.
    """
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    following = dist.get_global_rank(group, (rank + 1) % world)
    preceding = dist.get_global_rank(group, (rank - 1) % world)
    q = query.transpose(1, 2).contiguous()
    own = key.shape[1] - shared_tokens
    k, v = key[:, :own], value[:, :own]  # what travels
    lengths = None
    if block_tokens is not None and len(set(block_tokens)) > 1:
        pad = max(block_tokens) - own
        if pad:
            k = torch.nn.functional.pad(k, (0, 0, 0, 0, 0, pad))
            v = torch.nn.functional.pad(v, (0, 0, 0, 0, 0, pad))
        lengths = block_tokens
    out = lse = None
    for step in range(world):
        pending = None
        if step < world - 1:
            outgoing = torch.cat([k.reshape(-1), v.reshape(-1)])
            incoming = torch.empty_like(outgoing)
            pending = dist.batch_isend_irecv([
                dist.P2POp(dist.isend, outgoing, following, group),
                dist.P2POp(dist.irecv, incoming, preceding, group)])
            if not overlap:
                for request in pending:
                    request.wait()
        valid = None
        source = (rank - step) % world  # the rank whose block is held now
        if step == 0:  # the rank's own block, with the shared tokens, unpadded
            block_k, block_v = key, value
        else:
            block_k, block_v = k, v
            if lengths is not None:
                valid = torch.full((q.shape[0],), lengths[source], dtype=torch.int32,
                                   device=q.device)
        block_k = block_k.transpose(1, 2).contiguous()
        block_v = block_v.transpose(1, 2).contiguous()
        if key_valid is not None:
            mask = key_valid[source]
            mask = torch.nn.functional.pad(mask, (0, block_k.shape[2] - mask.shape[1]))
            block_out, block_lse = masked_attention(q, block_k, block_v, mask, scale)
        else:
            block_out, block_lse = attention(q, block_k, block_v, kv_lengths=valid, scale=scale)
        work = torch.float64 if query.dtype == torch.float64 else torch.float32
        out, lse = _merge(out, lse, block_out.to(work), block_lse)
        if pending is not None:
            for request in pending:
                request.wait()
            k = incoming[:k.numel()].view_as(k)
            v = incoming[k.numel():].view_as(v)
    return out.to(query.dtype).transpose(1, 2), lse.transpose(1, 2)


def key_padding_mask(attn_mask: torch.Tensor, batch: int, keys: int) -> torch.Tensor:
    """A (batch, keys) bool mask (True: may be attended) from a key-padding attention mask:
    (batch, keys), (batch, 1, keys), or (batch, 1 or heads, 1, keys) alike over the heads;
    bool, or additive (0 keep, -inf or -1e4 drop).

    Raises:
        ValueError: a mask that varies over the queries or the heads (not key padding).
    """
    mask = attn_mask
    if mask.dim() == 4:
        if mask.shape[2] != 1 or not torch.equal(mask, mask[:, :1].expand_as(mask)):
            raise ValueError("ring/Ulysses attention: only key-padding masks are supported")
        mask = mask[:, 0, 0]
    elif mask.dim() == 3:
        if mask.shape[1] != 1:
            raise ValueError("ring/Ulysses attention: only key-padding masks are supported")
        mask = mask[:, 0]
    valid = mask if mask.dtype == torch.bool else mask > -1.0
    return valid.expand(batch, keys)


def _gather_key_mask(attn_mask: torch.Tensor, key: torch.Tensor, group) -> list[torch.Tensor]:
    """Every rank's (batch, local keys) bool key mask (see :func:`key_padding_mask`)."""
    valid = key_padding_mask(attn_mask, key.shape[0], key.shape[1]).to(torch.uint8)
    valid = valid.contiguous()
    parts = [torch.empty_like(valid) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, valid, group=group)  # as bytes: gloo has no bool collectives
    return [p.bool() for p in parts]


def _lse_forward_op(ctx, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                    scale=None, enable_gqa=False, return_lse=False, _save_ctx=True,
                    _parallel_config=None):
    """diffusers' forward-op contract on our kernel: (B, S, H, D) in, out (and lse (B, S, H));
    a key-padding mask runs the masked torch path."""
    if dropout_p or is_causal or enable_gqa:
        raise ValueError("ring/Ulysses attention: dropout, causal and GQA are not supported")
    q, k, v = (x.transpose(1, 2).contiguous() for x in (query, key, value))
    if attn_mask is not None:
        valid = key_padding_mask(attn_mask, k.shape[0], k.shape[2])
        out, lse = masked_attention(q, k, v, valid, scale)
    else:
        out, lse = attention(q, k, v, scale=scale)
    out = out.transpose(1, 2)
    return (out, lse.transpose(1, 2)) if return_lse else out


def _no_backward_op(ctx, grad_out, *args, **kwargs):
    raise NotImplementedError("ring attention here is inference-only")


def context_parallel_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                               is_causal=False, scale=None, enable_gqa=False,
                               return_lse=False, _parallel_config=None):
    """A diffusers attention backend: our ring when only the ring degree is > 1, diffusers'
    templated Ulysses/unified attention on our log-sum-exp kernel otherwise, and plain
    attention without a parallel config. Tensors (B, S, H, D) as diffusers passes them.

    Raises:
        ValueError: an attention mask, dropout, causal or GQA attention (not supported).
    """
    if _parallel_config is None:
        out = _lse_forward_op(None, query, key, value, attn_mask, dropout_p, is_causal, scale,
                              enable_gqa, return_lse)
        return out
    cp = _parallel_config.context_parallel_config
    if cp.ring_degree > 1 and cp.ulysses_degree == 1:
        if dropout_p or is_causal or enable_gqa:
            raise ValueError("ring attention: dropout, causal and GQA are not supported")
        group = cp._ring_mesh.get_group()
        key_valid = None if attn_mask is None else _gather_key_mask(attn_mask, key, group)
        out, lse = ring_attention(query, key, value, group=group, scale=scale,
                                  key_valid=key_valid)
        return (out, lse) if return_lse else out
    from diffusers.models.attention_dispatch import _templated_context_parallel_attention

    return _templated_context_parallel_attention(
        query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse,
        forward_op=_lse_forward_op, backward_op=_no_backward_op,
        _parallel_config=_parallel_config)


@contextlib.contextmanager
def _backend_slot():
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    name = AttentionBackendName(BACKEND)
    saved = _AttentionBackendRegistry._backends[name]
    _AttentionBackendRegistry._backends[name] = context_parallel_attention
    try:
        yield
    finally:
        _AttentionBackendRegistry._backends[name] = saved


class _RingScopeHook(ModelHook):
    """Fills diffusers' backend slot with :func:`context_parallel_attention` for the
    duration of this transformer's forward only (nothing changes outside it)."""

    def new_forward(self, module, *args, **kwargs):
        with _backend_slot():
            return self.fn_ref.original_forward(*args, **kwargs)


def install_ring_backend(transformer: torch.nn.Module) -> None:
    """Points ``transformer``'s attention processors at :func:`context_parallel_attention`
    (call before ``enable_parallelism``; the swap is scoped to the transformer's forward).
    """
    from diffusers.models.attention_dispatch import AttentionBackendName

    # per processor, as set_attention_backend does, but without its global side effect
    # (it also makes the backend the process-wide default)
    for module in transformer.modules():
        processor = getattr(module, "processor", None)
        if processor is not None and hasattr(processor, "_attention_backend"):
            processor._attention_backend = AttentionBackendName(BACKEND)
    registry = HookRegistry.check_if_exists_or_initialize(transformer)
    if registry.get_hook(_HOOK) is None:
        registry.register_hook(_RingScopeHook(), _HOOK)
