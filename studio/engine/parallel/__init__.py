"""Multi-device parallelism: validated configs, rank groups on torch.distributed, and plans
(CFG parallel here; sequence parallel through diffusers' context-parallel plans)."""

from studio.engine.parallel.config import (
    ParallelConfig,
    ParallelConfigError,
    available_plans,
    describe_plan,
    visible_gpus,
)

__all__ = ["ParallelConfig", "ParallelConfigError", "available_plans", "describe_plan",
           "visible_gpus"]
