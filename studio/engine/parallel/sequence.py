"""Sequence parallelism through diffusers' context-parallel plans (Ulysses and ring) for the
models that have one (Flux, Flux2, Wan, LTX, LTX-2, Qwen-Image).

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


@contextlib.contextmanager
def _cpu_ranks() -> Iterator[None]:
    if torch.accelerator.device_count() > 0:
        yield
        return
    with mock.patch.object(torch.accelerator, "device_count", return_value=1):
        yield


def apply_sequence_parallel(transformer: torch.nn.Module, config: ParallelConfig) -> None:
    """Splits the transformer's sequence over ``config.ulysses_degree × ring_degree`` ranks
    of the initialized process group with the model's own context-parallel plan.

    Raises:
        ParallelConfigError: the model has no context-parallel plan, or its heads do not
            divide by the Ulysses degree.
    """
    from diffusers import ContextParallelConfig

    if getattr(transformer, "_cp_plan", None) is None:
        raise ParallelConfigError(f"sequence parallel: {type(transformer).__name__} has no "
                                  f"context-parallel plan in diffusers")
    heads = getattr(transformer.config, "num_attention_heads", None)
    if heads is not None and heads % config.ulysses_degree:
        raise ParallelConfigError(f"ulysses_degree: {config.ulysses_degree} does not divide "
                                  f"the model's {heads} attention heads")
    cp = ContextParallelConfig(ulysses_degree=config.ulysses_degree or None,
                               ring_degree=config.ring_degree or None)
    with _cpu_ranks():
        transformer.enable_parallelism(config=cp)
    # the step cache all-reduces its decision signal over this group (rank-consistent)
    import torch.distributed as dist

    transformer._studio_sequence_group = dist.group.WORLD
