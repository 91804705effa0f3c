"""The engine API: job lifecycle, queue, cancellation, failures, crash isolation."""

from __future__ import annotations

import asyncio
import os
import time

import numpy as np
import pytest
import torch

from studio.core.request import GenerationRequest, MediaRef
from studio.engine import events as ev
from studio.engine.api import Engine
from studio.engine.executor import JobExecutor
from studio.engine.models.registry import ModelRegistry
from studio.engine.worker import ProcessWorker, ThreadWorker, WorkerConfig


def request(model, **kw) -> GenerationRequest:
    base = dict(mode="t2i", model=str(model), prompt="a red circle", seed=1, steps=3,
                guidance_scale=4.0, width=32, height=32)
    base.update(kw)
    return GenerationRequest(**base)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=240))


@pytest.fixture(scope="module")
def executor():
    return JobExecutor(ModelRegistry(include_hf_cache=False))


def slow_steps(executor: JobExecutor, model, seconds: float):
    """Makes every denoiser call of ``model`` take at least ``seconds``."""
    entry = executor.registry.resolve(str(model))
    runner, _ = executor.runner_for(entry)
    return runner.base.transformer.register_forward_pre_hook(lambda *a: time.sleep(seconds))


def test_lifecycle_event_order(tiny_models, executor):
    async def main():
        async with Engine(ThreadWorker(executor=executor)) as engine:
            stream = engine.events()
            job = engine.submit(request(tiny_models["wan-t2v"]))
            events = []
            async for e in stream:
                events.append(e)
                if e.terminal:
                    break
            return events, await engine.wait(job)

    events, final = run(main())
    kinds = [type(e).__name__ for e in events]
    assert kinds == ["Queued", "Started", "Progress", "Progress", "Progress", "Finished"]
    assert events[0].position == 0
    assert [e.step for e in events[2:-1]] == [1, 2, 3]
    assert all(e.total_steps == 3 and e.preview.dtype == np.uint8 for e in events[2:-1])
    # the time left is unknown after the first step (its time includes the set-up), then
    # estimated from the steps since: the last step leaves none
    assert events[2].eta_s == ev.ETA_UNKNOWN < 0
    assert events[3].eta_s >= 0 and events[4].eta_s == 0
    assert final is events[-1] and final.frames.shape == (1, 32, 32, 3)
    assert set(final.timings) >= {"load", "prepare", "denoise", "decode", "total"}
    assert final.peak_memory_bytes > 0 and final.environment["dtype"] == "float32"
    assert GenerationRequest.from_json(final.request_json).model_hash  # filled in by the engine


def test_queue_order_cancel_queued_and_reorder(tiny_models, executor):
    handle = slow_steps(executor, tiny_models["wan-t2v"], 0.05)

    async def main():
        async with Engine(ThreadWorker(executor=executor)) as engine:
            events = []
            stream = engine.events()

            async def listen():
                async for e in stream:
                    events.append(e)

            listener = asyncio.ensure_future(listen())
            jobs = [engine.submit(request(tiny_models["wan-t2v"], seed=s)) for s in range(4)]
            assert engine.queued == jobs[1:] and engine.running == jobs[0]
            assert engine.cancel(jobs[1])
            assert engine.reorder(jobs[3], 0) and engine.queued == [jobs[3], jobs[2]]
            finals = [await engine.wait(j) for j in jobs]
            listener.cancel()
            return jobs, events, finals

    try:
        jobs, events, finals = run(main())
    finally:
        handle.remove()
    queued = [e for e in events if isinstance(e, ev.Queued)]
    assert [q.position for q in queued] == [0, 1, 2, 3]
    started = [e.job_id for e in events if isinstance(e, ev.Started)]
    assert started == [jobs[0], jobs[3], jobs[2]]  # reordered; the cancelled one never starts
    assert isinstance(finals[1], ev.Cancelled) and finals[1].during_step == 0
    assert all(isinstance(finals[i], ev.Finished) for i in (0, 2, 3))
    # seeds differ, pixels differ
    assert not np.array_equal(finals[0].frames, finals[2].frames)


def test_cancel_mid_run_stops_within_one_step(tiny_models, executor):
    handle = slow_steps(executor, tiny_models["wan-t2v"], 0.15)

    async def main():
        async with Engine(ThreadWorker(executor=executor)) as engine:
            stream = engine.events()
            job = engine.submit(request(tiny_models["wan-t2v"], steps=30))
            seen = 0
            async for e in stream:
                if isinstance(e, ev.Progress) and e.step == 2:
                    seen = e.step
                    engine.cancel(job)
                if e.terminal:
                    return seen, e

    try:
        seen, final = run(main())
    finally:
        handle.remove()
    assert isinstance(final, ev.Cancelled)
    assert seen <= final.during_step <= seen + 1


def test_failures_surface_and_the_worker_survives(tiny_models, executor, monkeypatch):
    async def main():
        async with Engine(ThreadWorker(executor=executor)) as engine:
            bad_model = engine.submit(request("/no/such/model"))
            bad_request = engine.submit(request(tiny_models["wan-t2v"], width=33))
            missing_input = engine.submit(request(tiny_models["wan-t2v"], mode="i2i",
                                                  init_image=MediaRef("0" * 32)))
            good = engine.submit(request(tiny_models["wan-t2v"]))
            return [await engine.wait(j) for j in (bad_model, bad_request, missing_input, good)]

    results = run(main())
    assert [type(r).__name__ for r in results] == ["Failed", "Failed", "Failed", "Finished"]
    assert results[0].kind == ev.MODEL_ERROR and "/no/such/model" in results[0].message
    assert results[1].kind == ev.BAD_INPUT and "width=33" in results[1].message
    assert results[2].kind == ev.BAD_INPUT and "init_image" in results[2].message

    # an unexpected exception is an internal error with a log file; the next job still runs
    entry = executor.registry.resolve(str(tiny_models["wan-t2v"]))
    runner, _ = executor.runner_for(entry)

    def boom(*a, **k):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(runner, "run", boom)

    async def again():
        async with Engine(ThreadWorker(executor=executor)) as engine:
            first = engine.submit(request(tiny_models["wan-t2v"]))
            result = await engine.wait(first)
            monkeypatch.undo()
            second = engine.submit(request(tiny_models["wan-t2v"]))
            return result, await engine.wait(second)

    failed, ok = run(again())
    assert failed.kind == ev.INTERNAL and "kaboom" in failed.message
    assert os.path.exists(failed.log_path) and "kaboom" in open(failed.log_path).read()
    assert isinstance(ok, ev.Finished)


def test_models_stay_loaded_between_jobs(tiny_models):
    executor = JobExecutor(ModelRegistry(include_hf_cache=False), max_loaded=2)

    async def main():
        async with Engine(ThreadWorker(executor=executor)) as engine:
            out = []
            for model in ("wan-t2v", "flux", "wan-t2v", "flux"):
                out.append(await engine.wait(engine.submit(request(tiny_models[model]))))
            return out

    results = run(main())
    assert all(isinstance(r, ev.Finished) for r in results)
    assert executor.load_count == 2
    assert results[2].timings["load"] == 0.0


def test_process_worker_crash_fails_the_job_and_the_next_job_runs(tiny_models):
    worker = ProcessWorker(WorkerConfig(include_hf_cache=False, torch_threads=1))

    async def main():
        async with Engine(worker) as engine:
            warm = await engine.wait(engine.submit(request(tiny_models["wan-t2v"])))
            stream = engine.events()
            long_job = engine.submit(request(tiny_models["wan-t2v"], steps=200))
            async for e in stream:
                if isinstance(e, ev.Progress) and e.job_id == long_job and e.step >= 1:
                    first_pid = worker.pid
                    worker.kill()
                    break
            died = await engine.wait(long_job)
            after = await engine.wait(engine.submit(request(tiny_models["wan-t2v"], seed=9)))
            return warm, died, after, first_pid, worker.pid

    warm, died, after, pid1, pid2 = run(main())
    assert isinstance(warm, ev.Finished) and warm.frames.shape == (1, 32, 32, 3)
    assert isinstance(died, ev.Failed) and died.kind == ev.WORKER_DIED
    assert "stopped unexpectedly" in died.message
    assert isinstance(after, ev.Finished) and pid1 != pid2


def test_jobs_spread_over_several_workers(tiny_models):
    """Data parallelism: two workers (one per device; two CPU executors here) run two jobs at
    once, queued jobs go to whichever frees first, and each job's events stay its own."""
    model = tiny_models["wan-t2v"]
    executors = [JobExecutor(ModelRegistry(include_hf_cache=False)) for _ in range(2)]
    hooks = [slow_steps(e, model, 0.05) for e in executors]
    workers = [ThreadWorker(WorkerConfig(), executor=e) for e in executors]

    async def main():
        async with Engine(workers=workers) as engine:
            stream = engine.events()
            jobs = [engine.submit(request(model, seed=s)) for s in range(4)]
            assert len(engine.running_jobs) == 2 and engine.queued == jobs[2:]
            started, finished, both = [], [], False
            async for event in stream:
                if isinstance(event, ev.Started):
                    started.append(event.job_id)
                if len(started) - len(finished) == 2:
                    both = True
                if isinstance(event, ev.Finished):
                    finished.append(event.job_id)
                if len(finished) == 4:
                    break
            return jobs, started, finished, both

    jobs, started, finished, both = run(main())
    for h in hooks:
        h.remove()
    assert both and sorted(finished) == sorted(jobs) and set(started[:2]) == set(jobs[:2])
    with pytest.raises(ValueError, match="devices"):
        Engine.for_devices(["cuda:0", "cuda:0"])


def test_a_device_the_machine_lacks_fails_each_job_with_the_reason():
    """Settings asking for CUDA on a machine without a GPU: the engine process stays up and
    every job fails as bad input with the device error (it once crashed the engine at start
    and every job read "the engine process stopped unexpectedly")."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")

    async def main():
        config = WorkerConfig(device="cuda", include_hf_cache=False)
        async with Engine(ProcessWorker(config)) as engine:
            first = await engine.wait(engine.submit(request("embedded")))
            second = await engine.wait(engine.submit(request("embedded")))
            return first, second

    for failed in run(main()):
        assert isinstance(failed, ev.Failed) and failed.kind == ev.BAD_INPUT, failed
        assert failed.message.startswith("engine settings: device='cuda': no CUDA GPU")


def test_a_prompt_longer_than_the_text_encoder_reads_gets_a_note():
    from studio.engine.job import Job

    executor = JobExecutor(ModelRegistry(include_hf_cache=False), torch.device("cpu"))
    notes = []
    for prompt in ("red " * 40 + "cat", "a red circle"):
        done = executor.execute(Job("j", GenerationRequest(
            mode="t2i", model="embedded", prompt=prompt, steps=1, width=64, height=64,
            num_frames=1, seed=1, guidance_scale=4.0)), lambda e: None, lambda: False)
        notes.append([n for n in done.notes if n.startswith("prompt:")])
    assert notes == [["prompt: this model does not know \u201ccat\u201d; read as an unknown word",
                      "prompt: 42 tokens, but this model reads the first 32; the words after "
                      "\u201cred red red\u201d change nothing"], []]


def test_flux_prompts_are_measured_against_its_t5_not_clip(tiny_models):
    """FLUX.1 reads a prompt through CLIP (77 tokens) and T5 (max_sequence_length, 512 by
    default): words past 77 still change the image, so only a prompt past T5's limit gets
    the note (it used to be said of every prompt past 77 tokens)."""
    from studio.engine.executor import runner_class

    entry = ModelRegistry(include_hf_cache=False).resolve(str(tiny_models["flux"]))
    runner = runner_class(entry.family)(entry, torch.device("cpu"), torch.float32)

    def notes(words: int) -> list[str]:
        request = GenerationRequest(mode="t2i", model=entry.model_id, prompt="red " * words,
                                    steps=1, width=64, height=64, num_frames=1, seed=1,
                                    guidance_scale=3.5)
        return [n for n in runner.prompt_notes(request) if "tokens, but" in n]

    assert notes(100) == []
    [note] = notes(600)
    assert "reads the first 512" in note
