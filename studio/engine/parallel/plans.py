"""Context-parallel plans of our own, for supported denoisers that diffusers ships without
one (``_cp_plan``).

A plan names where diffusers' context-parallel hooks split a tensor along the sequence and
where they gather it back (:class:`diffusers.ContextParallelInput` /
``ContextParallelOutput``); the attention processors of these models already dispatch through
diffusers' attention with the parallel config, so Ulysses and ring both work with them.

* Wan VACE (reference-to-video): Wan's plan (rotary embedding, per-token timestep, blocks)
  plus the VACE branch: its first block receives the full video tokens and the control
  tokens, split there; the hints it produces are then shards that add to the main blocks'
  shards at the same positions.

SD3 calls ``scaled_dot_product_attention`` itself (no dispatcher, no parallel config), and
its 77 + 256 text tokens do not split evenly: :class:`SdpaSequencePlan` splits its token
embeddings unevenly with our own hooks and turns the SDPA calls of its blocks into our ring
attention (padded, masked blocks). Ring only: Ulysses would need even shards.

HiDream concatenates fresh text states into every block and slices them back by length: its
plan keeps the text whole on every rank, splits the image tokens (and the matching rows of
its rotary embedding), and rings only the image key/value shards; the text is attended once.

LTX-2 (audio-video) has a diffusers plan, but it is LTX-1's: it splits the output of a rotary
embedding that is 4-D in the "split" layout and leaves the audio stream, which attends to the
video every block, facing a shard. Ours splits the video tokens at the forward's inputs
(latents, coordinates, per-token timestep), keeps audio and text whole on every rank, and
rings the two attentions whose keys are video tokens: the video self-attention and the
video-to-audio attention (whose queries, the audio, are whole on every rank).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from diffusers.hooks import HookRegistry, ModelHook
from torch.overrides import TorchFunctionMode

from studio.engine.parallel.ring import ring_attention

# denoisers whose diffusers plan exists but breaks on what the studio runs (checked on tiny
# models on gloo ranks, diffusers 0.42.1): refused with the reason, CFG parallel still works
NOT_YET: dict[str, str] = {}

# denoisers whose masked attention fails in diffusers' Ulysses forward (its text mask keeps
# every head while the all-to-all leaves each rank a share): Ulysses runs on our attention
# backend, which reduces the mask to key padding
OUR_ULYSSES_ATTENTION = frozenset({"LTXVideoTransformer3DModel"})

# denoisers whose diffusers plan splits the text tokens: the text is padded to a multiple of
# the sequence degree with masked tokens (keys nobody attends; their own outputs are unused)
TEXT_PADDING = {
    "QwenImageTransformer2DModel": ("encoder_hidden_states", "encoder_hidden_states_mask"),
}


def install_text_padding(transformer: torch.nn.Module, degree: int) -> None:
    """Pads the text of every call of ``transformer`` to a multiple of ``degree`` tokens,
    masked (a forward pre-hook: it runs before diffusers' split hooks)."""
    states_name, mask_name = TEXT_PADDING[type(transformer).__name__]

    def pad(module, args, kwargs):
        states = kwargs.get(states_name)
        if states is None or states.shape[1] % degree == 0:
            return None
        extra = -states.shape[1] % degree
        mask = kwargs.get(mask_name)
        if mask is None:
            mask = torch.ones(states.shape[:2], dtype=torch.bool, device=states.device)
        kwargs[states_name] = torch.nn.functional.pad(states, (0, 0, 0, extra))
        kwargs[mask_name] = torch.nn.functional.pad(mask.bool(), (0, extra), value=False)
        return args, kwargs

    transformer.register_forward_pre_hook(pad, with_kwargs=True)


def plan_for(transformer: torch.nn.Module) -> dict | None:
    """diffusers' own plan for this denoiser, else ours, else None."""
    plan = getattr(transformer, "_cp_plan", None)
    if plan is not None:
        return plan
    from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput

    if type(transformer).__name__ == "WanVACETransformer3DModel":
        tokens = ContextParallelInput(split_dim=1, expected_dims=3, split_output=False)
        rope = ContextParallelInput(split_dim=1, expected_dims=4, split_output=True)
        return {
            "rope": {0: rope, 1: rope},
            "": {"timestep": ContextParallelInput(split_dim=1, expected_dims=2,
                                                  split_output=False)},
            "vace_blocks.0": {"hidden_states": tokens, "control_hidden_states": tokens},
            "blocks.0": {"hidden_states": tokens},
            "proj_out": ContextParallelOutput(gather_dim=1, expected_dims=3),
        }
    return None


# -- our own sequence plan for denoisers whose attention calls SDPA directly ---------------

class _PlanState:
    """What the plan's hooks share within one forward: whether a cross-rank attention runs,
    this rank's slice of the image (or video) tokens (start, size, total), and the total
    token count of every tensor split this forward (each rank's key block is its share of
    each: the ring's block sizes follow from them, with no collective)."""

    def __init__(self):
        self.active = 0
        self.image = (0, 0, 0)
        self.totals: list[int] = []

    def record(self, total: int, group, first: bool) -> tuple[int, int]:
        """Records a split of ``total`` tokens (``first``: the image tokens, which start a
        new forward); returns this rank's (start, size)."""
        n, rank = dist.get_world_size(group), dist.get_rank(group)
        sizes = split_sizes(total, n)
        start = sum(sizes[:rank])
        if first:
            self.image = (start, sizes[rank], total)
            self.totals = []
        self.totals.append(total)
        return start, sizes[rank]

    def block_tokens(self, group) -> list[int]:
        """Every rank's key/value block length (its share of each split tensor)."""
        n = dist.get_world_size(group)
        return [sum(split_sizes(total, n)[r] for total in self.totals) for r in range(n)]


class _Split:
    """Splits a module's (batch, tokens, channels) output along the tokens for this rank
    (uneven splits allowed: the first ``tokens % n`` ranks hold one more). The first split
    of a plan is its image tokens: their slice is recorded in the state."""

    def __init__(self, group, state: _PlanState, first: bool):
        self.group, self.state, self.first = group, state, first

    def __call__(self, module, args, output):
        start, size = self.state.record(output.shape[1], self.group, self.first)
        return output.narrow(1, start, size).contiguous()


class _RopeRows:
    """A rotary embedding over [image tokens, text tokens] (dim 1): keeps this rank's image
    rows and every text row (HiDream keeps its text whole on every rank)."""

    def __init__(self, state: _PlanState):
        self.state = state

    def __call__(self, module, args, output):
        start, size, total = self.state.image
        return torch.cat([output[:, start:start + size], output[:, total:]], dim=1)


class _MaskRows:
    """A block's ``hidden_states_masks`` (batch, tokens) over [image, text] cut like
    :class:`_RopeRows` (HiDream pads non-square images to a fixed token count and masks the
    padding)."""

    def __init__(self, state: _PlanState):
        self.state = state

    def __call__(self, module, args, kwargs):
        mask = kwargs.get("hidden_states_masks")
        if mask is None:
            return None
        start, size, total = self.state.image
        kwargs["hidden_states_masks"] = torch.cat([mask[:, start:start + size],
                                                   mask[:, total:]], dim=1)
        return args, kwargs


class _Gather:
    """Gathers a module's (batch, local image tokens, channels) output from every rank, in
    rank order (padded to the longest shard for the all-gather, then trimmed; the shard
    lengths follow from the recorded split)."""

    def __init__(self, group, state: _PlanState):
        self.group, self.state = group, state

    def __call__(self, module, args, output):
        n = dist.get_world_size(self.group)
        lengths = split_sizes(self.state.image[2], n)
        if output.shape[1] != lengths[dist.get_rank(self.group)]:
            raise RuntimeError(f"sequence parallel: the gathered output holds "
                               f"{output.shape[1]} tokens, the split gave this rank "
                               f"{lengths[dist.get_rank(self.group)]}")
        longest = max(lengths)
        padded = torch.nn.functional.pad(output, (0, 0, 0, longest - output.shape[1]))
        parts = [torch.empty_like(padded) for _ in range(n)]
        dist.all_gather(parts, padded.contiguous(), group=self.group)
        return torch.cat([p[:, :length] for p, length in zip(parts, lengths, strict=True)], 1)


def split_sizes(tokens: int, ranks: int) -> list[int]:
    """Tokens per rank when ``tokens`` are split over ``ranks`` (the first ``tokens % ranks``
    ranks hold one more)."""
    return [tokens // ranks + (1 if r < tokens % ranks else 0) for r in range(ranks)]


_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
              "enable_gqa")


class _RingSDPA(TorchFunctionMode):
    """While one of the plan's attention modules runs, its
    ``F.scaled_dot_product_attention(q, k, v)`` on (batch, heads, tokens, head_dim) local
    shards becomes ring attention over the sequence group. With ``replicated_text`` the
    keys are [this rank's image shard, the whole text] and only the image shards travel.
    The queries may be any tokens (a rank's shard, or tokens every rank holds whole)."""

    def __init__(self, group, state: _PlanState, replicated_text: bool):
        super().__init__()
        self.group, self.state, self.replicated_text = group, state, replicated_text

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention or not self.state.active:
            return func(*args, **kwargs)
        call = dict(zip(_SDPA_ARGS, args, strict=False)) | kwargs
        q, k, v = call["query"], call["key"], call["value"]
        if call.get("attn_mask") is not None or call.get("is_causal") or \
                call.get("dropout_p"):
            raise ValueError("sequence parallel: a masked, causal or dropout attention "
                             "cannot be split by our ring plan")
        shared = k.shape[2] - self.state.image[1] if self.replicated_text else 0
        lengths = self.state.block_tokens(self.group)
        if k.shape[2] - shared != lengths[dist.get_rank(self.group)]:
            raise RuntimeError(f"sequence parallel: an attention's keys hold "
                               f"{k.shape[2] - shared} split tokens, the plan gave this rank "
                               f"{lengths[dist.get_rank(self.group)]}")
        out, _ = ring_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                group=self.group, scale=call.get("scale"),
                                block_tokens=lengths, shared_tokens=shared)
        return out.transpose(1, 2)


class _RingPlanHook(ModelHook):
    """On the denoiser: the ring SDPA mode for the duration of its forward."""

    def __init__(self, group, state: _PlanState, replicated_text: bool):
        super().__init__()
        self.group, self.state, self.replicated_text = group, state, replicated_text

    def new_forward(self, module, *args, **kwargs):
        # a forward that raised (out of memory, say) skipped the attention modules' leave
        # hooks: a new forward starts with none active, or later local SDPA calls would ring
        self.state.active = 0
        try:
            with _RingSDPA(self.group, self.state, self.replicated_text):
                return self.fn_ref.original_forward(*args, **kwargs)
        finally:
            self.state.active = 0


@dataclass(frozen=True)
class SdpaSequencePlan:
    """Our sequence plan for a denoiser whose attention calls SDPA itself.

    Attributes:
        split_outputs: modules whose (batch, tokens, channels) outputs are split over the
            ranks, image tokens first (the token embeddings, after any positional
            embedding).
        gather_output: the module whose output is gathered back (before unpatchifying).
        attention_blocks: the block lists whose attention modules attend across ranks
            (every module with a ``processor`` under them).
        replicated_text: the text tokens stay whole on every rank (they are appended to the
            image shard inside every attention); only image key/value shards travel.
        rope_output: a module whose output is a rotary embedding over [image, text] tokens
            (dim 1), cut to this rank's image rows and every text row; the blocks'
            ``hidden_states_masks`` are cut alike.
        attention_modules: the attention modules (names within each block) that attend
            across ranks; empty: every module with a ``processor``. The others see only
            tokens this rank holds whole or its own shard's (local attention).
        split_inputs: splits the denoiser's forward keyword arguments in place instead of
            module outputs: ``split_inputs(transformer, kwargs, state, group)``, recording
            the split in ``state`` (see :func:`split_ltx2_video_inputs`).
    """

    split_outputs: tuple[str, ...]
    gather_output: str
    attention_blocks: tuple[str, ...]
    replicated_text: bool = False
    rope_output: str | None = None
    attention_modules: tuple[str, ...] = ()
    split_inputs: Callable[[torch.nn.Module, dict, _PlanState, object], None] | None = None


def split_ltx2_video_inputs(transformer: torch.nn.Module, kwargs: dict, state: _PlanState,
                            group) -> None:
    """LTX-2's forward arguments cut to this rank's share of the video tokens.

    The video latents ``hidden_states`` (batch, video tokens, channels) are split along the
    tokens; so are the rows that follow them: ``video_coords`` (batch, 3, video tokens, 2),
    computed here from ``num_frames``/``height``/``width``/``fps`` when the caller passed
    none (both rotary embeddings of the video, self- and cross-modal, are built from it), a
    per-token ``timestep`` or ``sigma`` (batch, video tokens) (image-to-video conditions the
    first frame at timestep 0), and ``video_keyframes_mask``. The audio latents, the text
    and the audio's own timestep stay whole on every rank (the audio timestep defaults to
    the unsplit video one, as in the model).

    Raises:
        ParallelConfigError: a ``video_self_attention_mask`` (a (video, video) mask our ring
            cannot split).
    """
    from studio.engine.parallel.config import ParallelConfigError

    hidden = kwargs["hidden_states"]
    total = hidden.shape[1]
    start, size = state.record(total, group, first=True)
    if kwargs.get("video_self_attention_mask") is not None:
        raise ParallelConfigError("sequence parallel: LTX-2's video self-attention mask "
                                  "cannot be split by our ring plan; use CFG parallelism")
    coords = kwargs.get("video_coords")
    if coords is None:
        coords = transformer.rope.prepare_video_coords(
            hidden.shape[0], kwargs["num_frames"], kwargs["height"], kwargs["width"],
            hidden.device, fps=kwargs.get("fps", 24.0))
    kwargs["video_coords"] = coords.narrow(2, start, size)
    for name, audio_name in (("timestep", "audio_timestep"), ("sigma", "audio_sigma")):
        value = kwargs.get(name)
        if torch.is_tensor(value) and value.dim() >= 2 and value.shape[1] == total:
            if kwargs.get(audio_name) is None:
                kwargs[audio_name] = value
            kwargs[name] = value.narrow(1, start, size)
    marks = kwargs.get("video_keyframes_mask")
    if torch.is_tensor(marks) and marks.dim() >= 2 and marks.shape[1] == total:
        kwargs["video_keyframes_mask"] = marks.narrow(1, start, size)
    kwargs["hidden_states"] = hidden.narrow(1, start, size)


class _SplitInputs:
    """A denoiser forward pre-hook running a plan's ``split_inputs`` on its arguments
    (positional ones bound to their names first)."""

    def __init__(self, split, state: _PlanState, group):
        self.split, self.state, self.group = split, state, group

    def __call__(self, module, args, kwargs):
        if args:
            import inspect

            bound = inspect.signature(module.forward).bind_partial(*args, **kwargs)
            args, kwargs = (), dict(bound.arguments)
        self.split(module, kwargs, self.state, self.group)
        return args, kwargs


SDPA_PLANS = {
    # SD3 / SD3.5: image tokens (after pos_embed) and text tokens (after context_embedder)
    # are split; each joint attention is [image shard, text shard] per rank, which ring
    # attention over the ranks turns into attention to every image and text token.
    "SD3Transformer2DModel": SdpaSequencePlan(("pos_embed", "context_embedder"), "proj_out",
                                              ("transformer_blocks",)),
    # HiDream-I1: fresh text states join every block and are sliced back by length, so the
    # text stays whole on every rank; the image tokens are split after x_embedder, the
    # rotary embedding over [image, text] is cut to match, and each attention sees
    # [image shard, text] with the other ranks' image shards coming round the ring.
    "HiDreamImageTransformer2DModel": SdpaSequencePlan(
        ("x_embedder",), "final_layer", ("double_stream_blocks", "single_stream_blocks"),
        replicated_text=True, rope_output="pe_embedder"),
    # LTX-2 (audio-video): the video tokens are split (with their coordinates, from which
    # both video rotary embeddings are built, and any per-token timestep); the audio and
    # the text stay whole on every rank, where they are few (the audio stream is computed
    # alike on every rank). Two attentions cross ranks: the video self-attention (a shard's
    # queries to every video key) and video-to-audio (the whole audio's queries to every
    # video key); the text and audio-to-video attentions have all their keys locally.
    "LTX2VideoTransformer3DModel": SdpaSequencePlan(
        (), "proj_out", ("transformer_blocks",),
        attention_modules=("attn1", "video_to_audio_attn"),
        split_inputs=split_ltx2_video_inputs),
}


def apply_sdpa_sequence_plan(transformer: torch.nn.Module, plan: SdpaSequencePlan,
                             group) -> None:
    """Installs ``plan`` with ring attention over ``group`` (ranks may hold different token
    counts: text lengths rarely divide evenly)."""
    modules = dict(transformer.named_modules())
    state = _PlanState()
    if plan.split_inputs is not None:
        transformer.register_forward_pre_hook(_SplitInputs(plan.split_inputs, state, group),
                                              with_kwargs=True)
    for index, name in enumerate(plan.split_outputs):
        modules[name].register_forward_hook(_Split(group, state, first=index == 0))
    if plan.rope_output is not None:
        modules[plan.rope_output].register_forward_hook(_RopeRows(state))
        for blocks in plan.attention_blocks:
            for block in modules[blocks]:
                block.register_forward_pre_hook(_MaskRows(state), with_kwargs=True)
    modules[plan.gather_output].register_forward_hook(_Gather(group, state))

    def enter(module, args):
        state.active += 1

    def leave(module, args, output):
        state.active -= 1

    for blocks in plan.attention_blocks:
        for block in modules[blocks]:
            if plan.attention_modules:
                chosen = [block.get_submodule(name) for name in plan.attention_modules]
            else:
                chosen = [m for m in block.modules()
                          if getattr(m, "processor", None) is not None]
            for module in chosen:
                module.register_forward_pre_hook(enter)
                module.register_forward_hook(leave)
    HookRegistry.check_if_exists_or_initialize(transformer).register_hook(
        _RingPlanHook(group, state, plan.replicated_text), "studio_ring_sdpa_plan")
