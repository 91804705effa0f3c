"""What every family runner shares: loading, the step callback and stage timings.

A family runner wraps diffusers' own pipelines (never copies of them): it loads the folder
once, derives the per-mode pipelines with ``from_pipe`` (shared weights), and calls them with
a ``callback_on_step_end`` that reports progress and raises :class:`JobCancelled` when the
job is cancelled, so cancellation takes effect within one denoising step.
"""

from __future__ import annotations

import inspect
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from studio.core.request import GenerationRequest
from studio.engine.models.folders import ModelError
from studio.engine.models.registry import ModelEntry
from studio.engine.preview import LatentPreview


class JobCancelled(Exception):
    """Raised inside the denoising loop when the job was cancelled."""

    def __init__(self, step: int):
        super().__init__(f"cancelled at step {step}")
        self.step = step


# on_step(step_done (1-based), total_steps, latents) -> None; may raise JobCancelled.
StepFn = Callable[[int, int, torch.Tensor], None]


class MemoryPlanChange(RuntimeError):
    """The loaded pipeline cannot take this offload in place (diffusers' offload hooks, and
    our lever hooks wrapped by them, do not come off cleanly): load the model again."""


@dataclass
class RunOutput:
    """A runner's result.

    Attributes:
        frames: float32 (F, H, W, 3) in [0, 1], exactly as the diffusers pipeline returned.
        timings: seconds for ``prepare``, ``denoise``, ``decode``.
        notes: remarks for the user.
    """

    frames: np.ndarray
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def load_pipeline(cls: type, entry: ModelEntry, dtype: torch.dtype):
    """``cls.from_pretrained`` on a local folder: safetensors only, never the network; with
    the entry's single-file denoiser in place of the folder's when it has one.

    Raises:
        ModelError: the folder could not be loaded (names it and the reason).
    """
    parts = {}
    if entry.denoiser_file is not None:  # a single-file denoiser on the folder's other parts
        import diffusers

        from studio.engine.models.single_file import load_denoiser

        if cls is diffusers.DiffusionPipeline:  # it drops passed components: use the class
            cls = getattr(diffusers, entry.pipeline_class, cls)

        parts[entry.denoiser_subfolder] = load_denoiser(
            entry.denoiser_file, Path(entry.path), entry.denoiser_subfolder,
            entry.denoiser_class, dtype)
    try:
        variant = {"variant": entry.variant} if getattr(entry, "variant", None) else {}
        pipe = cls.from_pretrained(Path(entry.path), dtype=dtype, local_files_only=True,
                                   use_safetensors=True, **variant, **parts)
    except (OSError, ValueError, KeyError, RuntimeError, TypeError) as exc:
        raise ModelError(f"model {entry.model_id}: cannot load {entry.path} "
                         f"({type(exc).__name__}: {str(exc)[:300]})") from exc
    check_no_missing_weights(pipe, entry)
    return pipe


def check_no_missing_weights(pipe, entry: ModelEntry) -> None:
    """Raises ModelError when a loaded module still has parameters or buffers on the meta
    device: its config asks for weights its files do not hold (diffusers leaves them
    unmaterialised, and the first ``.to()`` fails with "Cannot copy out of meta tensor")."""
    for name, module in getattr(pipe, "components", {}).items():
        if not isinstance(module, torch.nn.Module):
            continue
        missing = [key for key, t in (*module.named_parameters(), *module.named_buffers())
                   if t.is_meta]
        if missing:
            raise ModelError(
                f"model {entry.model_id}: {name} in {entry.path} does not match its config: "
                f"{len(missing)} weights the config asks for are not in its files (e.g. "
                f"{', '.join(missing[:3])}); the config.json or the weights are from another "
                f"model")


def derive_pipeline(cls: type, base, **config):
    """Another diffusers pipeline class over ``base``'s very modules (no copy, no cast).

    Unlike ``from_pipe``, which casts every module to one dtype (float32 by default, undoing
    the float32-kept norms of a bf16 model or upcasting it), this passes the loaded modules
    as they are. ``config`` gives the new class's config arguments (e.g. ``expand_timesteps``).
    """
    if type(base) is cls:
        return base
    params = inspect.signature(cls.__init__).parameters
    parts = {name: module for name, module in base.components.items() if name in params}
    for name, value in config.items():
        if name in params:
            parts[name] = value
    pipe = cls(**parts)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def to_pil(pixels: np.ndarray):
    """uint8 (H, W, 3) -> PIL RGB image."""
    from PIL import Image

    return Image.fromarray(np.ascontiguousarray(pixels, dtype=np.uint8), "RGB")


class StageClock:
    """Splits a pipeline call into prepare / denoise / decode by hooking the denoiser.

    ``prepare`` ends when the denoiser is first called, ``denoise`` ends at the last step
    callback, ``decode`` is the rest of the call. A job that fails or is cancelled never
    calls :meth:`finish`: the next clock on the same denoiser removes the hook it left.
    """

    def __init__(self, denoisers: list[torch.nn.Module]):
        self.start = time.perf_counter()
        self.first_forward: float | None = None
        self.last_step: float | None = None
        self._handles = []
        for m in denoisers:
            if m is None:
                continue
            for handle in getattr(m, "_studio_clock_handles", ()):  # an unfinished clock's
                handle.remove()
            handle = m.register_forward_pre_hook(self._on_forward)
            m._studio_clock_handles = [handle]
            self._handles.append(handle)

    def _on_forward(self, _module, _args):
        if self.first_forward is None:
            self.first_forward = time.perf_counter()

    def step_done(self) -> None:
        self.last_step = time.perf_counter()

    def finish(self) -> dict[str, float]:
        end = time.perf_counter()
        for h in self._handles:
            h.remove()
        first = self.first_forward or end
        last = self.last_step or end
        return {"prepare": first - self.start, "denoise": last - first, "decode": end - last}


def make_callback(on_step: StepFn, clock: StageClock,
                  latents_view: Callable[[torch.Tensor], torch.Tensor] | None = None,
                  after: Callable | None = None):
    """A diffusers ``callback_on_step_end`` that reports each step to ``on_step``.

    Args:
        latents_view: maps the pipeline's latents to (B, C, [F,] h, w) for the preview.
        after: ``after(pipe, latents) -> latents`` replaces the latents after each step
            (e.g. masked blending).
    """

    def callback(pipe, i: int, _t, kwargs: dict) -> dict:
        clock.step_done()
        latents = kwargs.get("latents")
        out = {}
        if after is not None and latents is not None:
            latents = out["latents"] = after(pipe, latents)
        view = latents_view(latents) if latents is not None and latents_view else latents
        on_step(i + 1, int(getattr(pipe, "_num_timesteps", 0) or 0), view)
        return out

    return callback


class EmbeddingCache:
    """Least-recently-used cache of encoder outputs (text embeddings, VAE latents) by key.

    Keys are plain tuples naming everything the value depends on (prompt, negative prompt,
    sequence length, guidance on/off; or an image's pixel content id and size); values are
    tuples of tensors, kept on the model's device. ``max_entries`` bounds the memory (a text
    embedding of a real model is ~0.5-4 MB in bf16).
    """

    def __init__(self, max_entries: int = 32):
        from collections import OrderedDict

        self.max_entries = max_entries
        self._items: OrderedDict = OrderedDict()
        self.hits = self.misses = 0

    def get(self, key: tuple, compute: Callable[[], tuple]) -> tuple[tuple, bool]:
        """(value, reused): the cached value for ``key``, or ``compute()`` stored under it."""
        if key in self._items:
            self._items.move_to_end(key)
            self.hits += 1
            return self._items[key], True
        self.misses += 1
        value = compute()
        self._items[key] = value
        while len(self._items) > self.max_entries:
            self._items.popitem(last=False)
        return value, False

    def clear(self) -> None:
        self._items.clear()


class FamilyRunner:
    """Base of the per-family runners: one loaded model, run many requests.

    Subclasses implement :meth:`run`. ``preview`` turns step latents into a uint8 image.

    Args:
        entry: the model.
        device: where jobs run.
        dtype: the weights' compute dtype.
        load_device: where the weights are put at load (default ``device``). The CPU for a
            model whose weights do not fit on ``device``: the first job's memory plan
            (:meth:`apply_memory_plan`) then moves them there whole or sets up diffusers'
            offload from the CPU, instead of the load running out of device memory before
            any plan is made.

    Attributes:
        classifier_free_guidance: whether the family's jobs run the two guidance branches
            (conditional and unconditional) at a guidance scale above 1. False for
            guidance-distilled families whose guidance scale is an input of the one branch
            (FLUX.1, FLUX.2): CFG parallelism has nothing to split there.
    """

    classifier_free_guidance = True

    def __init__(self, entry: ModelEntry, device: torch.device, dtype: torch.dtype,
                 load_device: torch.device | None = None):
        self.entry = entry
        self.device = device
        self.dtype = dtype
        self.load_device = device if load_device is None else load_device
        self.preview: LatentPreview | None = None
        self.embeddings = EmbeddingCache()

    def encode_text(self, key: tuple, compute: Callable[[], tuple],
                    timings: dict[str, float], notes: list[str]) -> tuple:
        """Text embeddings for ``key`` from the cache, or computed (``compute()``) and kept;
        records ``timings["text_encode"]`` (0 when reused) and a note when reused."""
        t0 = time.perf_counter()
        value, reused = self.embeddings.get(("text", *key), compute)
        timings["text_encode"] = 0.0 if reused else time.perf_counter() - t0
        if reused:
            notes.append("text embeddings reused (same prompt as an earlier job)")
        return value

    def run(self, request: GenerationRequest, inputs: dict[str, np.ndarray],
            on_step: StepFn) -> RunOutput:
        raise NotImplementedError

    def prompt_notes(self, request: GenerationRequest) -> list[str]:
        """Notes on what of the prompts the model silently ignores:

        * more tokens than the text encoder reads (the words past the limit change nothing
          in every diffusers pipeline; the limit is the model's ``max_sequence_length``
          setting, else its tokenizer's maximum);
        * words the tokenizer does not know (read as its unknown token: the embedded model's
          word-level vocabulary knows only its world's words);
        * a negative prompt at guidance scale <= 1 (no unconditional branch runs: CFG off).
        """
        notes = []
        if request.negative_prompt and isinstance(request.guidance_scale, int | float) and \
                request.guidance_scale <= 1:
            notes.append(f"negative prompt: ignored at guidance {request.guidance_scale:g} "
                         f"(classifier-free guidance runs only above 1)")
        tokenizer = getattr(getattr(self, "base", None), "tokenizer", None)
        if tokenizer is None or not request.prompt:
            return notes
        unknown = self._unknown_words(tokenizer, request.prompt)
        if unknown:
            # control characters (a pasted \x01, a tab) shown escaped, not as an empty “”
            shown = ", ".join(f"\u201c{w if w.isprintable() else w.encode('unicode_escape').decode()}"
                              f"\u201d" for w in unknown[:5])
            more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
            notes.append(f"prompt: this model does not know {shown}{more}; read as an unknown "
                         f"word")
        tokenizer, limit = self._longest_reader()
        if tokenizer is None or not isinstance(limit, int) or limit <= 0 or limit > 100_000:
            return notes
        ids = tokenizer(request.prompt, truncation=False).input_ids
        if len(ids) <= limit:
            return notes
        kept = tokenizer.decode(ids[:limit], skip_special_tokens=True).split()
        tail = " ".join(kept[-3:])
        return notes + [f"prompt: {len(ids)} tokens, but this model reads the first {limit}; "
                        f"the words after \u201c{tail}\u201d change nothing"]

    def _longest_reader(self):
        """(tokenizer, tokens it reads) of the text encoder that reads the most of a prompt.
        ``max_sequence_length`` (the folder's studio.json, else the pipeline's own default)
        is the limit of the last tokenizer (FLUX.1's ``tokenizer_2``, SD3's ``tokenizer_3``:
        T5, 512 and 256 tokens; the only one of Wan, LTX and the embedded model); the others
        read their tokenizer's maximum (CLIP: 77). Words past 77 still count in FLUX.1.
        (None, None) without a tokenizer."""
        base = getattr(self, "base", None)
        names = [n for n in ("tokenizer", "tokenizer_2", "tokenizer_3")
                 if getattr(base, n, None) is not None]
        if not names:
            return None, None
        wanted = self.entry.call_kwargs.get("max_sequence_length")
        if wanted is None:
            param = inspect.signature(type(base).__call__).parameters.get("max_sequence_length")
            wanted = param.default if param is not None else None
        best, best_limit = None, 0
        for name in names:
            tok = getattr(base, name)
            limit = getattr(tok, "model_max_length", None)
            if name == names[-1] and isinstance(wanted, int) and wanted > 0:
                limit = wanted
            if isinstance(limit, int) and 0 < limit <= 100_000 and limit > best_limit:
                best, best_limit = tok, limit
        return (best, best_limit) if best is not None else (None, None)

    @staticmethod
    def _unknown_words(tokenizer, text: str) -> list[str]:
        """The distinct pieces of ``text`` that ``tokenizer`` maps to its unknown token (a
        fast tokenizer's offsets give them back; none for a tokenizer without either)."""
        unk = getattr(tokenizer, "unk_token_id", None)
        if unk is None or not getattr(tokenizer, "is_fast", False):
            return []
        enc = tokenizer(text, truncation=False, return_offsets_mapping=True)
        found: list[str] = []
        for token, (start, end) in zip(enc.input_ids, enc.offset_mapping, strict=False):
            word = text[start:end]
            if token == unk and word and word not in found:
                found.append(word)
        return found

    def kl_latent_preview(self) -> LatentPreview:
        """The step preview for a 2-D ``AutoencoderKL`` latent space (B, C, h, w) scaled by
        the VAE's ``scaling_factor`` and ``shift_factor`` (Flux, SD, SD3, HiDream)."""
        vae = self.base.vae
        scale, shift = vae.config.scaling_factor, vae.config.shift_factor or 0.0

        def decode(z: torch.Tensor) -> torch.Tensor:
            return vae.decode(z / scale + shift, return_dict=False)[0]

        return LatentPreview.fit(decode, (int(vae.config.latent_channels), 4, 4),
                                 self.vae_scale_factor, device=vae.device, dtype=vae.dtype)

    def weights_device(self) -> torch.device:
        """Where the denoiser's weights are now: ``load_device`` until the first memory plan
        moves them (:meth:`memory_estimate` traces its fake inputs there, so that they meet
        the weights on one device); ``device`` when there is no denoiser parameter."""
        for module in self.denoisers():
            for tensor in itertools.chain(module.parameters(), module.buffers()):
                return tensor.device
        return self.device

    def extra_modules(self) -> list[torch.nn.Module]:
        """Modules the runner loaded beside the diffusers pipeline (e.g. a reference-image
        encoder): the memory plan puts them on ``device`` whole (they are small)."""
        return []

    def denoisers(self) -> list[torch.nn.Module]:
        """The denoiser modules the optimization levers apply to (transformer, and
        transformer_2 for two-expert models)."""
        base = getattr(self, "base", None)
        found = [getattr(base, name, None) for name in ("transformer", "transformer_2", "unet")]
        return [m for m in found if m is not None]

    def apply_profile(self, request: GenerationRequest) -> list[str]:
        """Applies the request's optimization profile to the denoisers (undoing the last
        job's levers). Returns notes for the user."""
        from studio.engine.profiles import apply_levers, levers_for, levers_from_step

        levers = levers_for(request.optimization.profile, self.device, self.entry.tuning,
                            request.steps, request.is_video)
        if request.mode == "i2i":  # SDEdit runs the schedule's last steps x strength
            levers = levers_from_step(levers, request.steps - int(request.steps
                                                                  * request.strength))
        return apply_levers(self.denoisers(), levers)

    def result(self, frames, timings: dict[str, float], clock: StageClock,
               notes: list[str]) -> RunOutput:
        """The run's result: ``frames`` as float32 (F, H, W, 3) in [0, 1], the timings with
        the clock's stages (seconds), and the notes followed by what the levers did."""
        return RunOutput(np.asarray(frames, dtype=np.float32), {**timings, **clock.finish()},
                         notes + self.profile_notes())

    def profile_notes(self) -> list[str]:
        """After a run: what the levers did (denoiser calls computed in full / skipped)."""
        from studio.engine.profiles import attention_stats, cache_stats

        notes = []
        stats = cache_stats(self.denoisers())
        if stats is not None and stats.calls:
            notes.append(f"step cache: {stats.full_calls} of {stats.calls} denoiser calls "
                         f"computed in full, {stats.skipped_calls} forecast")
        reuse = [getattr(m, "_studio_cfg_reuse", None) for m in self.denoisers()]
        reuse = [r for r in reuse if r is not None and (r.computed or r.reused)]
        if reuse:
            computed = sum(r.computed for r in reuse)
            reused = sum(r.reused for r in reuse)
            notes.append(f"guidance reuse: {computed} of {computed + reused} unconditional "
                         f"calls computed, {reused} forecast")
        paths = attention_stats(self.denoisers())
        if paths:
            notes.append("attention calls: " + ", ".join(f"{n} {p}" for p, n in
                                                         sorted(paths.items())))
        return notes

    # -- memory ---------------------------------------------------------------------------
    def stage_inputs(self, request: GenerationRequest) -> dict:
        """Per stage, ``(module, call, args)``: what one call of the stage runs, with tensors
        of the request's shapes (any values), for :meth:`memory_estimate` to trace.
        Subclasses provide it; stages are ``text_encode``, ``denoise`` and ``decode``."""
        raise NotImplementedError

    def memory_estimate(self, request: GenerationRequest):
        """The job's :class:`~studio.engine.memory.MemoryEstimate`, traced with fake tensors
        at the request's resolution and frame count (cached per geometry)."""
        from studio.engine import memory as mem

        key = (request.mode, request.width, request.height, request.num_frames,
               len(request.references))
        cache = self.__dict__.setdefault("_memory_estimates", {})
        if key in cache:
            return cache[key]
        stages = self.stage_inputs(request)
        # every module an offload hook may move during a trace (the hooks chain the models)
        everything = [m for m in self.base.components.values()
                      if isinstance(m, torch.nn.Module)] + self.extra_modules()
        weights, blocks, layers, acts, notes = {}, {}, {}, {}, []
        decode_tiled = 0
        for stage, (modules, call, args) in stages.items():
            weights[stage] = sum(mem.module_bytes(m) for m in modules)
            blocks[stage] = max((mem.largest_block_bytes(m) for m in modules), default=0)
            layers[stage] = max((mem.largest_layer_bytes(m) for m in modules), default=0)
            try:
                acts[stage] = mem.trace_peak(call, *args, modules=everything)
            except RuntimeError as exc:
                acts[stage] = 4 * sum(a.numel() * a.element_size() for a in args
                                      if isinstance(a, torch.Tensor))
                notes.append(f"{stage}: {exc}; activations guessed from the input size")
            if stage == "decode":
                vae = modules[0]
                if hasattr(vae, "enable_tiling"):
                    was = bool(getattr(vae, "use_tiling", False))
                    vae.enable_tiling()
                    try:
                        decode_tiled = mem.trace_peak(call, *args, modules=everything)
                    except RuntimeError:
                        decode_tiled = acts[stage]
                    finally:
                        if not was:
                            vae.disable_tiling()
                else:
                    decode_tiled = acts[stage]
        latents = stages["decode"][2][0]
        frames = request.num_frames if request.mode not in ("t2i", "i2i") else 1
        resident = 3 * latents.numel() * latents.element_size() + \
            2 * frames * request.height * request.width * 3 * 4
        cache[key] = mem.MemoryEstimate(weights, acts, decode_tiled, blocks, layers, resident,
                                        tuple(notes))
        return cache[key]

    def apply_memory_plan(self, plan):
        """Applies a :class:`~studio.engine.memory.MemoryPlan` to the loaded pipeline (the
        derived per-mode pipelines share its modules) and returns the plan in force.

        Once offloading, a job that would fit all on the device keeps the offload (it frees
        more than asked: slower, never failing; going back needs the model loaded again).

        Raises:
            MemoryPlanChange: another offload than the one in force (from none to one, or
                between two): the caller loads the model again and applies it there.
        """
        from dataclasses import replace

        from studio.engine.memory import apply_plan, set_vae_tiling

        current = getattr(self, "_memory_plan", None)
        if current is not None and current.offload != "none" and plan.offload == "none":
            plan = replace(plan, offload=current.offload)
        if current is not None and (current.offload, current.vae_tiling) == \
                (plan.offload, plan.vae_tiling):
            return plan
        if current is not None and current.offload != plan.offload:
            raise MemoryPlanChange(f"memory plan: from {current.offload} to {plan.offload} "
                                   f"offload needs the model loaded again")
        if current is not None and current.offload != "none":
            set_vae_tiling(self.base, plan.vae_tiling)  # the offload stays as it is
        else:
            apply_plan(self.base, plan, self.device)
            for module in self.extra_modules():
                module.to(self.device)
        self._memory_plan = plan
        return plan

    def decode_with_retry(self, decode: Callable[[], np.ndarray], notes: list[str]) -> np.ndarray:
        """Runs ``decode()`` (latents -> float frames, the latents kept by the caller); when
        the device runs out of memory, switches VAE tiling on and decodes the same latents
        again, without denoising again."""
        try:
            return decode()
        except torch.OutOfMemoryError:
            vae = self.base.vae
            if not hasattr(vae, "enable_tiling") or getattr(vae, "use_tiling", False):
                raise
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            vae.enable_tiling()
            notes.append("VAE decode ran out of memory: decoded again tiled (same latents)")
            return decode()

    def generator(self, seed: int) -> torch.Generator:
        """The job's noise generator: always on the CPU, so the initial noise of a seed is the
        same on every device (diffusers' ``randn_tensor`` moves it to the model's device)."""
        return torch.Generator(device="cpu").manual_seed(int(seed))
