"""Multi-device parallelism: validated configs, rank groups on torch.distributed, and plans
(CFG parallel here; sequence parallel through diffusers' context-parallel plans)."""

from studio.engine.parallel.config import ParallelConfig, ParallelConfigError

__all__ = ["ParallelConfig", "ParallelConfigError"]
