"""Step caching: skip denoiser work that would change nothing (see :mod:`.step_cache`)."""

from studio.engine.caching.step_cache import (
    StepCacheConfig,
    StepCacheStats,
    apply_step_cache,
    remove_step_cache,
    reset_step_cache,
)

__all__ = ["StepCacheConfig", "StepCacheStats", "apply_step_cache", "remove_step_cache",
           "reset_step_cache"]
