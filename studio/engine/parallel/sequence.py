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
    if not uneven_heads:  # diffusers' even sharder asserts; "Ulysses anything" splits any
        install_token_check(transformer, config.sequence_degree)
    if config.ring_degree > 1 or name in OUR_ULYSSES_ATTENTION:
        from studio.engine.parallel.ring import install_ring_backend

        install_ring_backend(transformer)
    if name in TEXT_PADDING:
        install_text_padding(transformer, config.sequence_degree)
    with _cpu_ranks():
        transformer.enable_parallelism(config=cp, cp_plan=plan)
    # the step cache all-reduces its decision signal over this group (rank-consistent)
    transformer._studio_sequence_group = (mesh.sequence_group if mesh is not None
                                          else dist.group.WORLD)


def latent_token_count(transformer: torch.nn.Module, hidden_states: torch.Tensor) -> int | None:
    """Tokens of the latent sequence a denoiser's forward will split over the sequence ranks.

    Args:
        transformer: the denoiser (its ``config.patch_size`` for unpacked inputs).
        hidden_states: (B, S, C) packed tokens (Flux, Flux2, LTX, Qwen-Image), or
            (B, C, F, H, W) latents with a 3-D patch (Wan).

    Returns:
        S, or ``(F / pt) * (H / ph) * (W / pw)``; None for any other layout.
    """
    from studio.engine.attention import token_grid

    if not torch.is_tensor(hidden_states):
        return None
    if hidden_states.dim() == 3:
        return int(hidden_states.shape[1])
    grid = token_grid(transformer, hidden_states)
    return None if grid is None else grid[0] * grid[1] * grid[2]


def install_token_check(transformer: torch.nn.Module, degree: int) -> None:
    """Refuses, before any rank splits or communicates, a forward whose latent tokens do not
    divide evenly over ``degree`` sequence ranks (diffusers' even sharder, which every rank
    would reach, otherwise fails on an internal assertion). Every rank gets the same input,
    so every rank raises the same error at the same point and the group stays in step.

    Raises (from the forward):
        ParallelConfigError: naming the token count, the degree and what to change.
    """
    def check(module, args, kwargs):
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        tokens = latent_token_count(module, hidden)
        if tokens is not None and tokens % degree:
            raise ParallelConfigError(
                f"ulysses_degree × ring_degree = {degree} does not divide this job's "
                f"{tokens} latent tokens (padding is not supported): pick a width, height or "
                f"frame count whose token count divides by {degree}, or a plan without "
                f"sequence parallelism")

    transformer.register_forward_pre_hook(check, with_kwargs=True)
