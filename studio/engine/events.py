"""Engine events: what a caller of :mod:`studio.engine.api` sees of a job's life.

Every job emits ``Queued``, then ``Started``, any number of ``Progress``, and exactly one
terminal event: ``Finished``, ``Failed`` or ``Cancelled`` (a job cancelled before it started
goes straight from ``Queued`` to ``Cancelled``). Events are plain frozen dataclasses with no
torch tensors, so they cross thread and process boundaries and the UI can import them
without torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

# Failure kinds (``Failed.kind``).
BAD_INPUT = "bad_input"  # the request or an input image was refused; fix it and retry
MODEL_ERROR = "model"  # the model folder is missing, partial or corrupt
OUT_OF_MEMORY = "out_of_memory"
WORKER_DIED = "worker_died"  # the engine process crashed; the next job gets a new one
INTERNAL = "internal"  # a bug: the message names the log file with the traceback


@dataclass(frozen=True)
class JobEvent:
    """Base of all events; ``job_id`` is what :meth:`Engine.submit` returned."""

    job_id: str

    @property
    def terminal(self) -> bool:
        return False


@dataclass(frozen=True)
class Queued(JobEvent):
    """The job is waiting; ``position`` 0 means it runs next."""

    position: int = 0


@dataclass(frozen=True)
class Started(JobEvent):
    """The worker took the job."""


ETA_UNKNOWN = -1.0  # Progress.eta_s before the time of a step is known


@dataclass(frozen=True)
class Progress(JobEvent):
    """One denoising step finished.

    Attributes:
        step: steps done, 1..total_steps.
        total_steps: steps this job runs (for image-to-image: ``int(steps * strength)``).
        elapsed_s: seconds since the job started.
        eta_s: estimated seconds to the end of denoising; :data:`ETA_UNKNOWN` (negative)
            at the first step, before a step's time is known.
        preview: uint8 RGB (h, w, 3), long side <= 256 px, from the current latents by a
            cheap linear latent-to-RGB projection (not the VAE); None if not available.
    """

    step: int = 0
    total_steps: int = 0
    elapsed_s: float = 0.0
    eta_s: float = 0.0
    preview: np.ndarray | None = None


@dataclass(frozen=True)
class Finished(JobEvent):
    """The job's result.

    Attributes:
        frames: uint8 (F, H, W, 3); F = 1 for images.
        fps: frames per second (video playback rate).
        request_json: the canonical JSON of the request that made it.
        environment: :class:`studio.core.request.EngineEnvironment` as a dict.
        timings: seconds per stage: ``load``, ``prepare`` (text encoding, input encoding,
            noise), ``denoise``, ``decode``, ``total``.
        peak_memory_bytes: peak resident memory of the engine process during the job (CPU),
            or peak allocated device memory (CUDA).
        notes: human-readable remarks (e.g. the size an input image was fitted to).
    """

    frames: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 0, 3), np.uint8))
    fps: float = 16.0
    request_json: str = ""
    environment: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    peak_memory_bytes: int = 0
    notes: tuple[str, ...] = ()

    @property
    def terminal(self) -> bool:
        return True


@dataclass(frozen=True)
class Failed(JobEvent):
    """The job failed; ``kind`` is one of the module's failure kinds, ``message`` is for a
    person, ``log_path`` holds the traceback when the kind is ``internal``."""

    kind: str = INTERNAL
    message: str = ""
    log_path: str = ""

    @property
    def terminal(self) -> bool:
        return True


@dataclass(frozen=True)
class Cancelled(JobEvent):
    """The job was cancelled; ``during_step`` is the step it stopped at (0 if not started)."""

    during_step: int = 0

    @property
    def terminal(self) -> bool:
        return True
