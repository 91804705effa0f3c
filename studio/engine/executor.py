"""Runs one job to its end on the device this process owns.

:class:`JobExecutor` is what a worker (a thread, a child process, later a rank group) calls
for each job: it resolves the model, checks the request against the model's capabilities and
the input pixels against their content ids, keeps recently used models loaded, drives the
family runner and turns every outcome into exactly one terminal event.
"""

from __future__ import annotations

import gc
import itertools
import logging
import os
import platform
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable

import numpy as np
import torch

from studio.core.media import InputImageError, pixels_content_id
from studio.core.request import EngineEnvironment, GenerationRequest, RequestError
from studio.engine import events as ev
from studio.engine.job import Job
from studio.engine.memory import NotEnoughMemory
from studio.engine.models.folders import ModelError
from studio.engine.models.registry import ModelEntry, ModelRegistry
from studio.engine.parallel.config import ParallelConfigError
from studio.engine.pipelines.base import FamilyRunner, JobCancelled
from studio.paths import log_dir

log = logging.getLogger("studio.engine")


def runner_class(family: str) -> type[FamilyRunner]:
    """The runner for a family (imported lazily: diffusers is heavy)."""
    if family == "wan":
        from studio.engine.pipelines.wan import WanRunner

        return WanRunner
    if family == "wan-vace":
        from studio.engine.pipelines.wan import WanVaceRunner

        return WanVaceRunner
    if family == "flux":
        from studio.engine.pipelines.flux import FluxRunner

        return FluxRunner
    if family in ("sd", "sdxl", "sd3"):
        from studio.engine.pipelines.sd import StableDiffusionRunner

        return StableDiffusionRunner
    if family == "ltx":
        from studio.engine.pipelines.ltx import LTXRunner

        return LTXRunner
    if family == "ltx2":
        from studio.engine.pipelines.ltx2 import LTX2Runner

        return LTX2Runner
    if family == "qwen-image":
        from studio.engine.pipelines.qwen import QwenImageRunner

        return QwenImageRunner
    if family == "flux2":
        from studio.engine.pipelines.flux2 import Flux2Runner

        return Flux2Runner
    if family == "hidream":
        from studio.engine.pipelines.hidream import HiDreamRunner

        return HiDreamRunner
    raise ModelError(f"no runner for model family {family!r}")


def _quiet_libraries() -> None:
    """Routes diffusers' and transformers' chatter (progress bars, deprecation notes) to the
    log at ERROR level; called when an executor is built, never at import."""
    import warnings

    # torchao (imported by diffusers when installed) warns about optional CUDA extensions it
    # cannot load on this machine, and torch's pytree about torchao's enum registrations
    for name in ("torchao", "torch.utils._pytree"):
        logging.getLogger(name).setLevel(logging.ERROR)

    import diffusers
    import transformers

    diffusers.utils.logging.set_verbosity_error()
    diffusers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning, module="diffusers")


def other_runnable_threads(loadavg: str = "/proc/loadavg", samples: int = 3,
                           interval_s: float = 0.01) -> int:
    """Threads of other processes ready to run right now: the fewest over ``samples``
    readings of the kernel's runnable count (field 4 of ``/proc/loadavg``, "running/total"),
    less the reading thread itself. 0 where the file does not exist (not Linux)."""
    counts = []
    for i in range(samples):
        try:
            with open(loadavg) as fh:
                running = int(fh.read().split()[3].split("/")[0])
        except (OSError, ValueError, IndexError):
            return 0
        counts.append(max(0, running - 1))
        if i + 1 < samples:
            time.sleep(interval_s)
    return min(counts)


def cpu_threads_for_load(cores: int, others: int) -> int:
    """Intra-op threads for a CPU job: the ``cores`` that ``others`` runnable threads
    (:func:`other_runnable_threads`) leave free, at least 1. With every core taken, more
    threads than cores make torch's thread pool wait on its barriers behind the other
    process: a 64×64 image took 25 s instead of 0.4 s with 2 threads beside a 2-thread
    trainer on 2 cores (2026-12-05)."""
    return max(1, cores - others)


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def resolve_device(spec: str) -> torch.device:
    """``auto``, ``cpu``, ``cuda`` or ``cuda:N`` -> a device that exists on this machine.

    Raises:
        ValueError: an unknown name, or a GPU that is not there (the message names ``device``).
    """
    spec = (spec or "auto").strip().lower()
    if spec == "auto":
        return default_device()
    if spec == "cpu":
        return torch.device("cpu")
    if spec == "cuda" or spec.startswith("cuda:"):
        index = spec.partition(":")[2]
        if index and not (index.isascii() and index.isdigit()):
            raise ValueError(f"device={spec!r}: must be auto, cpu, cuda or cuda:N")
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"device={spec!r}: no CUDA GPU is available on this machine "
                             f"(use auto or cpu)")
        if index and int(index) >= count:
            raise ValueError(f"device={spec!r}: this machine has {count} GPU(s), "
                             f"cuda:0 to cuda:{count - 1}")
        return torch.device(spec)
    raise ValueError(f"device={spec!r}: must be auto, cpu, cuda or cuda:N")


def _on_device(module: torch.nn.Module, device: torch.device) -> bool:
    """Whether ``module``'s first parameter (or buffer) lies on ``device``'s kind of device."""
    tensor = next(itertools.chain(module.parameters(), module.buffers()), None)
    return tensor is not None and tensor.device.type == device.type


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class JobExecutor:
    """Executes jobs one at a time; keeps up to ``max_loaded`` models loaded (LRU), fewer
    when a newly needed model would not fit beside them (:meth:`_room_for`).

    Args:
        registry: where models are resolved.
        device: the device to run on (default: CUDA if present, else CPU).
        max_loaded: models kept loaded between jobs.
        memory_budget_bytes: the memory the engine may use on ``device`` (bytes); 0: what
            is free there now (:meth:`budget_bytes`).
    """

    def __init__(self, registry: ModelRegistry | None = None, device: torch.device | None = None,
                 max_loaded: int = 2, memory_budget_bytes: int = 0):
        self.registry = registry or ModelRegistry()
        self.device = device or default_device()
        self.dtype = torch.float32 if self.device.type == "cpu" else torch.bfloat16
        self.max_loaded = max_loaded
        self.memory_budget_bytes = int(memory_budget_bytes)
        self.loaded: OrderedDict[str, FamilyRunner] = OrderedDict()
        self.load_count = 0
        # called with each newly loaded runner (a rank applies its parallel plan here)
        self.on_runner_loaded: Callable[[FamilyRunner], None] | None = None
        # CPU only: before each job, use only the cores other processes leave free (set by
        # WorkerConfig under STUDIO_CPU_THREADS=auto: off by default, because the thread
        # count changes the last bit of the pixels and a repeat must match exactly)
        self.auto_cpu_threads = False
        # set by a rank group's worker; recorded in each job's environment
        self.parallel_plan = "single device"
        _quiet_libraries()

    # -- memory -----------------------------------------------------------------------------
    def budget_bytes(self, runner: FamilyRunner | None = None) -> int:
        """The memory the engine may use on its device: the configured budget, or (0 =
        automatic) what is free now plus what ``runner``'s own modules already hold there
        (its job reuses that memory; other loaded models' weights stay where they are, and
        weights offloaded to the CPU free nothing on the device)."""
        if self.memory_budget_bytes > 0:
            return self.memory_budget_bytes
        from studio.engine.memory import available_bytes, module_bytes

        held = 0
        if runner is not None:
            for m in runner.base.components.values():
                if isinstance(m, torch.nn.Module) and _on_device(m, self.device):
                    held += module_bytes(m)
        return available_bytes(self.device) + held

    def plan_memory(self, runner: FamilyRunner, request: GenerationRequest, after=None):
        """Chooses and applies the memory plan for a job (see studio.engine.memory); returns
        (the runner, the plan in force). The runner is a fresh load of the same model when
        the offload changes (:class:`~studio.engine.pipelines.base.MemoryPlanChange`).

        Small jobs (a generous bound under half the budget) skip the traced estimate.
        Raises:
            NotEnoughMemory: nothing fits the budget (the message gives the numbers).
        """
        from studio.engine.memory import MemoryPlan, choose_plan, quick_bound
        from studio.engine.pipelines.base import MemoryPlanChange

        budget = self.budget_bytes(runner)
        if after is None and quick_bound(runner, request) < budget // 2:
            plan = MemoryPlan("none", False, quick_bound(runner, request), budget)
        else:
            plan = choose_plan(runner.memory_estimate(request), budget, self.device.type,
                               after=after)
        try:
            return runner, runner.apply_memory_plan(plan)
        except MemoryPlanChange as exc:
            log.info("%s: loading %s again", exc, runner.entry.model_id)
            # offload starts from the CPU (a rank's parallel plan needs its device)
            runner = self.reload(runner, torch.device("cpu") if self.on_runner_loaded is None
                                 else None)
            return runner, runner.apply_memory_plan(plan)

    def reload(self, runner: FamilyRunner, load_device: torch.device | None = None
               ) -> FamilyRunner:
        """A fresh load of ``runner``'s model at its precision, in its place in
        :attr:`loaded`, its weights put on ``load_device`` (default: :meth:`load_device`);
        the old one's modules leave the device first (both never share it)."""
        key = next((k for k, r in self.loaded.items() if r is runner), None)
        entry, precision = getattr(runner, "load_args", (runner.entry, "as-loaded"))
        if key is not None:
            del self.loaded[key]
        try:
            runner.base.to("cpu")
        except Exception:  # offload hooks may refuse; the references go below anyway
            log.debug("moving the old pipeline off the device failed", exc_info=True)
        runner.base = None
        runner.pipes = {}
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        fresh, _ = self.runner_for(entry, precision, load_device)
        return fresh

    # -- environment ------------------------------------------------------------------------
    def environment(self) -> EngineEnvironment:
        """What of this process's environment affects pixels."""
        import diffusers
        import transformers

        from studio import __version__

        name = "cpu (%s)" % (platform.processor() or platform.machine())
        if self.device.type == "cuda":
            name = f"cuda:{self.device.index or 0} ({torch.cuda.get_device_name(self.device)})"
        return EngineEnvironment(
            device=name, dtype=str(self.dtype).removeprefix("torch."),
            torch_threads=torch.get_num_threads(),
            # plain str: torch.__version__ is a TorchVersion, and unpickling one in the
            # studio (events cross from the engine's process) would import torch there
            versions={"torch": str(torch.__version__), "diffusers": str(diffusers.__version__),
                      "transformers": str(transformers.__version__), "studio": __version__,
                      "python": platform.python_version()},
            deterministic=self.device.type == "cpu", parallel=self.parallel_plan)

    # -- models -----------------------------------------------------------------------------
    def _room_for(self, entry: ModelEntry) -> bool:
        """Whether ``entry``'s weights fit beside the models loaded now. Under a fixed budget
        (``memory_budget_bytes`` > 0): the loaded models' and ``entry``'s file sizes together
        within it. Under the automatic budget (0): the device's free memory now
        (:func:`studio.engine.memory.available_bytes`, which the loaded models' weights
        already take from) at least twice ``entry``'s file size: a 16-bit file loaded at
        float32 (the CPU's dtype) takes twice its size, and on CUDA the second half is room
        for its activations. :meth:`runner_for` unloads the least recently used models until
        this holds or none is left."""
        if self.memory_budget_bytes > 0:
            held = sum(r.entry.size_bytes for r in self.loaded.values())
            return held + entry.size_bytes <= self.memory_budget_bytes
        from studio.engine.memory import available_bytes

        return 2 * entry.size_bytes <= available_bytes(self.device)

    def load_device(self, entry: ModelEntry) -> torch.device:
        """Where a new load of ``entry`` puts its weights: the engine's device, or the CPU
        for a model that does not fit on its GPU (:meth:`_room_for`, after the unloading in
        :meth:`runner_for`). From the CPU the first job's memory plan moves the weights to
        the GPU whole if the job fits after all, or sets up diffusers' CPU offload; loaded
        straight onto the GPU, such a model ran out of memory before any plan was made.
        A rank of a multi-GPU group (``on_runner_loaded`` set) always loads on its device:
        its parallel plan is applied at load and shards the modules where they lie."""
        if self.device.type == "cpu" or self.on_runner_loaded is not None \
                or self._room_for(entry):
            return self.device
        log.info("%s: %.1f GB of weights do not fit on %s beside the loaded models; loading "
                 "them on the CPU for the memory plan", entry.model_id, entry.size_bytes / 1e9,
                 self.device)
        return torch.device("cpu")

    def runner_for(self, entry: ModelEntry, precision: str = "as-loaded",
                   load_device: torch.device | None = None) -> tuple[FamilyRunner, float]:
        """The loaded runner for ``entry`` at ``precision`` (loading it and transforming its
        denoiser weights if needed, see studio.engine.precision) and the load time in s.
        A new load puts the weights on ``load_device`` (default: :meth:`load_device`)."""
        key = entry.load_key if precision == "as-loaded" else f"{entry.load_key}|{precision}"
        if key in self.loaded:
            self.loaded.move_to_end(key)
            return self.loaded[key], 0.0
        while self.loaded and (len(self.loaded) >= self.max_loaded or not self._room_for(entry)):
            evicted, _ = self.loaded.popitem(last=False)
            log.info("unloading %s to make room for %s", evicted, entry.model_id)
            gc.collect()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        t0 = time.perf_counter()
        runner = runner_class(entry.family)(entry, self.device, self.dtype,
                                            load_device or self.load_device(entry))
        runner.precision_notes = []
        if precision != "as-loaded":
            from studio.engine.precision import apply_precision

            for module in runner.denoisers():
                note = apply_precision(module, precision, self.device)
            runner.precision_notes = [note]
        runner.load_args = (entry, precision)  # for reload()
        runner.load_s = time.perf_counter() - t0
        if self.on_runner_loaded is not None:
            self.on_runner_loaded(runner)
        self.load_count += 1
        self.loaded[key] = runner
        return runner, time.perf_counter() - t0

    # -- jobs -------------------------------------------------------------------------------
    def prepare(self, job: Job) -> tuple[GenerationRequest, ModelEntry]:
        """Resolves the model and checks the request and its inputs (no model work).

        Raises:
            ModelError, RequestError, InputImageError.
        """
        request = job.request
        entry = self.registry.resolve(request.model)
        request.check(entry.capabilities)
        model_hash = self.registry.content_hash(entry)
        if request.model_hash and request.model_hash != model_hash:
            raise ModelError(f"model_hash: the request was made with weights {request.model_hash}"
                             f" but {entry.model_id} now has {model_hash}")
        for name, ref in request.media_refs():
            pixels = job.inputs.get(ref.content_id)
            if pixels is None:
                raise InputImageError(f"{name}: the pixels of input {ref.content_id} were not "
                                      f"given")
            if pixels_content_id(pixels) != ref.content_id:
                raise InputImageError(f"{name}: the image given does not match the content id "
                                      f"{ref.content_id} recorded in the request (a different "
                                      f"file?)")
        if not request.model_hash:
            request = request.replace(model_hash=model_hash)
        return request, entry

    def execute(self, job: Job, emit: Callable[[ev.JobEvent], None],
                is_cancelled: Callable[[], bool]) -> ev.JobEvent:
        """Runs ``job``; emits Started and Progress, and returns (and emits) the terminal event.
        Never raises for a job's failure."""
        jid = job.job_id
        t_start = time.perf_counter()
        emit(ev.Started(jid))
        step_seen = 0
        peak = _rss_bytes()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        try:
            if is_cancelled():
                raise JobCancelled(0)
            busy_note = ""
            if self.device.type == "cpu":
                others = other_runnable_threads(samples=2, interval_s=0.005)
                cores = os.cpu_count() or 1
                if self.auto_cpu_threads:
                    torch.set_num_threads(cpu_threads_for_load(cores, others))
                elif others >= cores and torch.get_num_threads() > 1:
                    busy_note = (f"the CPU is busy ({others} threads of other programs ready "
                                 f"to run on {cores} cores): this job may run many times "
                                 f"slower; STUDIO_CPU_THREADS=auto runs jobs on the free "
                                 f"cores instead, at the cost of pixel-exact repeats (the "
                                 f"thread count changes the last bit)")
            request, entry = self.prepare(job)
            from studio.engine.profiles import levers_for

            levers = levers_for(request.optimization.profile, self.device, entry.tuning,
                                request.steps, request.is_video)
            runner, load_s = self.runner_for(entry, levers.precision)
            t_denoise = [0.0]

            def on_step(step: int, total: int, latents: torch.Tensor) -> None:
                nonlocal step_seen, peak
                step_seen = step
                now = time.perf_counter()
                if step == 1:
                    t_denoise[0] = now
                peak = max(peak, _rss_bytes())
                preview = None
                if runner.preview is not None and latents is not None:
                    preview = runner.preview(latents)
                # from the second step on (the first one's time includes the set-up)
                eta = (now - t_denoise[0]) / (step - 1) * max(total - step, 0) \
                    if step > 1 else ev.ETA_UNKNOWN
                emit(ev.Progress(jid, step, total, now - t_start, eta, preview))
                if is_cancelled():
                    raise JobCancelled(step)

            loaded = runner
            runner, plan = self.plan_memory(runner, request)
            if runner is not loaded:  # loaded again for another offload: that load counts
                load_s += getattr(runner, "load_s", 0.0)
            try:
                with torch.inference_mode():
                    out = runner.run(request, job.inputs, on_step)
            except torch.OutOfMemoryError as exc:  # retry once with the next plan down
                log.warning("job %s: out of memory under %s; retrying (%s)", jid,
                            plan.describe(), str(exc)[:120])
                gc.collect()
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()
                loaded = runner
                runner, plan = self.plan_memory(runner, request, after=plan)
                if runner is not loaded:
                    load_s += getattr(runner, "load_s", 0.0)
                with torch.inference_mode():
                    out = runner.run(request, job.inputs, on_step)
                out.notes.append("retried after running out of memory")
            if plan.offload != "none" or plan.vae_tiling:
                out.notes.append(plan.describe())
            try:
                out.notes.extend(runner.prompt_notes(request))
            except Exception:  # a note must never fail a job
                log.exception("job %s: checking the prompt's length failed", jid)
            out.notes.extend(getattr(runner, "precision_notes", []))
            if busy_note:
                out.notes.append(busy_note)
            frames = (np.clip(out.frames, 0.0, 1.0) * 255).round().astype(np.uint8)
            peak = max(peak, _rss_bytes())
            if self.device.type == "cuda":
                peak = int(torch.cuda.max_memory_allocated(self.device))
            timings = {"load": load_s, **out.timings, "total": time.perf_counter() - t_start}
            result: ev.JobEvent = ev.Finished(
                jid, frames=frames, fps=float(request.fps), request_json=request.to_json(),
                environment=self.environment().to_dict(), timings=timings,
                peak_memory_bytes=int(peak), notes=tuple(out.notes))
        except JobCancelled as exc:
            result = ev.Cancelled(jid, during_step=exc.step or step_seen)
        except (RequestError, InputImageError) as exc:
            result = ev.Failed(jid, ev.BAD_INPUT, str(exc))
        except ModelError as exc:
            result = ev.Failed(jid, ev.MODEL_ERROR, str(exc))
        except NotEnoughMemory as exc:
            result = ev.Failed(jid, ev.OUT_OF_MEMORY, str(exc))
        except ParallelConfigError as exc:  # the model does not take the group's plan
            result = ev.Failed(jid, ev.BAD_INPUT, f"multi-GPU plan: {exc}")
        except torch.OutOfMemoryError as exc:
            result = ev.Failed(jid, ev.OUT_OF_MEMORY, f"out of memory: {str(exc)[:200]}")
        except Exception as exc:  # a bug: keep the worker alive, report it, keep the trace
            path = log_dir() / "engine.log"
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(f"--- job {jid} {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
                         f"{job.request.to_json()}\n{traceback.format_exc()}\n")
            log.error("job %s failed: %s: %s (traceback in %s)", jid, type(exc).__name__,
                      str(exc)[:200], path)
            result = ev.Failed(jid, ev.INTERNAL,
                               f"internal error: {type(exc).__name__}: {str(exc)[:200]} "
                               f"(details in {path})", str(path))
        emit(result)
        return result
