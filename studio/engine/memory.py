"""Memory manager: estimate a job's peak memory per stage and pick the fastest plan that fits.

Estimate (:func:`trace_peak`, :class:`MemoryEstimate`): weights are counted from the loaded
modules (parameters and buffers, per component, plus the largest transformer block and the
largest single layer, which bound group and sequential offload). Activations are measured by
running the *real* forward of each stage (text encoder, denoiser call, VAE decode, and the
decode again with tiling) under PyTorch's ``FakeTensorMode`` at the job's resolution and frame
count: no compute, no memory, a fraction of a second, yet every intermediate tensor diffusers
creates is seen, so the peak of live activation bytes is that of the real run (the trace
tracks each storage's lifetime through weak references). Any family works unchanged, since the
trace runs the family's own code. After an offloaded job, a new size's trace runs through the
offload hooks: their moves of the weights are not counted (the plans count weights by
themselves), and the weights are put back as they were (:func:`weights_kept`); a move under
``FakeTensorMode`` would otherwise leave fake tensors in the model. diffusers' group offload
assigns ``param.data`` in place, which a fake tensor cannot take: that trace fails, and the
stage's activations are guessed from its input size (the job's notes say so).

Plans, fastest first (diffusers' own offloading is applied, see :func:`apply_plan`):

=============  =========================================================================
``none``       every component on the device
``model``      one component on the device at a time (``enable_model_cpu_offload``)
``group``      one transformer block group at a time, next one prefetched
               (``enable_group_offload``, block level)
``sequential`` one layer at a time (``enable_sequential_cpu_offload``)
=============  =========================================================================

each without, then with, VAE tiling. :func:`choose_plan` returns the first whose estimated
peak fits the budget, or raises :class:`NotEnoughMemory` with the numbers.

Source: the plan ladder is diffusers' memory guide ("Reduce memory usage"); estimating peak
memory by tracing with fake tensors follows PyTorch's ``FakeTensorMode`` design (as used by
``torch.utils.flop_counter`` and torch.compile's memory planning).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

log = logging.getLogger(__name__)

OFFLOADS = ("none", "model", "group", "sequential")
STAGES = ("text_encode", "denoise", "decode")
MiB = 2**20


class NotEnoughMemory(ValueError):
    """No plan fits the budget. ``needed`` is the smallest plan's estimated peak in bytes."""

    def __init__(self, needed: int, available: int, detail: str = ""):
        self.needed, self.available = needed, available
        super().__init__(
            f"memory: this job needs about {needed / MiB:,.0f} MiB even with sequential "
            f"offload and VAE tiling, but the budget is {available / MiB:,.0f} MiB"
            f"{'; ' + detail if detail else ''}. Lower the resolution or frame count, or "
            f"raise the memory budget")


# -- tracing ------------------------------------------------------------------------------
class LiveBytes(TorchDispatchMode):
    """Tracks the bytes of tensor storages alive while it is active; ``peak`` is the most.

    Counts each storage once (views share it), from the op that created it until the last
    Python tensor on it is collected. Works on real and on fake tensors alike.

    Weights are not activations: tensors on the storage of one of ``weights`` (the modules'
    parameters and buffers: their views, such as a linear layer's transposed weight) are
    not counted. In a fake-tensor trace (``fake_trace``, as :func:`trace_peak` runs it), a
    copy of a weight to another device at the same dtype (an offload hook's move, onto the
    device or back), or of such a copy, is not counted either; a weight there is also any
    real (not fake) tensor: in a trace every activation is fake, so the real tensors an op
    meets are weights, e.g. an offload hook's CPU copies of them (accelerate's
    ``weights_map``). The memory plans count weights by themselves
    (:meth:`MemoryEstimate.peak`).
    """

    def __init__(self, weights: Iterable[torch.Tensor] = (), fake_trace: bool = False):
        super().__init__()
        self.live = 0
        self.peak = 0
        self._storages: dict[int, list[int]] = {}
        self._trace = fake_trace
        self._weights = {w.untyped_storage()._cdata for w in weights}
        self._moved: list[torch.Tensor] = []

    def _release(self, key: int) -> None:
        entry = self._storages.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            self.live -= entry[0]
            del self._storages[key]

    def _is_weight(self, t) -> bool:
        return isinstance(t, torch.Tensor) and (not isinstance(t, FakeTensor)
                                                or t.untyped_storage()._cdata in self._weights)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self._trace and func is torch.ops.aten._to_copy.default and args \
                and self._is_weight(args[0]) \
                and isinstance(out, torch.Tensor) and out.dtype == args[0].dtype:
            self._weights.add(out.untyped_storage()._cdata)  # a weight moved, not computed
            self._moved.append(out)  # held: a freed storage's key could name a new one
            return out
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key = storage._cdata
            if key in self._weights:  # a view or alias of a weight (or of its move)
                continue
            entry = self._storages.get(key)
            if entry is None:
                self._storages[key] = [storage.nbytes(), 1]
                self.live += storage.nbytes()
                self.peak = max(self.peak, self.live)
            else:
                entry[1] += 1
            weakref.finalize(t, self._release, key)
        return out


def trace_peak(fn: Callable, *inputs: torch.Tensor, modules: Iterable[torch.nn.Module] = (),
               **kw_inputs) -> int:
    """Peak live activation bytes of ``fn(*inputs, **kw_inputs)`` without computing it.

    Tensor inputs are replaced by fake tensors of the same shape, dtype and device; module
    weights stay as they are (not counted, nor their moves by offload hooks: see
    :class:`LiveBytes`). Non-tensor arguments pass through. The weights of ``modules`` (and
    their submodules) are put back as they were afterwards (:func:`weights_kept`): an
    offload hook that runs inside the trace moves them, and a move under ``FakeTensorMode``
    would leave fake tensors in the model.

    Raises:
        RuntimeError: the function cannot run on fake tensors (e.g. it reads a tensor's
            values); the caller falls back to another estimate.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)

    def fake(x):
        return mode.from_tensor(x) if isinstance(x, torch.Tensor) else x

    args = [fake(x) for x in inputs]
    kwargs = {k: fake(v) for k, v in kw_inputs.items()}
    try:
        with weights_kept(modules) as weights, torch.no_grad():
            # the fake stand-ins the mode will use for the weights (it keeps one per real
            # tensor and storage): their views, e.g. a linear layer's transposed weight, are
            # weights too
            stand_ins = [mode.from_tensor(w) for w in weights]  # held: the mode's memo is weak
            with mode, LiveBytes([*weights, *stand_ins], fake_trace=True) as tracker:
                fn(*args, **kwargs)
    except Exception as exc:  # data-dependent ops and the like: report, do not crash
        raise RuntimeError(f"cannot trace on fake tensors: {type(exc).__name__}: "
                           f"{str(exc)[:200]}") from exc
    return tracker.peak


@contextmanager
def weights_kept(modules: Iterable[torch.nn.Module]) -> Iterator[list[torch.Tensor]]:
    """Puts every parameter and buffer of ``modules`` and their submodules back on exit, the
    same tensor objects holding the same data, whatever ran inside (an offload hook's
    ``param.data = param.data.to(device)``, or accelerate's replacing of parameters); yields
    the parameters and buffers it saved.

    Why: an offload hook that runs inside a ``FakeTensorMode`` trace moves the weights there,
    which leaves fake tensors in the model, and the next real run fails (or the weights
    stay on the device the plan moved them off)."""
    saved = []
    seen: set[int] = set()
    for module in modules:
        for sub in module.modules():
            if id(sub) in seen:
                continue
            seen.add(id(sub))
            for store in (sub._parameters, sub._buffers):
                for name, tensor in store.items():
                    if tensor is not None:
                        saved.append((store, name, tensor, tensor.data))
    try:
        yield [tensor for _store, _name, tensor, _data in saved]
    finally:
        for store, name, tensor, data in saved:
            store[name] = tensor
            tensor.data = data


def module_bytes(module: torch.nn.Module | None) -> int:
    """Bytes of a module's parameters and buffers (0 for None)."""
    if module is None:
        return 0
    seen: set[int] = set()
    return sum(_tensor_bytes(t, seen) for t in list(module.parameters()) + list(module.buffers()))


def _tensor_bytes(t: torch.Tensor, seen: set[int]) -> int:
    """Storage bytes of a tensor, counting shared storages once; a tensor subclass (e.g. a
    torchao quantized weight) is the sum of the inner tensors it is made of."""
    data = t.data if isinstance(t, torch.nn.Parameter) else t
    if type(data) is not torch.Tensor and hasattr(data, "__tensor_flatten__"):
        names, _ = data.__tensor_flatten__()
        return sum(_tensor_bytes(getattr(data, n), seen) for n in names)
    key = data.untyped_storage()._cdata
    if key in seen:
        return 0
    seen.add(key)
    return data.untyped_storage().nbytes()


def largest_block_bytes(module: torch.nn.Module | None) -> int:
    """Bytes of the largest transformer block / down-up block of a denoiser, or of its
    largest direct child for other modules (the unit of block-level group offload)."""
    if module is None:
        return 0
    from studio.engine.caching.step_cache import BLOCK_LIST_NAMES

    blocks = [b for name in (*BLOCK_LIST_NAMES, "down_blocks", "up_blocks")
              for b in (getattr(module, name, None) or []) if isinstance(b, torch.nn.Module)]
    candidates = blocks or list(module.children())
    return max((module_bytes(b) for b in candidates), default=module_bytes(module))


def largest_layer_bytes(module: torch.nn.Module | None) -> int:
    """Bytes of the module's largest leaf layer (the unit of sequential offload)."""
    if module is None:
        return 0
    leaves = [m for m in module.modules() if not list(m.children())]
    return max((module_bytes(m) for m in leaves), default=module_bytes(module))


# -- estimate and plans -------------------------------------------------------------------
@dataclass(frozen=True)
class MemoryEstimate:
    """A job's memory needs, in bytes.

    Attributes:
        weights: per stage, the weights of the component(s) it runs (``text_encode``: the
            text encoder(s); ``denoise``: the transformer(s); ``decode``: the VAE).
        activations: per stage, the peak of live activations of one call of the stage.
        decode_tiled: the VAE decode's activation peak with tiling on.
        largest_block: per stage, the largest block of its component(s) (group offload).
        largest_layer: per stage, the largest single layer (sequential offload).
        resident: bytes that stay regardless of plan (latents, embeddings, outputs).
        notes: how each figure was obtained (trace, or why a fallback was used).
    """

    weights: dict[str, int]
    activations: dict[str, int]
    decode_tiled: int
    largest_block: dict[str, int]
    largest_layer: dict[str, int]
    resident: int = 0
    notes: tuple[str, ...] = field(default=())

    def peak(self, offload: str, vae_tiling: bool) -> int:
        """Estimated peak device bytes of the job under a plan."""
        if offload not in OFFLOADS:
            raise ValueError(f"offload: {offload!r} is not one of {', '.join(OFFLOADS)}")
        act = dict(self.activations)
        if vae_tiling:
            act["decode"] = min(act.get("decode", 0), self.decode_tiled)
        if offload == "none":
            return sum(self.weights.values()) + max(act.values(), default=0) + self.resident
        unit = {"model": self.weights, "group": {k: 2 * v for k, v in
                                                  self.largest_block.items()},
                "sequential": self.largest_layer}[offload]
        return max(unit.get(s, 0) + act.get(s, 0) for s in STAGES) + self.resident


@dataclass(frozen=True)
class MemoryPlan:
    """The chosen plan: ``offload`` (one of OFFLOADS), ``vae_tiling``, and the numbers."""

    offload: str
    vae_tiling: bool
    peak_bytes: int
    budget_bytes: int

    def describe(self) -> str:
        offload = {"none": "all on device", "model": "model CPU offload",
                   "group": "group offload", "sequential": "sequential offload"}[self.offload]
        tiling = ", VAE tiling" if self.vae_tiling else ""
        return (f"memory plan: {offload}{tiling} (estimated peak {self.peak_bytes / MiB:,.0f} "
                f"MiB of {self.budget_bytes / MiB:,.0f} MiB)")


def plan_ladder(device_type: str) -> list[tuple[str, bool]]:
    """(offload, vae_tiling) pairs, fastest first. Offloading to the CPU only helps when the
    device is not the CPU."""
    offloads = OFFLOADS if device_type != "cpu" else ("none",)
    return [(o, t) for o in offloads for t in (False, True)]


def choose_plan(estimate: MemoryEstimate, budget_bytes: int, device_type: str = "cuda",
                after: MemoryPlan | None = None) -> MemoryPlan:
    """The fastest plan whose estimated peak fits ``budget_bytes``.

    Args:
        after: a plan that already failed (out of memory): only slower plans are considered.

    Raises:
        ValueError: a non-positive budget.
        NotEnoughMemory: no plan fits (gives the smallest plan's peak and the budget).
    """
    if budget_bytes <= 0:
        raise ValueError(f"budget_bytes: {budget_bytes} must be positive")
    ladder = plan_ladder(device_type)
    if after is not None:
        ladder = ladder[ladder.index((after.offload, after.vae_tiling)) + 1:]
    for offload, tiling in ladder:
        peak = estimate.peak(offload, tiling)
        if peak <= budget_bytes:
            return MemoryPlan(offload, tiling, peak, budget_bytes)
    smallest = min((estimate.peak(o, t) for o, t in plan_ladder(device_type)), default=0)
    raise NotEnoughMemory(smallest, budget_bytes,
                          "a slower plan was already tried" if after is not None else "")


def set_vae_tiling(pipe, on: bool) -> None:
    """Turns the pipeline's VAE tiling on or off (no-op for a VAE without it)."""
    vae = getattr(pipe, "vae", None)
    if vae is not None:
        if on and hasattr(vae, "enable_tiling"):
            vae.enable_tiling()
        elif hasattr(vae, "disable_tiling"):
            vae.disable_tiling()


def apply_plan(pipe, plan: MemoryPlan, device: torch.device) -> None:
    """Puts a freshly loaded diffusers pipeline in ``plan``'s state (diffusers' own offload
    hooks). Once offloading, only the tiling may change (:func:`set_vae_tiling`): enabling an
    offload again stacks its hooks.

    Group offload runs without CUDA streams: with them diffusers' lazy-prefetch hook removes
    itself from the middle of the denoiser's hook stack at the first call, which unwires the
    step cache and attention hooks put on after the plan (a correct but slower choice)."""
    set_vae_tiling(pipe, plan.vae_tiling)
    if plan.offload == "none":
        pipe.to(device)
    elif plan.offload == "model":
        pipe.enable_model_cpu_offload(device=device)
    elif plan.offload == "group":
        pipe.enable_group_offload(onload_device=device, offload_device=torch.device("cpu"),
                                  offload_type="block_level", num_blocks_per_group=1,
                                  use_stream=False)
    else:
        pipe.enable_sequential_cpu_offload(device=device)


def available_bytes(device: torch.device) -> int:
    """Memory the device has free now: CUDA free memory, or the system's available RAM."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os

    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def quick_bound(runner, request) -> int:
    """A generous upper bound of a job's peak bytes with everything on the device, from
    sizes alone (no tracing): three times the weights, plus 16 KiB per output pixel per
    frame for the VAE decode, plus 64 KiB per latent token for the denoiser. Used to skip the
    traced estimate for jobs far below the budget."""
    weights = sum(module_bytes(m) for m in runner.base.components.values()
                  if isinstance(m, torch.nn.Module))
    frames = 1 if request.mode in ("t2i", "i2i") else request.num_frames
    pixels = frames * request.width * request.height
    tokens = pixels // 64  # >= tokens of any family (8x8 pixels per token at least)
    return 3 * weights + 16 * 1024 * pixels + 64 * 1024 * tokens
