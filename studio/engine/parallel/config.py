"""``ParallelConfig``: how one job is split over ranks, validated before anything starts.

ranks = ulysses_degree × ring_degree × cfg_degree × replicas. Ulysses (DeepSpeed-Ulysses,
Jacobs et al. 2023) splits the attention heads after an all-to-all: heads that do not divide
by its degree are padded with empty ones (diffusers' "Ulysses anything"), which only works
for Ulysses alone, not combined with ring; ring attention (Liu et al., "Ring Attention", 2023) splits the sequence and
passes key/value blocks around the ring; CFG parallel puts the conditional and unconditional
branches on different ranks (as xDiT does); replicas run independent jobs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


class ParallelConfigError(ValueError):
    """A parallel configuration that cannot run; the message names the field and the rule."""


@dataclass(frozen=True)
class ParallelConfig:
    """Degrees of each kind of parallelism (each ≥ 1).

    Attributes:
        ulysses_degree: ranks that split attention heads (sequence all-to-all).
        ring_degree: ranks that split the sequence with ring attention.
        cfg_degree: 1, or 2 to run the two guidance branches on different ranks.
        replicas: data-parallel copies, each running its own jobs.
    """

    ulysses_degree: int = 1
    ring_degree: int = 1
    cfg_degree: int = 1
    replicas: int = 1

    @property
    def world_size(self) -> int:
        """The number of ranks this configuration needs."""
        return self.ulysses_degree * self.ring_degree * self.cfg_degree * self.replicas

    @property
    def sequence_degree(self) -> int:
        return self.ulysses_degree * self.ring_degree

    def validate(self, *, devices: int, heads: int | None = None,
                 sequence_length: int | None = None, uses_cfg: bool = True) -> None:
        """Checks the configuration against the machine and the model.

        Args:
            devices: GPUs available (or CPU ranks allowed).
            heads: the model's attention heads (Ulysses splits them; uneven heads are
                padded, under Ulysses alone).
            sequence_length: tokens of the job's latent sequence (sequence parallel splits
                them; they must divide evenly, padding is not supported).
            uses_cfg: whether the job runs classifier-free guidance (two branches).

        Raises:
            ParallelConfigError: naming the field, the value and the rule.
        """
        for name in ("ulysses_degree", "ring_degree", "cfg_degree", "replicas"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ParallelConfigError(f"{name}: {value!r} must be an integer >= 1")
        for name, value, least in (("devices", devices, 0), ("heads", heads, 1),
                                   ("sequence_length", sequence_length, 1)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < least):
                raise ParallelConfigError(f"{name}: {value!r} must be an integer >= {least}")
        if self.cfg_degree not in (1, 2):
            raise ParallelConfigError(f"cfg_degree: {self.cfg_degree} must be 1 or 2 (there "
                                      f"are two guidance branches)")
        if self.cfg_degree == 2 and not uses_cfg:
            raise ParallelConfigError("cfg_degree: 2 needs a job with classifier-free guidance "
                                      "(guidance scale > 1 and a model that runs two branches)")
        if self.world_size > 1 and self.world_size > devices:
            raise ParallelConfigError(
                f"ulysses_degree × ring_degree × cfg_degree × replicas = {self.world_size} "
                f"ranks, but only {devices} device(s) are available (at most {devices} ranks "
                f"here)")
        if heads is not None and heads % self.ulysses_degree and self.ring_degree > 1:
            raise ParallelConfigError(f"ulysses_degree: {self.ulysses_degree} does not divide "
                                      f"the model's {heads} attention heads (uneven heads are "
                                      f"padded under Ulysses alone, not combined with ring)")
        if sequence_length is not None and sequence_length % self.sequence_degree:
            raise ParallelConfigError(
                f"ulysses_degree × ring_degree = {self.sequence_degree} does not divide the "
                f"sequence of {sequence_length} tokens (padding is not supported: change the "
                f"size or frame count)")


def describe_plan(parallel: ParallelConfig) -> str:
    """A short name for a plan, recorded with each finished job and shown in the settings,
    e.g. ``"ulysses 2 × cfg 2 (4 ranks)"`` or ``"single device"``."""
    parts = [f"{name} {degree}" for name, degree in (
        ("ulysses", parallel.ulysses_degree), ("ring", parallel.ring_degree),
        ("cfg", parallel.cfg_degree)) if degree > 1]
    if not parts:
        return "single device"
    return " × ".join(parts) + f" ({parallel.world_size} ranks)"


def available_plans(gpus: int) -> list[tuple[str, ParallelConfig]]:
    """The plans a machine with ``gpus`` GPUs can run, as (label, config), single device
    first. For each group size n in 2, 4, 8 (≤ gpus): CFG 2 (n = 2), Ulysses n, ring n,
    and CFG 2 × Ulysses n/2 and × ring n/2 (n ≥ 4); with 8, Ulysses 4 × ring 2 as well.
    Whether a model takes a plan (heads divisible by the Ulysses degree when combined with
    ring, a sequence that
    splits evenly, guidance on for CFG) is checked when a job runs, with a clear error.
    """
    plans = [ParallelConfig()]
    for n in (2, 4, 8):
        if n > gpus:
            break
        if n == 2:
            plans.append(ParallelConfig(cfg_degree=2))
        plans += [ParallelConfig(ulysses_degree=n), ParallelConfig(ring_degree=n)]
        if n >= 4:
            plans += [ParallelConfig(ulysses_degree=n // 2, cfg_degree=2),
                      ParallelConfig(ring_degree=n // 2, cfg_degree=2)]
        if n == 8:
            plans.append(ParallelConfig(ulysses_degree=4, ring_degree=2))
    return [(describe_plan(p), p) for p in plans]


def visible_gpus() -> int:
    """NVIDIA GPUs this process may use, counted without importing torch (the GUI thread
    calls it): the driver's entries under /proc/driver/nvidia/gpus, limited by
    ``CUDA_VISIBLE_DEVICES`` when it is set. 0 on a machine without the driver."""
    root = Path("/proc/driver/nvidia/gpus")
    try:
        present = sum(1 for _ in root.iterdir())
    except OSError:
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return present
    entries = [v for v in visible.split(",") if v.strip() and not v.strip().startswith("-")]
    return min(present, len(entries))
