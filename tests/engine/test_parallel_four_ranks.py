"""Hybrid plans on one long-lived group of 4 CPU ranks (gloo): Ulysses 2 × CFG 2 and
ring 2 × CFG 2 give the single-process pixels on the embedded model (through the engine's
loading path, with and without the step cache) and on tiny Wan; the two sequence groups
and the two guidance pairs each do only their share."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from studio.engine.parallel import ParallelConfig
from studio.engine.parallel.launch import RankGroup
from tests.engine.test_parallel import (
    _generate_any,
    _load,
    check_plan_results,
    embedded_reference,
    embedded_request,
    plan_rank,
)


@pytest.fixture(scope="module")
def ranks():
    with RankGroup(4, timeout_s=60) as group:
        yield group


@pytest.mark.parametrize("sequence", ["ulysses", "ring"])
def test_embedded_model_under_sequence_times_cfg(ranks, sequence):
    requests = [embedded_request(), embedded_request(profile="balanced", steps=8)]
    want = embedded_reference(requests)
    results = ranks.run(plan_rank, {f"{sequence}_degree": 2, "cfg_degree": 2}, requests)
    check_plan_results(results, want, f"{sequence} 2 × cfg 2 (4 ranks)")


def _generate_guided(pipe, kind):
    """Wan with CFG; Flux with true CFG (a negative prompt and true_cfg_scale)."""
    if kind == "wan":
        return _generate_any(pipe, kind)
    out = pipe("a red circle", negative_prompt="blurry", true_cfg_scale=4.0,
               num_inference_steps=3, height=32, width=32,
               generator=torch.Generator().manual_seed(0), output_type="np")
    return np.asarray(out.images)


def _wan_rank(rank, world, folder, kind="wan"):
    from studio.engine.parallel.cfg import apply_cfg_parallel
    from studio.engine.parallel.comm import CommunicationLog
    from studio.engine.parallel.mesh import ParallelMesh
    from studio.engine.parallel.sequence import apply_sequence_parallel

    config = ParallelConfig(ulysses_degree=2, cfg_degree=2)
    mesh = ParallelMesh.build(config)
    pipe = _load(kind, folder)
    apply_sequence_parallel(pipe.transformer, config, mesh)
    hook = apply_cfg_parallel(pipe.transformer, mesh.cfg_group)
    with torch.inference_mode(), CommunicationLog() as log:
        frames = _generate_guided(pipe, kind)
    coordinate = mesh.mesh.get_coordinate()  # (cfg, ring, ulysses)
    return frames, dict(log.sent), hook.computed, tuple(coordinate)


@pytest.mark.parametrize("kind", ["wan", "flux"])
def test_tiny_wan_and_flux_under_ulysses_times_cfg(ranks, tiny_models, kind):
    folder = str(tiny_models["wan-t2v" if kind == "wan" else "flux"])
    pipe = _load(kind, folder)
    with torch.inference_mode():
        want = _generate_guided(pipe, kind)
    results = ranks.run(_wan_rank, folder, kind)
    for frames, _, _, _ in results:
        assert np.abs(frames - want).max() <= 1e-5
    by_coordinate = {r[3]: r for r in results}
    assert sorted(by_coordinate) == [(c, 0, u) for c in (0, 1) for u in (0, 1)]
    for (cfg, _, _), (_, sent, computed, _) in by_coordinate.items():
        # cfg rank 0 computes the 3 cond calls, cfg rank 1 the 3 uncond calls + the first
        # cond (to learn the output's shape); both exchange one output per step
        assert computed == (3 if cfg == 0 else 4)
        assert sent["allgather_"] == by_coordinate[(0, 0, 0)][1]["allgather_"]
    # the two ranks of a sequence group split the same work: equal all-to-all bytes
    for cfg in (0, 1):
        a, b = by_coordinate[(cfg, 0, 0)][1], by_coordinate[(cfg, 0, 1)][1]
        assert a == b and a["all_to_all_single"] > 0
    # the uncond rank of each pair ran one more denoiser call, so it moved 4/3 as much
    assert by_coordinate[(1, 0, 0)][1]["all_to_all_single"] * 3 == \
        by_coordinate[(0, 0, 0)][1]["all_to_all_single"] * 4


def _refused_rank(rank, world):
    from studio.engine.executor import JobExecutor
    from studio.engine.job import Job
    from studio.engine.models.registry import ModelRegistry
    from studio.engine.parallel.mesh import ParallelMesh
    from studio.engine.parallel.worker import apply_parallel_plan

    config = ParallelConfig(ulysses_degree=2, ring_degree=2)
    mesh = ParallelMesh.build(config)
    executor = JobExecutor(ModelRegistry(include_hf_cache=False), torch.device("cpu"))
    executor.on_runner_loaded = lambda runner: apply_parallel_plan(runner, config, mesh)
    event = executor.execute(Job("job", embedded_request()), lambda e: None, lambda: False)
    return event.kind, event.message


def test_a_plan_the_model_cannot_take_fails_the_job_clearly(ranks):
    for kind, message in ranks.run(_refused_rank):
        assert kind == "bad_input"
        assert message == ("multi-GPU plan: ulysses_degree: 2 does not divide the model's 3 "
                           "attention heads (uneven heads are padded under Ulysses alone, "
                           "not combined with ring)")
