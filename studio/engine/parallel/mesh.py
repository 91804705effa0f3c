"""The device mesh of one rank group: ``(cfg, ring, ulysses)``, built once per group.

A group of ``cfg_degree × ring_degree × ulysses_degree`` ranks is laid out as a 3-D
``torch.distributed.DeviceMesh`` with those dimension names. The sequence-parallel plan
(diffusers' context parallelism, and our ring attention) runs on the ``(ring, ulysses)``
sub-mesh of the rank's CFG coordinate; CFG parallelism pairs the ranks that share a
sequence coordinate (the ``cfg`` dimension). With cfg 2 × ulysses 2 on ranks 0–3:
ranks {0, 1} and {2, 3} split the sequence, {0, 2} and {1, 3} split the guidance branches.
This is the layout xDiT uses for hybrid parallelism (Fang et al., "xDiT", 2024).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from studio.engine.parallel.config import ParallelConfig, ParallelConfigError

DIMENSIONS = ("cfg", "ring", "ulysses")


@dataclass
class ParallelMesh:
    """One rank's view of the group's mesh.

    Attributes:
        config: the degrees (replicas must be 1: replicas are separate groups).
        mesh: the 3-D DeviceMesh ``(cfg, ring, ulysses)`` over the initialized world.
    """

    config: ParallelConfig
    mesh: object

    @classmethod
    def build(cls, config: ParallelConfig) -> ParallelMesh:
        """Builds the mesh over the initialized default process group.

        Raises:
            ParallelConfigError: the world size is not ``cfg × ring × ulysses`` or
                ``replicas`` is not 1.
        """
        if config.replicas != 1:
            raise ParallelConfigError("replicas: a rank group runs one job at a time; run "
                                      "replicas as separate groups (Engine.for_devices)")
        world = dist.get_world_size()
        shape = (config.cfg_degree, config.ring_degree, config.ulysses_degree)
        if world != config.world_size:
            raise ParallelConfigError(f"cfg_degree × ring_degree × ulysses_degree = "
                                      f"{config.world_size}, but the group has {world} ranks")
        device_type = "cuda" if torch.cuda.is_available() else "cpu"
        mesh = dist.device_mesh.init_device_mesh(device_type, shape, mesh_dim_names=DIMENSIONS)
        return cls(config, mesh)

    @property
    def cfg_group(self):
        """The 2-rank process group of this rank's guidance pair (None when cfg_degree 1)."""
        return self.mesh["cfg"].get_group() if self.config.cfg_degree == 2 else None

    @property
    def sequence_mesh(self):
        """The ``(ring, ulysses)`` sub-mesh this rank splits its sequence over."""
        return self.mesh["ring", "ulysses"]

    @property
    def sequence_group(self):
        """The process group of :attr:`sequence_mesh`, flattened (None when degree 1)."""
        if self.config.sequence_degree == 1:
            return None
        return self.mesh["ring", "ulysses"]._flatten().get_group()
