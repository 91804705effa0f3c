"""Case 005: memory is returned between jobs, and cached models are not reloaded."""

from __future__ import annotations

import gc

from studio.core.request import GenerationRequest
from studio.engine import events as ev
from studio.engine.executor import Job, JobExecutor, _rss_bytes
from studio.engine.models.registry import ModelRegistry


def test_fifty_jobs_alternating_models_and_modes_keep_memory_flat(tiny_models):
    executor = JobExecutor(ModelRegistry(include_hf_cache=False), max_loaded=2)
    plans = [
        ("wan-t2v", dict(mode="t2v", num_frames=5)),
        ("flux", dict(mode="t2i")),
        ("wan-t2v", dict(mode="t2i")),
        ("flux", dict(mode="t2i", seed=4)),
    ]
    rss = {}
    for i in range(50):
        model, fields = plans[i % len(plans)]
        req = GenerationRequest(**{"model": str(tiny_models[model]), "prompt": "a red star",
                                   "seed": i, "steps": 2, "guidance_scale": 3.0,
                                   "width": 32, "height": 32, **fields})
        result = executor.execute(Job(f"j{i}", req), lambda e: None, lambda: False)
        assert isinstance(result, ev.Finished), result
        del result
        gc.collect()
        if i + 1 in (10, 50):
            rss[i + 1] = _rss_bytes()
    growth = (rss[50] - rss[10]) / rss[10]
    assert growth < 0.05, f"RSS grew {growth:.1%} between job 10 and job 50 ({rss})"
    assert executor.load_count == 2  # switching back to a cached model never reloads it
