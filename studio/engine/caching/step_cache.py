"""Forecast step cache: skip denoiser work on steps where little new is happening, and
forecast what it would have produced.

Three decision signals (``StepCacheConfig.signal``):

* ``"output"`` (what the embedded model's calibration picks, bench/results/*-calibrate.json):
  whole denoiser calls are skipped and their output forecast linearly in the timestep from
  the last full calls; the decision reads the forecast's own estimated error, so a skipped
  call costs nothing (:class:`_OutputForecastHook`).
* ``"block"`` and ``"input"``: the first block decides, the deep blocks are skipped and
  their residual forecast, as below.

How one denoiser call goes on the block signals, for a transformer with blocks B0..Bn (in
execution order):

1. B0 (the *probe*) always runs. Its residual ``r0 = B0(x) - x`` is compared with the
   residual *forecast* for this timestep from the last full steps (:mod:`.forecast`). The
   relative L1 error ``|r0 - r0_hat| / |r0|`` is added to an error budget accumulated since
   the last full step.
2. If the accumulated error stays under the threshold (and the step is not among the first
   ``warmup_steps`` full steps, nor past ``max_consecutive_skips``), B1..Bn are skipped: the
   probe's output plus the forecast of the deep residual ``B1..Bn(B0(x)) - B0(x)`` is
   returned, and the skipped blocks pass their inputs through untouched (no compute).
3. Otherwise B1..Bn run, and the step's (timestep, r0, deep residual) is recorded.

Both the text stream (``encoder_hidden_states``) and the image stream are forecast for
dual-stream blocks (Flux, SD3, Qwen-Image). Forecasting in the actual timestep (divided
differences) handles shifted schedules; the decision signal is the probe's own *forecast*
error, so a smooth drift that the forecast follows does not force recomputation, which
plain residual-change thresholds (First Block Cache, TeaCache) cannot tell apart from a real
change.

State is kept per cache context: diffusers pipelines wrap the conditional and unconditional
calls in ``transformer.cache_context("cond" / "uncond")``, so the two CFG branches never see
each other's features; a call made outside any context uses one of its own. Items of a batch
keep their own features (all state tensors carry the batch dimension); the skip decision is
taken for the whole batch (the largest item error decides). State is cleared by
:func:`reset_step_cache` before each job, and also whenever a context's timestep does not
decrease (a new trajectory), so nothing leaks between jobs.

Sources: First Block Cache (ParaAttention, chengzeyi) for the probe-block design; TeaCache
(Liu et al., "Timestep Embedding Tells: It's Time to Cache for Video Diffusion Model", CVPR
2025) for accumulating the relative change since the last full step; TaylorSeer (Liu et al.,
ICCV 2025) for forecasting features instead of reusing them.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field

import torch
from diffusers.hooks import HookRegistry, ModelHook
from diffusers.hooks._helpers import TransformerBlockMetadata, TransformerBlockRegistry
from diffusers.hooks.hooks import BaseState, CacheContext, StateManager

from studio.engine.hooks import register_inside, remove_hook

_ROOT_HOOK = "studio_step_cache_root"
_PROBE_HOOK = "studio_step_cache_probe"
_BLOCK_HOOK = "studio_step_cache_block"
_DEFAULT_CONTEXT = "studio-default"
SIGNALS = ("block", "input", "output")
BLOCK_LIST_NAMES = ("transformer_blocks", "single_transformer_blocks", "double_stream_blocks",
                    "single_stream_blocks", "blocks", "layers")


@dataclass(frozen=True)
class StepCacheConfig:
    """Settings of the forecast step cache.

    Attributes:
        threshold: error budget: the sum, over the steps since the last full step, of the
            probe block's relative L1 forecast error; a step is skipped while the sum stays
            at or below it. 0 never skips (exact). Typical 0.05-0.4.
        order: forecast order (0 reuse, 1 linear, 2 quadratic) in the timestep.
        warmup_steps: full steps computed at the start of each trajectory before any skip
            (at least ``order + 1`` are needed for a full-order forecast).
        max_consecutive_skips: a full step is forced after this many skips in a row.
        signal: what the skip decision reads. ``"block"``: the first block runs on every
            call and its residual's forecast error is the signal (the first block is
            recomputed even on skipped calls). ``"input"``: the first block's
            timestep-modulated input (TeaCache's signal: ``norm1(x) * (1 + scale) + shift``
            for Wan-style and AdaLayerNormZero blocks, the raw input otherwise), whose
            relative L1 change from the previous call is accumulated; a skipped call then
            runs no block at all, and the first block's residual is forecast as well.
            ``"output"``: the whole denoiser call is skipped and its *output* forecast (see
            :class:`_OutputForecastHook`); the signal is the forecast's own estimated error,
            from the last full outputs alone, so deciding costs nothing. Its threshold is on
            another scale (typical 0.0005-0.02).
        linear_below: signal ``"output"``: a skipped call is forecast at ``order`` only once
            its timestep is below this fraction of the trajectory's first timestep, and
            reused as it is (order 0) before that. 1.0: ``order`` throughout. Why: early in
            the trajectory the output's trend does not go on (on the embedded model, 8
            skipped steps right after the warm-up of a 50-step run cost a mean SSIM of 0.16
            when extrapolated linearly and 0.001 when reused), while late in it the linear
            forecast is the better one.
        schedule: signal ``"output"``: the calls of a trajectory computed in full whatever
            the signal says (indices from 0, counted per cache context: one call per
            denoising step and CFG branch); the calls in between are skipped while the
            error budget holds, so a high ``threshold`` makes the schedule static and a low
            one adds full calls where a prompt needs them. Empty: the signal alone decides
            (after the warm-up). A calibrated schedule (dense at the start, where the layout
            is decided, and at the end, sparse between) kept more of the picture than the
            signal alone at the same work on the embedded model (``python -m bench
            calibrate --schedules``); studio.json stores it for the schedule length it was
            calibrated at and :func:`studio.engine.profiles.tuning_for_steps` stretches it
            to a job's length. Sources: static caching schedules such as FORA (Selvaraju et
            al., 2024) and Learning-to-Cache (Ma et al., NeurIPS 2024) decide offline which
            steps to recompute; the sampling-schedule search of Align Your Steps (Sabour et
            al., ICML 2024) places few steps where the output changes most.

    Raises:
        ValueError: (at construction) a field out of range, naming it.
    """

    threshold: float = 0.1
    order: int = 1
    warmup_steps: int = 2
    max_consecutive_skips: int = 3
    signal: str = "block"
    linear_below: float = 1.0
    schedule: tuple[int, ...] = ()

    def describe(self) -> str:
        """One line naming every setting, e.g. ``output signal, threshold 0.002, order 1,
        ≤6 skips, warm-up 5`` (plus the schedule and the reuse phase where set)."""
        text = (f"{self.signal} signal, threshold {self.threshold:g}, order {self.order}, "
                f"≤{self.max_consecutive_skips} skips, warm-up {self.warmup_steps}")
        if self.schedule:
            text += f", full calls {list(self.schedule)}"
        if self.linear_below < 1.0:
            text += f", reuse above {self.linear_below:g} of the first timestep"
        return text

    def __post_init__(self):
        if self.signal not in SIGNALS:
            raise ValueError(f"signal: {self.signal!r} is not one of {', '.join(SIGNALS)}")
        if not (0.0 <= self.threshold <= 10.0):
            raise ValueError(f"threshold: {self.threshold} is outside 0..10")
        if self.order not in (0, 1, 2):
            raise ValueError(f"order: {self.order} is not one of 0, 1, 2")
        if not (0 <= self.warmup_steps <= 1000):
            raise ValueError(f"warmup_steps: {self.warmup_steps} is outside 0..1000")
        object.__setattr__(self, "schedule", tuple(self.schedule))
        if any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i <= 100_000
               for i in self.schedule):
            raise ValueError(f"schedule: {list(self.schedule)} must be call indices in "
                             f"0..100000")
        if not (0.0 <= self.linear_below <= 1.0):
            raise ValueError(f"linear_below: {self.linear_below} is outside 0..1")
        if self.signal != "output" and (self.schedule or self.linear_below < 1.0):
            raise ValueError(f"schedule, linear_below: only the output signal takes them "
                             f"(signal is {self.signal!r})")
        if not (0 <= self.max_consecutive_skips <= 1000):
            raise ValueError(f"max_consecutive_skips: {self.max_consecutive_skips} is outside "
                             f"0..1000")


@dataclass
class StepCacheStats:
    """What the cache did: denoiser calls made in full and with the deep blocks skipped.

    ``decisions`` lists, per call, (context name, timestep, accumulated error, computed?)."""

    full_calls: int = 0
    skipped_calls: int = 0
    decisions: list[tuple[str, float, float, bool]] = field(default_factory=list)

    @property
    def calls(self) -> int:
        return self.full_calls + self.skipped_calls

    @property
    def compute_fraction(self) -> float:
        """Share of the denoiser's deep-block work actually computed (1.0 = no saving)."""
        return self.full_calls / self.calls if self.calls else 1.0


class _TrajectoryState(BaseState):
    """One cache context's history (one CFG branch of one job)."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.times: list[float] = []
        self.probe_residuals: list[torch.Tensor] = []
        # per full step: per segment, (hidden_states residual, encoder residual or None)
        self.deep_residuals: list[dict[int, tuple[torch.Tensor, torch.Tensor | None]]] = []
        self.segment_inputs: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}
        self.step_residuals: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}
        self.full_steps = 0  # full steps recorded in this trajectory (the history keeps
        # only the last order + 1 of them)
        self.timestep: float | None = None
        self.last_timestep: float | None = None
        self.accumulated = 0.0
        self.consecutive_skips = 0
        self.compute = True
        self.probed = False  # whether the probe block ran in the current call
        self.probe_output: tuple[torch.Tensor, torch.Tensor | None] | None = None
        self.probe_residual: torch.Tensor | None = None
        # signal "input": the first block's encoder-stream residuals per full step, the
        # current one, and the previous call's modulated input
        self.probe_encoder_residuals: list[torch.Tensor | None] = []
        self.probe_encoder_residual: torch.Tensor | None = None
        self.previous_signal: torch.Tensor | None = None


def _metadata(block: torch.nn.Module) -> TransformerBlockMetadata:
    try:
        meta = TransformerBlockRegistry.get(type(block))
    except ValueError:
        meta = None
    if meta is None:
        # a block unknown to diffusers' registry: returns hidden_states alone, or a second
        # stream it also takes: (hidden_states, encoder_hidden_states) for joint text-image
        # blocks, (hidden_states, audio_hidden_states) for LTX-2's audio-video blocks
        params = list(inspect.signature(type(block).forward).parameters)[1:]
        second = ("audio_hidden_states" if "audio_hidden_states" in params
                  else "encoder_hidden_states")
        meta = TransformerBlockMetadata(
            return_hidden_states_index=0,
            return_encoder_hidden_states_index=None,
            encoder_hidden_states_argument_name=second,
        )
        meta._cls = type(block)
        meta._takes_encoder = second in params  # type: ignore[attr-defined]
    return meta


def _learn_format(meta: TransformerBlockMetadata, output) -> None:
    """A block unknown to diffusers' registry that returned (hidden, second stream) on a full
    step (HiDream's double-stream blocks, LTX-2's video+audio blocks): from now on its
    passthrough returns that pair too."""
    if getattr(meta, "_takes_encoder", None) and isinstance(output, tuple) and \
            len(output) == 2 and meta.return_encoder_hidden_states_index is None:
        meta.return_encoder_hidden_states_index = 1


def _split(output, meta: TransformerBlockMetadata):
    """A block output -> (hidden_states, encoder_hidden_states or None)."""
    if isinstance(output, tuple):
        enc = (output[meta.return_encoder_hidden_states_index]
               if meta.return_encoder_hidden_states_index is not None else None)
        return output[meta.return_hidden_states_index], enc
    return output, None


def _join(like, meta: TransformerBlockMetadata, hidden, encoder):
    """(hidden_states, encoder_hidden_states) -> the block's output format."""
    if isinstance(like, tuple) or meta.return_encoder_hidden_states_index is not None:
        out = [None] * max(2, (meta.return_hidden_states_index or 0) + 1,
                           (meta.return_encoder_hidden_states_index or 0) + 1)
        out[meta.return_hidden_states_index] = hidden
        if meta.return_encoder_hidden_states_index is not None:
            out[meta.return_encoder_hidden_states_index] = encoder
        return tuple(out)
    return hidden


def _local_shard(full: torch.Tensor, shard: torch.Tensor, group) -> torch.Tensor:
    """This rank's equal chunk of ``full`` along the one dimension where ``shard`` is
    smaller (how diffusers' context-parallel plans split a sequence)."""
    import torch.distributed as dist

    dims = [d for d in range(full.dim()) if full.shape[d] != shard.shape[d]]
    if len(dims) != 1:
        raise ValueError(f"step cache: cannot match input {tuple(full.shape)} to the sharded "
                         f"output {tuple(shard.shape)}")
    return full.chunk(dist.get_world_size(group), dim=dims[0])[dist.get_rank(group)]


def _rel_l1(a: torch.Tensor, b: torch.Tensor, group=None) -> float:
    """Largest over batch items of sum|a - b| / sum|a|. With a process ``group`` (sequence
    parallelism: each rank holds a shard of the tokens) the sums are all-reduced first, so
    every rank gets the same number and takes the same decision."""
    dims = tuple(range(1, a.ndim))
    sums = torch.stack([(a.float() - b.float()).abs().sum(dim=dims),
                        a.float().abs().sum(dim=dims)])
    if group is not None:
        import torch.distributed as dist

        dist.all_reduce(sums, group=group)
    return float((sums[0] / sums[1].clamp_min(1e-12)).max())


class TimestepReader:
    """Reads a denoiser call's timestep as one float (the largest value of a per-token
    timestep tensor), from its keyword or position; "timestep" in most families, HiDream
    calls it "timesteps". None when the call has none."""

    def __init__(self, module: torch.nn.Module):
        params = list(inspect.signature(type(module).forward).parameters)[1:]
        self.name = next((n for n in ("timestep", "timesteps") if n in params), None)
        self.index = params.index(self.name) if self.name else None

    def __call__(self, args, kwargs) -> float | None:
        value = kwargs.get(self.name or "timestep")
        if value is None and self.index is not None and self.index < len(args):
            value = args[self.index]
        if value is None:
            return None
        return float((value if isinstance(value, torch.Tensor) else torch.as_tensor(value)).max())


class _TrajectoryHook(ModelHook):
    """On the transformer: reads the timestep, gives context-less calls a context, starts a
    fresh state on a new trajectory (a timestep that does not decrease, or none), and hands
    the call to :meth:`_call`."""

    _is_stateful = True

    def __init__(self, state: StateManager, stats: StepCacheStats):
        super().__init__()
        self.state_manager = state
        self.stats = stats

    def initialize_hook(self, module):
        self._timestep = TimestepReader(module)
        return module

    def new_forward(self, module, *args, **kwargs):
        t = self._timestep(args, kwargs)
        own_context = self.state_manager._context is None
        if own_context:
            self.state_manager.set_context(CacheContext(_DEFAULT_CONTEXT))
        try:
            state = self.state_manager.get_state()
            if t is None or (state.last_timestep is not None and t >= state.last_timestep):
                state.reset()  # a new trajectory (or no timestep to forecast in)
            return self._call(state, t, args, kwargs)
        finally:
            if own_context:
                self.state_manager.set_context(None)

    def _call(self, state, t: float | None, args, kwargs):
        raise NotImplementedError

    def reset_state(self, module):
        self.state_manager.reset()
        return module


class _RootHook(_TrajectoryHook):
    """Signals ``"block"`` and ``"input"``: the blocks' hooks decide; this one counts."""

    def _call(self, state: _TrajectoryState, t: float | None, args, kwargs):
        state.timestep = t
        state.probed = False
        output = self.fn_ref.original_forward(*args, **kwargs)
        state.last_timestep = t
        if not state.probed:
            # the blocks did not run here: under CFG parallel another rank computed
            # this branch (its own cache decided there); nothing to count on this rank
            return output
        if state.compute:
            self.stats.full_calls += 1
        else:
            self.stats.skipped_calls += 1
        self.stats.decisions.append((self.state_manager._context.name, t or 0.0,
                                     state.accumulated, state.compute))
        return output


class _ProbeHook(ModelHook):
    """On the first block: runs it, decides, and on a skipped step returns the forecast."""

    _is_stateful = True

    def __init__(self, state: StateManager, config: StepCacheConfig,
                 segment_has_deep_blocks: bool = True, group=None):
        super().__init__()
        self.state_manager = state
        self.config = config
        self.group = group  # sequence-parallel group: decide on the whole sequence
        self.segment_has_deep_blocks = segment_has_deep_blocks
        self.meta: TransformerBlockMetadata | None = None

    def initialize_hook(self, module):
        self.meta = _metadata(module)
        return module

    def new_forward(self, module, *args, **kwargs):
        if self.config.signal == "input":
            return self._forward_on_input_signal(module, args, kwargs)
        meta = self.meta
        x = meta._get_parameter_from_args_kwargs(meta.hidden_states_argument_name, args, kwargs)
        output = self.fn_ref.original_forward(*args, **kwargs)
        _learn_format(meta, output)
        hidden, encoder = _split(output, meta)
        state: _TrajectoryState = self.state_manager.get_state()
        if x.shape != hidden.shape and self.group is not None:
            x = _local_shard(x, hidden, self.group)  # split inside the block (Wan's CP plan)
        residual = hidden - x
        state.compute = self._decide(state, residual)
        state.probed = True
        if state.compute:
            state.segment_inputs = {0: (hidden, encoder)}
            state.step_residuals = {}
            state.probe_residual = residual
            return output
        if not self.segment_has_deep_blocks:
            return output
        hidden, encoder = _plus_segment_forecast(state, self.config.order, hidden, encoder)
        return _join(output, meta, hidden, encoder)

    @torch.compiler.disable
    def _decide(self, state: _TrajectoryState, residual: torch.Tensor) -> bool:
        cfg = self.config
        if self._must_compute(state):
            return self._full(state)
        if state.probe_residuals[-1].shape != residual.shape:
            state.reset()
            return self._full(state)
        predicted = _forecast_list(state.times, state.probe_residuals, state.timestep, cfg.order)
        state.accumulated += _rel_l1(residual, predicted, self.group)
        if state.accumulated > cfg.threshold:
            return self._full(state)
        state.consecutive_skips += 1
        return False

    def _must_compute(self, state: _TrajectoryState) -> bool:
        """Off, no timestep to forecast in, still warming up, or skipped enough in a row."""
        cfg = self.config
        return cfg.threshold <= 0 or state.timestep is None or state.full_steps < max(
            1, cfg.warmup_steps) or state.consecutive_skips >= cfg.max_consecutive_skips

    @staticmethod
    def _full(state: _TrajectoryState) -> bool:
        state.accumulated = 0.0
        state.consecutive_skips = 0
        return True

    def _forward_on_input_signal(self, module, args, kwargs):
        """Signal ``"input"``: decide before the first block runs; on a skipped call return
        its input plus the forecast residual of the first block and of the rest of the
        segment, so no block computes anything."""
        meta = self.meta
        x, encoder_in = _inputs(meta, args, kwargs)
        if encoder_in is None and getattr(meta, "_takes_encoder", None):
            encoder_in = meta._get_parameter_from_args_kwargs(
                meta.encoder_hidden_states_argument_name, args, kwargs)
        state: _TrajectoryState = self.state_manager.get_state()
        signal = modulated_input(module, args, kwargs, x)
        state.compute = self._decide_on_input(state, signal)
        state.probed = True
        if state.compute:
            output = self.fn_ref.original_forward(*args, **kwargs)
            _learn_format(meta, output)
            hidden, encoder = _split(output, meta)
            if x.shape != hidden.shape and self.group is not None:
                x = _local_shard(x, hidden, self.group)  # split inside the block
            state.segment_inputs = {0: (hidden, encoder)}
            state.step_residuals = {}
            state.probe_residual = hidden - x
            state.probe_encoder_residual = (encoder - encoder_in if encoder is not None
                                            and encoder_in is not None
                                            and encoder.shape == encoder_in.shape else None)
            return output
        order = self.config.order
        r0 = _forecast_list(state.times, state.probe_residuals, state.timestep, order)
        if x.shape != r0.shape and self.group is not None:
            x = _local_shard(x, r0, self.group)
        hidden = x + r0
        encoder = encoder_in
        if encoder is not None and state.probe_encoder_residuals[-1] is not None:
            encoder = encoder + _forecast_list(state.times, state.probe_encoder_residuals,
                                               state.timestep, order)
        if self.segment_has_deep_blocks:
            hidden, encoder = _plus_segment_forecast(state, order, hidden, encoder)
        return _join(None, meta, hidden, encoder)

    @torch.compiler.disable
    def _decide_on_input(self, state: _TrajectoryState, signal: torch.Tensor) -> bool:
        cfg = self.config
        previous, state.previous_signal = state.previous_signal, signal
        if self._must_compute(state) or previous is None:
            return self._full(state)
        if previous.shape != signal.shape or state.probe_residuals[-1] is None:
            state.reset()
            state.previous_signal = signal
            return self._full(state)
        state.accumulated += _rel_l1(signal, previous, self.group)
        if state.accumulated > cfg.threshold:
            return self._full(state)
        state.consecutive_skips += 1
        return False

    def reset_state(self, module):
        self.state_manager.reset()
        return module


def modulated_input(block: torch.nn.Module, args, kwargs, hidden: torch.Tensor) -> torch.Tensor:
    """The first block's timestep-modulated input, the cheap skip signal of TeaCache (Liu et
    al., "Timestep Embedding Tells: It's Time to Cache for Video Diffusion Model", CVPR 2025).

    * Wan-style blocks (a ``scale_shift_table`` and ``norm1``, called with ``temb`` of shape
      (B, 6, D) or per token (B, L, 6, D)): ``norm1(x) * (1 + scale_msa) + shift_msa``;
    * blocks whose ``norm1`` is an adaptive LayerNorm taking ``emb`` (Flux, SD3, Qwen-Image
      double-stream blocks: AdaLayerNormZero): ``norm1(x, emb=temb)[0]``;
    * any other block: the input ``hidden`` itself (B, L, D).

    Costs one LayerNorm over the tokens, nothing against the block's attention and MLP.
    Returns a float32 tensor of ``hidden``'s shape."""
    bound = _bound_arguments(block, args, kwargs)
    temb = bound.get("temb")
    norm1 = getattr(block, "norm1", None)
    try:
        if temb is not None and norm1 is not None and hasattr(block, "scale_shift_table"):
            table = block.scale_shift_table
            if temb.ndim == 4:
                shift, scale = (table.unsqueeze(0) + temb.float()).chunk(6, dim=2)[:2]
                shift, scale = shift.squeeze(2), scale.squeeze(2)
            else:
                shift, scale = (table + temb.float()).chunk(6, dim=1)[:2]
            return norm1(hidden.float()) * (1 + scale) + shift
        if temb is not None and norm1 is not None and \
                "emb" in _forward_parameters(type(norm1)):
            out = norm1(hidden, emb=temb)
            return (out[0] if isinstance(out, tuple) else out).float()
    except (RuntimeError, ValueError, TypeError):
        pass  # a layout this reading does not know: fall back on the raw input
    return hidden.float()


@functools.cache
def _forward_parameters(cls: type) -> tuple[str, ...]:
    """The names of ``cls.forward``'s parameters after ``self`` (read once per class: the
    input signal asks on every denoiser call)."""
    return tuple(inspect.signature(cls.forward).parameters)[1:]


def _bound_arguments(block: torch.nn.Module, args, kwargs) -> dict:
    return dict(zip(_forward_parameters(type(block)), args, strict=False)) | kwargs


def _forecast_list(times, values, at, order):
    from studio.engine.caching.forecast import forecast

    return forecast(times, values, at, order)


def _forecast_segment(state: _TrajectoryState, segment: int, order: int):
    """The forecast (hidden, encoder or None) residual of one segment at this timestep."""
    history = [step[segment] for step in state.deep_residuals]
    hs = _forecast_list(state.times, [r[0] for r in history], state.timestep, order)
    enc = None
    if history[-1][1] is not None:
        enc = _forecast_list(state.times, [r[1] for r in history], state.timestep, order)
    return hs, enc


def _plus_segment_forecast(state: _TrajectoryState, order: int, hidden: torch.Tensor,
                           encoder: torch.Tensor | None):
    """(hidden, encoder) plus segment 0's forecast residual of each stream it has."""
    hs_res, enc_res = _forecast_segment(state, 0, order)
    if encoder is not None and enc_res is not None:
        encoder = encoder + enc_res
    return hidden + hs_res, encoder


def _inputs(meta: TransformerBlockMetadata, args, kwargs):
    hidden = meta._get_parameter_from_args_kwargs(meta.hidden_states_argument_name, args, kwargs)
    encoder = None
    if meta.return_encoder_hidden_states_index is not None:
        encoder = meta._get_parameter_from_args_kwargs(
            meta.encoder_hidden_states_argument_name, args, kwargs)
    return hidden, encoder


class _DeepBlockHook(ModelHook):
    """On every block after the probe. A segment is one block list of the model (FLUX.2 and
    HiDream join the text and image streams between their lists, so each list's residual is
    forecast in its own stream layout). On skipped steps the first block of a later segment
    returns its input plus that segment's forecast residual and every other block passes its
    input through; on full steps a segment's last block records the residual of the segment
    (its output minus the segment's input), and the model's last block closes the step."""

    _is_stateful = True

    def __init__(self, state: StateManager, config: StepCacheConfig, *, segment: int,
                 starts_segment: bool, ends_segment: bool, is_last: bool, group=None):
        super().__init__()
        self.state_manager = state
        self.config = config
        self.group = group  # sequence-parallel group: a plan may split inside this block
        self.segment, self.starts, self.ends, self.is_last = (segment, starts_segment,
                                                              ends_segment, is_last)
        self.meta: TransformerBlockMetadata | None = None

    def initialize_hook(self, module):
        self.meta = _metadata(module)
        return module

    def new_forward(self, module, *args, **kwargs):
        meta = self.meta
        state: _TrajectoryState = self.state_manager.get_state()
        if not state.compute:
            hidden, encoder = _inputs(meta, args, kwargs)
            if self.starts:
                hs_res, enc_res = _forecast_segment(state, self.segment, self.config.order)
                if hidden.shape != hs_res.shape and self.group is not None:
                    hidden = _local_shard(hidden, hs_res, self.group)  # split in the block
                hidden = hidden + hs_res
                if encoder is not None and enc_res is not None:
                    encoder = encoder + enc_res
            return _join(None, meta, hidden, encoder)
        output = self.fn_ref.original_forward(*args, **kwargs)
        _learn_format(meta, output)
        if self.starts:
            hidden, encoder = _inputs(meta, args, kwargs)
            out_hidden = _split(output, meta)[0]
            if hidden.shape != out_hidden.shape and self.group is not None:
                hidden = _local_shard(hidden, out_hidden, self.group)  # split in the block
            state.segment_inputs[self.segment] = (hidden, encoder)
        if self.ends:
            self._record(state, output)
        return output

    @torch.compiler.disable
    def _record(self, state: _TrajectoryState, output) -> None:
        hidden, encoder = _split(output, self.meta)
        in_hidden, in_encoder = state.segment_inputs[self.segment]
        enc_res = encoder - in_encoder if (encoder is not None and
                                           in_encoder is not None) else None
        state.step_residuals[self.segment] = (hidden - in_hidden, enc_res)
        if not self.is_last:
            return
        keep = self.config.order + 1
        state.full_steps += 1
        state.times = (state.times + [state.timestep])[-keep:]
        state.probe_residuals = (state.probe_residuals + [state.probe_residual])[-keep:]
        state.probe_encoder_residuals = (state.probe_encoder_residuals
                                         + [state.probe_encoder_residual])[-keep:]
        state.deep_residuals = (state.deep_residuals + [dict(state.step_residuals)])[-keep:]
        state.segment_inputs, state.step_residuals = {}, {}
        state.probe_residual = state.probe_encoder_residual = None

    def reset_state(self, module):
        self.state_manager.reset()
        return module


def block_segments(transformer: torch.nn.Module) -> list[list[torch.nn.Module]]:
    """The transformer's block lists in execution order, each a segment of the cache.

    Raises:
        ValueError: no known block list with at least 2 blocks in all, or a model whose
            blocks cannot be cached (names the class and why).
    """
    vace_layers = _vace_layers(transformer)
    if vace_layers and max(vace_layers) == len(transformer.blocks) - 1:
        # the hint added after the last block would be outside the forecast residual
        raise ValueError(f"step cache: {type(transformer).__name__} adds a VACE hint after "
                         f"its last block; it is not cached")
    segments = []
    for name in BLOCK_LIST_NAMES:
        value = getattr(transformer, name, None)
        if isinstance(value, torch.nn.ModuleList) and len(value):
            segments.append(list(value))
    if sum(len(seg) for seg in segments) < 2:
        raise ValueError(f"step cache: {type(transformer).__name__} has no list of at least 2 "
                         f"transformer blocks (looked for {', '.join(BLOCK_LIST_NAMES)})")
    return segments


def transformer_blocks(transformer: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer's blocks in execution order (Flux: the dual-stream blocks, then the
    single-stream ones; Wan VACE: its VACE blocks, then the main ones), found by the
    block-list names diffusers uses.

    Raises:
        ValueError: as :func:`block_segments`.
    """
    main = [block for segment in block_segments(transformer) for block in segment]
    return list(transformer.vace_blocks) + main if _vace_layers(transformer) else main


def _vace_layers(transformer: torch.nn.Module) -> list[int]:
    """The main-block indices after which Wan VACE adds its control hints ([] otherwise)."""
    if not isinstance(getattr(transformer, "vace_blocks", None), torch.nn.ModuleList):
        return []
    return list(getattr(transformer.config, "vace_layers", []) or [])


class _VaceProbeHook(_ProbeHook):
    """On Wan VACE's first VACE block, which runs before every main block: decides from the
    change of its control hint (output 0) and, on a skipped step, returns a zero hint (the
    main blocks' forecast residual already holds every hint)."""

    def initialize_hook(self, module):
        return module

    def new_forward(self, module, *args, **kwargs):
        hint, control = self.fn_ref.original_forward(*args, **kwargs)
        state: _TrajectoryState = self.state_manager.get_state()
        state.compute = self._decide(state, hint)
        state.probed = True
        if state.compute:
            state.segment_inputs, state.step_residuals = {}, {}
            state.probe_residual = hint
            return hint, control
        return torch.zeros_like(hint), control


class _VacePassHook(ModelHook):
    """On the other VACE blocks: on a skipped step, a zero hint and the control states
    passed through, without running the block."""

    _is_stateful = True

    def __init__(self, state: StateManager):
        super().__init__()
        self.state_manager = state

    def new_forward(self, module, *args, **kwargs):
        state: _TrajectoryState = self.state_manager.get_state()
        if state.compute:
            return self.fn_ref.original_forward(*args, **kwargs)
        names = ("hidden_states", "encoder_hidden_states", "control_hidden_states")
        bound = dict(zip(names, args, strict=False)) | kwargs
        return torch.zeros_like(bound["hidden_states"]), bound["control_hidden_states"]

    def reset_state(self, module):
        self.state_manager.reset()
        return module


class _OutputState(BaseState):
    """One cache context's output history (signal ``"output"``)."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.times: list[float] = []
        self.outputs: list[list[torch.Tensor]] = []  # per full call: its output tensors
        self.first_timestep: float | None = None
        self.last_timestep: float | None = None
        self.accumulated = 0.0
        self.consecutive_skips = 0
        self.full_steps = 0
        self.calls = 0  # calls of this trajectory so far (the schedule's index)
        self.template = None  # the output container of the last full call


def _output_tensors(output) -> list[torch.Tensor]:
    """The tensors of a denoiser's output: a tuple's tensor items or a ModelOutput's."""
    items = output.values() if hasattr(output, "values") and not isinstance(output, tuple) \
        else output if isinstance(output, tuple) else (output,)
    return [v for v in items if isinstance(v, torch.Tensor)]


def _rebuild_output(template, tensors: list[torch.Tensor]):
    """``template``'s container (tuple, ModelOutput or bare tensor) around ``tensors``."""
    if isinstance(template, torch.Tensor):
        return tensors[0]
    it = iter(tensors)
    if isinstance(template, tuple):
        return tuple(next(it) if isinstance(v, torch.Tensor) else v for v in template)
    return type(template)(**{k: next(it) if isinstance(v, torch.Tensor) else v
                             for k, v in template.items()})


def forecast_error_estimate(times: list[float], values: list[torch.Tensor], at: float) -> float:
    """Estimated relative L1 error of the linear extrapolation of ``values`` to ``at``: the
    remainder term of linear Lagrange extrapolation, ``f[t1, t2, t3] (at - t1)(at - t2)``,
    with the second divided difference taken from the last three values (t1 newest),
    divided by |value at t1|; the largest over batch items (dimension 0).

    Args:
        times: at least three distinct timesteps, oldest first.
        values: tensors of one shape (B, ...), one per time.
    Raises:
        ValueError: fewer than three values.
    """
    if len(values) < 3 or len(times) != len(values):
        raise ValueError(f"forecast_error_estimate: need 3 times and values, got "
                         f"{len(times)} and {len(values)}")
    t3, t2, t1 = (float(t) for t in times[-3:])
    v3, v2, v1 = values[-3:]
    # f[t1, t2, t3] (at - t1)(at - t2) as one weighted sum of the three values, the weights
    # computed as Python floats: a skipped call pays a handful of tensor operations
    span = (at - t1) * (at - t2)
    remainder = (v1.float() * (span / ((t1 - t2) * (t1 - t3)))).add_(
        v2.float(), alpha=span / ((t2 - t1) * (t2 - t3))).add_(
        v3.float(), alpha=span / ((t3 - t1) * (t3 - t2)))
    dims = tuple(range(1, v1.ndim)) or None
    ratio = (torch.linalg.vector_norm(remainder, 1, dim=dims)
             / torch.linalg.vector_norm(v1.float(), 1, dim=dims).clamp_min(1e-12))
    return float(ratio.max())


class _OutputForecastHook(_TrajectoryHook):
    """Signal ``"output"``: on the denoiser itself, skips whole calls and forecasts their
    output (the predicted noise / velocity) in the timestep from the last full calls.

    Why the output: a flow-matching sampler integrates the denoiser's output, so a skipped
    step that forecasts it to first order in the timestep is an extrapolating multistep
    update rather than a coarser step. On the embedded model (8 held-out prompts, 20 steps,
    CFG 4) forecasting every other call this way kept SSIM 0.998 against the full run at 22
    of 40 calls, where 10 steps (20 calls) kept 0.976 and 12 steps (24 calls) 0.990; the
    block-level forecast of the other signals kept 0.975 at 27 calls (2026-12-01).

    The decision, per call and per cache context (CFG branch): compute while warming up
    (``max(warmup_steps, 3)`` full calls: the error estimate needs three), after
    ``max_consecutive_skips`` skips in a row, and whenever the error accumulated since the
    last full call would pass ``threshold``. The error of one skipped call is the estimated
    relative error of the forecast (:func:`forecast_error_estimate`) times the call's share
    of the trajectory: ``min(t, t_prev - t) / t_first`` (the step about to be taken is at
    most ``t`` long, so the final steps near t = 0 weigh little whatever their relative
    error). A skipped call runs nothing: no embedding, no block, no projection.

    Sources: skipping whole noise-prediction calls with a cheap error bound is
    AdaptiveDiffusion (Ye et al., "Training-Free Adaptive Diffusion with Bounded Difference
    Approximation Strategy", NeurIPS 2024); forecasting instead of reusing is TaylorSeer (Liu
    et al., ICCV 2025); accumulating the signal since the last full step is TeaCache's.
    """

    def __init__(self, state: StateManager, stats: StepCacheStats, config: StepCacheConfig):
        super().__init__(state, stats)
        self.config = config
        self._schedule = frozenset(config.schedule)

    def _call(self, state: _OutputState, t: float | None, args, kwargs):
        if state.first_timestep is None:
            state.first_timestep = t
        compute, error = self._decide(state, t)
        state.calls += 1
        if compute:
            output = self.fn_ref.original_forward(*args, **kwargs)
            self._record(state, t, output)
            self.stats.full_calls += 1
        else:
            state.accumulated += error
            state.consecutive_skips += 1
            order = self._order_at(state, t)
            predicted = [_forecast_list(state.times, [o[i] for o in state.outputs], t, order)
                         for i in range(len(state.outputs[-1]))]
            output = _rebuild_output(state.template, predicted)
            self.stats.skipped_calls += 1
        state.last_timestep = t
        self.stats.decisions.append((self.state_manager._context.name, t or 0.0,
                                     state.accumulated, compute))
        return output

    def _order_at(self, state: _OutputState, t: float) -> int:
        """The forecast order at timestep ``t``: 0 (reuse) while ``t`` is at or above
        ``linear_below`` of the trajectory's first timestep, ``order`` below it."""
        cfg = self.config
        if cfg.linear_below < 1.0 and t >= cfg.linear_below * state.first_timestep:
            return 0
        return cfg.order

    @torch.compiler.disable
    def _decide(self, state: _OutputState, t: float | None) -> tuple[bool, float]:
        cfg = self.config
        if (cfg.threshold <= 0 or t is None or state.full_steps < max(cfg.warmup_steps, 3)
                or state.consecutive_skips >= cfg.max_consecutive_skips
                or not state.first_timestep or state.calls in self._schedule):
            return True, 0.0
        step = min(t, state.last_timestep - t) / state.first_timestep
        error = forecast_error_estimate(state.times, [o[0] for o in state.outputs], t) * step
        if state.accumulated + error > cfg.threshold:
            return True, 0.0
        return False, error

    @torch.compiler.disable
    def _record(self, state: _OutputState, t: float | None, output) -> None:
        tensors = _output_tensors(output)
        if state.outputs and [x.shape for x in tensors] != [x.shape for x in state.outputs[-1]]:
            state.times, state.outputs, state.full_steps = [], [], 0  # a new layout
        keep = max(self.config.order + 1, 3)
        state.times = (state.times + [t])[-keep:]
        state.outputs = (state.outputs + [[x.detach() for x in tensors]])[-keep:]
        state.template = output
        state.full_steps += 1
        state.accumulated = 0.0
        state.consecutive_skips = 0


#: Hooks that must stay outside the output-signal cache: under CFG parallelism each rank
#: computes one branch and the two ranks exchange outputs at every step, so a rank's cache
#: must decide only for the branch it computes, inside the exchange (outside it, one rank
#: could skip a call the other computes, and the exchange would pair the wrong tensors).
OUTER_HOOKS = ("studio_cfg_parallel",)


def apply_step_cache(transformer: torch.nn.Module, config: StepCacheConfig) -> StepCacheStats:
    """Installs the forecast step cache on a diffusers transformer (diffusers model hooks).

    Args:
        transformer: e.g. ``WanTransformer3DModel``, ``FluxTransformer2DModel``,
            ``SD3Transformer2DModel``; its forward takes a ``timestep`` argument.
        config: the cache settings.

    Returns:
        The live statistics object (counts of full and skipped calls).

    Raises:
        ValueError: the model has fewer than 2 blocks, or no known block list (signals
            ``"block"`` and ``"input"``; ``"output"`` needs no blocks).
    """
    remove_step_cache(transformer)
    reg = HookRegistry.check_if_exists_or_initialize
    stats = StepCacheStats()
    if config.signal == "output":
        register_inside(transformer, _OutputForecastHook(
            StateManager(_OutputState), stats, config), _ROOT_HOOK, OUTER_HOOKS)
        transformer._studio_step_cache = stats
        return stats
    segments = block_segments(transformer)
    state = StateManager(_TrajectoryState)
    reg(transformer).register_hook(_RootHook(state, stats), _ROOT_HOOK)
    group = getattr(transformer, "_studio_sequence_group", None)
    vace = bool(_vace_layers(transformer))
    if vace:  # the first VACE block runs first: it probes; the main blocks are segment 0
        reg(transformer.vace_blocks[0]).register_hook(
            _VaceProbeHook(state, config, group=group), _PROBE_HOOK)
        for block in transformer.vace_blocks[1:]:
            reg(block).register_hook(_VacePassHook(state), _BLOCK_HOOK)
    else:
        reg(segments[0][0]).register_hook(
            _ProbeHook(state, config, segment_has_deep_blocks=len(segments[0]) > 1,
                       group=group), _PROBE_HOOK)
    for k, segment in enumerate(segments):
        for i, block in enumerate(segment):
            if k == 0 and i == 0 and not vace:
                continue  # the probe
            reg(block).register_hook(_DeepBlockHook(
                state, config, segment=k, starts_segment=(k > 0 or vace) and i == 0,
                ends_segment=i == len(segment) - 1,
                is_last=k == len(segments) - 1 and i == len(segment) - 1, group=group),
                _BLOCK_HOOK)

    transformer._studio_step_cache = stats
    return stats


def remove_step_cache(transformer: torch.nn.Module) -> None:
    """Removes the cache's hooks (no-op when none are installed)."""
    if getattr(transformer, "_studio_step_cache", None) is None or \
            getattr(transformer, "_studio_unet_cache", False):  # the UNet cache's own
        return
    registry = HookRegistry.check_if_exists_or_initialize(transformer)
    output = isinstance(registry.get_hook(_ROOT_HOOK), _OutputForecastHook)
    remove_hook(transformer, _ROOT_HOOK)  # the hooks outside it keep working, in order
    transformer._studio_step_cache = None
    if output:
        return
    for block in transformer_blocks(transformer):
        for name in (_PROBE_HOOK, _BLOCK_HOOK):
            remove_hook(block, name)


def reset_step_cache(transformer: torch.nn.Module) -> StepCacheStats | None:
    """Clears every context's features and starts fresh statistics; call before each job.

    Returns the new statistics object, or None when no cache is installed."""
    stats = getattr(transformer, "_studio_step_cache", None)
    if stats is None:
        return None
    registry = HookRegistry.check_if_exists_or_initialize(transformer)
    root = registry.get_hook(_ROOT_HOOK) or registry.get_hook("studio_unet_cache_root")
    root.state_manager.reset()
    stats.full_calls = stats.skipped_calls = 0
    stats.decisions.clear()
    return stats
