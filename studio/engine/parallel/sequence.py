"""Sequence parallelism through diffusers' context-parallel plans (Ulysses and ring) for the
models that have one (Flux, Flux2, Wan, LTX, Qwen-Image), Ulysses and ring (ring on our
own attention: :mod:`studio.engine.parallel.ring`); ring plans of our own for SD3, HiDream
and LTX-2 (:mod:`studio.engine.parallel.plans`).

diffusers picks each rank's device as ``rank % torch.accelerator.device_count()``, which is
a division by zero on a CPU-only machine. :func:`apply_sequence_parallel` scopes a patch of
``device_count`` to 1 around its own ``enable_parallelism`` call on the CPU (gloo ranks), and
only there: nothing global changes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from unittest import mock

import torch

from studio.engine.parallel.config import ParallelConfig, ParallelConfigError
from studio.engine.parallel.mesh import ParallelMesh


@contextlib.contextmanager
def _cpu_ranks() -> Iterator[None]:
    if torch.accelerator.device_count() > 0:
        yield
        return
    with mock.patch.object(torch.accelerator, "device_count", return_value=1):
        yield


def apply_sequence_parallel(transformer: torch.nn.Module, config: ParallelConfig,
                            mesh: ParallelMesh | None = None) -> None:
    """Splits the transformer's sequence over ``config.ulysses_degree × ring_degree`` ranks
    with the model's own context-parallel plan. Ring attention (alone or combined with
    Ulysses) runs on our log-sum-exp attention (:mod:`studio.engine.parallel.ring`).

    Args:
        transformer: a diffusers model with a context-parallel plan (diffusers' ``_cp_plan``,
            or ours in :mod:`studio.engine.parallel.plans`).
        config: the degrees.
        mesh: the group's mesh (:class:`ParallelMesh`); default: the whole initialized world
            as ``(ring, ulysses)``.

    Raises:
        ParallelConfigError: the model has no context-parallel plan, or its heads do not
            divide by the Ulysses degree while ring attention is combined with it (under
            Ulysses alone uneven heads are padded: diffusers' ``ulysses_anything``). Later,
            from a forward whose latent tokens the sequence degree does not divide
            (:func:`install_token_check`; under Ulysses alone with padded heads any count
            splits).
    """
    import torch.distributed as dist
    from diffusers import ContextParallelConfig

    from studio.engine.parallel.plans import (
        NOT_YET,
        OUR_ULYSSES_ATTENTION,
        SDPA_PLANS,
        TEXT_PADDING,
        apply_sdpa_sequence_plan,
        install_text_padding,
        plan_for,
    )

    name = type(transformer).__name__
    if name in NOT_YET:
        raise ParallelConfigError(f"sequence parallel: not available for {name} yet: "
                                  f"{NOT_YET[name]}; use CFG parallelism for it")
    own = SDPA_PLANS.get(name)  # ours first: it replaces a diffusers plan that breaks
    plan = None if own is not None else plan_for(transformer)
    if own is not None:
        if config.ulysses_degree > 1:
            raise ParallelConfigError(
                f"ulysses_degree: {type(transformer).__name__} splits its sequence with ring "
                f"attention only (our own plan for it rings uneven token shards); use "
                f"ring_degree")
        group = mesh.sequence_group if mesh is not None else dist.group.WORLD
        apply_sdpa_sequence_plan(transformer, own, group)
        transformer._studio_sequence_group = group
        return
    if plan is None:
        raise ParallelConfigError(f"sequence parallel: {type(transformer).__name__} has no "
                                  f"context-parallel plan (diffusers has none, nor do we: "
                                  f"its attention does not go through diffusers' "
                                  f"dispatcher); use CFG parallelism for it")
    heads = getattr(transformer.config, "num_attention_heads", None)
    # heads that do not divide by the Ulysses degree: diffusers' "Ulysses anything" pads
    # them with empty heads for the all-to-all (Ulysses alone only)
    uneven_heads = heads is not None and config.ulysses_degree > 1 and \
        heads % config.ulysses_degree != 0
    if uneven_heads and config.ring_degree > 1:
        raise ParallelConfigError(f"ulysses_degree: {config.ulysses_degree} does not divide "
                                  f"the model's {heads} attention heads (uneven heads are "
                                  f"padded under Ulysses alone, not combined with ring)")
    cp = ContextParallelConfig(ulysses_degree=config.ulysses_degree or None,
                               ring_degree=config.ring_degree or None,
                               ulysses_anything=uneven_heads,
                               mesh=mesh.sequence_mesh if mesh is not None else None)
    if config.ring_degree > 1 or name in OUR_ULYSSES_ATTENTION:
        from studio.engine.parallel.ring import install_ring_backend

        install_ring_backend(transformer)
    if name in TEXT_PADDING:
        install_text_padding(transformer, config.sequence_degree)
    if not uneven_heads:  # diffusers' even sharder asserts; "Ulysses anything" splits any
        # count. After the text padding: pre-hooks run in order, and it evens Qwen's text
        install_token_check(transformer, config.sequence_degree, plan)
    with _cpu_ranks():
        transformer.enable_parallelism(config=cp, cp_plan=plan)
    # the step cache all-reduces its decision signal over this group (rank-consistent)
    transformer._studio_sequence_group = (mesh.sequence_group if mesh is not None
                                          else dist.group.WORLD)


#: denoisers whose diffusers plan splits the latent tokens inside the model (after the patch
#: embedding: the rotary table and the first block's input), from a 5-D latent input
LATENT_SPLIT_INSIDE = frozenset({"WanTransformer3DModel", "WanVACETransformer3DModel",
                                 "ChronoEditTransformer3DModel"})


def latent_token_count(transformer: torch.nn.Module, hidden_states: torch.Tensor) -> int | None:
    """Tokens of the latent sequence a Wan-style denoiser splits over the sequence ranks.

    Args:
        transformer: the denoiser (its ``config.patch_size``).
        hidden_states: (B, C, F, H, W) latents with a 3-D patch.

    Returns:
        ``(F / pt) * (H / ph) * (W / pw)``; None for any other layout.
    """
    from studio.engine.attention import token_grid

    if not torch.is_tensor(hidden_states):
        return None
    grid = token_grid(transformer, hidden_states)
    return None if grid is None else grid[0] * grid[1] * grid[2]


def install_token_check(transformer: torch.nn.Module, degree: int, plan: dict) -> None:
    """Refuses, before any rank splits or communicates, a forward with a sequence that does
    not divide evenly over ``degree`` sequence ranks (diffusers' even sharder, which every
    rank would reach, otherwise fails on an internal assertion). Checked: every tensor the
    plan's root entry splits (Flux, Flux2, LTX, Qwen-Image: the packed latent tokens
    ``hidden_states`` and the text tokens ``encoder_hidden_states``, with their ids and
    masks), and for :data:`LATENT_SPLIT_INSIDE` the latent tokens of the 5-D input. Every
    rank gets the same input, so every rank raises the same error at the same point and the
    group stays in step.

    Args:
        transformer: the denoiser the plan is applied to.
        degree: ``ulysses_degree × ring_degree``.
        plan: its context-parallel plan (diffusers' ``_cp_plan`` layout:
            ``{module path: {argument: ContextParallelInput}}``, ``""`` the model itself).

    Raises (from the forward):
        ParallelConfigError: naming the argument, its length, the degree and what to change.
    """
    from diffusers.models._modeling_parallel import ContextParallelInput

    root = {name: spec for name, spec in (plan.get("") or {}).items()
            if isinstance(name, str) and isinstance(spec, ContextParallelInput)
            and not spec.split_output}
    inside = type(transformer).__name__ in LATENT_SPLIT_INSIDE

    def refuse(what: str, count: int):
        raise ParallelConfigError(
            f"ulysses_degree × ring_degree = {degree} does not divide this job's {count} "
            f"{what} (padding is not supported): pick a width, height, frame count or prompt "
            f"length whose token count divides by {degree}, or a plan without sequence "
            f"parallelism")

    def check(module, args, kwargs):
        if inside:
            tokens = latent_token_count(module, kwargs.get("hidden_states",
                                                           args[0] if args else None))
            if tokens is not None and tokens % degree:
                refuse("latent tokens", tokens)
        for name, spec in root.items():
            value = kwargs.get(name)
            if not torch.is_tensor(value) or (spec.expected_dims is not None
                                              and value.dim() != spec.expected_dims):
                continue  # diffusers splits only what matches the plan
            length = int(value.shape[spec.split_dim])
            if length % degree:
                refuse(f"tokens of {name}", length)

    transformer.register_forward_pre_hook(check, with_kwargs=True)
