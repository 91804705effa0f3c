"""The one bridge between the document and the engine.

:class:`StudioController` owns the :class:`~studio.engine.api.Engine` (a
:class:`~studio.engine.worker.ProcessWorker` by default, so an engine crash never takes the
window down; tests inject a thread worker) and keeps it fed from the document:

* **The document's queue is the queue of record.** The controller hands the engine one job
  at a time: the first ``queued`` variant of ``Document.queue()``. Reordering the queue is
  therefore just :meth:`Document.move_job`, and nothing is lost if the engine restarts.
* **Events** are consumed with ``async for`` over ``engine.events()`` and applied on the GUI
  thread: ``Started`` -> status running; ``Progress`` -> the step preview and ETA
  (:attr:`previewReady`, :attr:`progressChanged`); ``Finished`` -> the frames are written to
  the project's media store on a worker thread, then recorded and the variant finished in one
  transaction; ``Failed`` (including ``worker_died``) -> the variant fails with the message and
  the next job runs; ``Cancelled`` -> the variant is cancelled.
* **Undo and delete cancel**: when a variant with a job disappears from the document (undo of
  its "add", delete of it or an ancestor) the job is cancelled and its late events ignored.
* **Open and close**: on start, queued variants are submitted in order (variants the last
  session left running were made ``interrupted`` by the store and wait for a Retry); on close
  the running variant becomes ``interrupted``, queued ones stay queued for next time.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PySide6.QtCore import QObject, QTimer, Signal

from studio.core.commands import AddVariant
from studio.core.document import (
    PENDING,
    QUEUE_CHANGED,
    VARIANTS_ADDED,
    VARIANTS_CHANGED,
    VARIANTS_REMOVED,
    Artifact,
    ChangeEvent,
    Status,
)
from studio.core.media import UserImage, decode_user_image, load_user_image
from studio.core.request import GenerationRequest, MediaRef
from studio.engine import events as ev
from studio.engine.api import Engine, EventStream
from studio.engine.worker import WorkerConfig
from studio.store.media import StagedMedia
from studio.store.project import Project
from studio.ui.background import Background

log = logging.getLogger(__name__)

CLOSED_MESSAGE = "The studio was closed while this was generating. Retry to run it again."
EngineFactory = Callable[[], Engine]

# engine notes about the request's own input (ignored words, a negative prompt without CFG,
# an input image fitted to the model's size), shown to the user when the result arrives
INPUT_NOTE_PREFIXES = ("prompt:", "negative prompt:", "size:", "first_frame:", "init_image:",
                       "references", "FLUX.1 ignores", "FLUX.2 is guidance-distilled")
#: the engine's notes on what a job ran, said when it finishes (the profile's own line and
#: the like stay with the result)
RAN_NOTE_PREFIXES = ("step cache:", "guidance reuse:", "memory plan", "retried", "VAE decode")


def finished_text(label: str, timings: dict, notes: Sequence[str]) -> str:
    """The status line for a finished job: its name, seconds, and what ran."""
    total = timings.get("total")
    text = f"Done: {label}" + (f" in {total:.1f} s" if isinstance(total, float) else "")
    ran = [n for n in notes if n.startswith(RAN_NOTE_PREFIXES)]
    if any(n.startswith("the CPU is busy") for n in notes):
        ran.append("the CPU was busy with other programs (STUDIO_CPU_THREADS=auto helps)")
    return text + ("; " + "; ".join(ran) if ran else "")


@dataclass
class _Job:
    variant_id: str
    job_id: str | None = None  # None while its input images are being read
    orphan: bool = False  # the variant left the document; ignore the job's events


@dataclass(frozen=True)
class JobProgress:
    """The last progress of a running variant: steps done of total, seconds elapsed and left."""

    step: int
    total: int
    elapsed_s: float
    eta_s: float

    @property
    def fraction(self) -> float:
        """Steps done as a fraction in [0, 1]."""
        return self.step / self.total if self.total else 0.0


def _read_inputs(sources: Sequence[tuple[str, Path, list[int]]]) -> dict[str, np.ndarray]:
    from PIL import Image

    out = {}
    for content_id, path, shape in sources:
        with Image.open(path) as img:
            out[content_id] = np.asarray(img, dtype=np.uint8).reshape(shape)
    return out


class StudioController(QObject):
    """Runs the document's queue on the engine and applies the engine's events.

    Args:
        project: the open project (document + media store).
        background: the thread pool for file work.
        config: settings for the default engine (a ProcessWorker, or a rank group for a multi-GPU plan).
        engine_factory: makes the engine instead (tests: a ThreadWorker engine).

    Signals:
        previewReady(variant_id): a new step preview (:meth:`preview`).
        progressChanged(variant_id): new progress (:meth:`progress`) or the job ended.
        resultSaved(variant_id): the variant's result is stored and the variant done.
        notice(message, is_error): something the user should read.
    """

    previewReady = Signal(str)
    progressChanged = Signal(str)
    resultSaved = Signal(str)
    notice = Signal(str, bool)

    def __init__(
        self,
        project: Project,
        background: Background,
        *,
        config: WorkerConfig | None = None,
        engine_factory: EngineFactory | None = None,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.project = project
        self.document = project.document
        self._bg = background
        self.config = config or WorkerConfig()
        self._factory = engine_factory
        self.engine: Engine | None = None
        self._consumer: asyncio.Task | None = None
        self._jobs: dict[str, _Job] = {}
        self._current: _Job | None = None
        self._progress: dict[str, JobProgress] = {}
        self._previews: dict[str, np.ndarray] = {}
        self._saving: dict[str, concurrent.futures.Future] = {}
        self._dispatch_pending = False
        self._closed = False
        self._restart_wanted = False
        self._unsubscribe = self.document.subscribe(self._on_document)

    # -- lifecycle --------------------------------------------------------------------------
    def _make_engine(self) -> Engine:
        if self._factory is not None:
            return self._factory()
        return Engine(config=self.config, in_process=False)  # a rank group for multi-GPU plans

    async def start(self) -> None:
        """Starts the engine and submits the queued variants (call on the running loop)."""
        if self.engine is not None:
            return
        self.engine = self._make_engine()
        stream = self.engine.events()
        self._consumer = asyncio.ensure_future(self._consume(stream))
        self._schedule_dispatch()

    async def _consume(self, stream: EventStream) -> None:
        async for event in stream:
            try:
                self._on_event(event)
            except Exception as exc:  # keep consuming: one bad event must not stop the queue
                log.exception("applying engine event %r failed", event)
                self.notice.emit(f"Internal error while applying a result: {exc}", True)

    async def aclose(self, timeout: float = 60.0) -> None:
        """Waits for results being saved, marks the running variant interrupted, stops the
        engine. Queued variants stay queued for the next session."""
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._saving and loop.time() < deadline:
            await asyncio.sleep(0.02)
        self._unsubscribe()
        for job in self._jobs.values():
            vid = job.variant_id
            if not job.orphan and self.document.has_variant(vid):
                if self.document.variant(vid).status == Status.RUNNING:
                    self.document.set_status(vid, Status.INTERRUPTED, error=CLOSED_MESSAGE)
        await self._stop_engine()

    async def _stop_engine(self) -> None:
        engine, consumer = self.engine, self._consumer
        self.engine, self._consumer = None, None
        self._jobs.clear()
        self._current = None
        if engine is not None:
            await engine.aclose()
        if consumer is not None:
            try:
                await asyncio.wait_for(consumer, 10)
            except (TimeoutError, asyncio.CancelledError):
                consumer.cancel()

    async def reconfigure(self, config: WorkerConfig) -> None:
        """Uses ``config`` for the engine: restarts it now when idle, else after the running
        job (the queue is kept)."""
        self.config = config
        if self._current is None:
            await self._restart()
        else:
            self._restart_wanted = True

    async def _restart(self) -> None:
        self._restart_wanted = False
        if self._closed:
            return
        await self._stop_engine()
        await self.start()

    # -- queries ----------------------------------------------------------------------------
    def progress(self, variant_id: str) -> JobProgress | None:
        """The last progress of a running variant, or None."""
        return self._progress.get(variant_id)

    def preview(self, variant_id: str) -> np.ndarray | None:
        """The last step preview (uint8 (h, w, 3)) of a running variant, or None."""
        return self._previews.get(variant_id)

    @property
    def running_variant(self) -> str | None:
        """The variant whose job the engine holds now, if any."""
        job = self._current
        return job.variant_id if job is not None and not job.orphan else None

    def is_saving(self, variant_id: str) -> bool:
        """Whether the variant's result is being written to the store."""
        return variant_id in self._saving

    # -- user actions -----------------------------------------------------------------------
    def generate(
        self, requests: Sequence[GenerationRequest], parent_id: str | None = None,
        names: Sequence[str] = (),
    ) -> list[str]:
        """Adds one queued variant per request under ``parent_id`` as one undo step.

        Returns:
            The new variant ids, in order.
        """
        doc = self.document
        if parent_id is not None and not doc.has_variant(parent_id):
            parent_id = None
        ids = []
        with doc.history.group(f"Generate {len(requests)}" if len(requests) > 1 else "Generate"):
            for i, request in enumerate(requests):
                command = AddVariant(
                    request.to_json(), request.content_id, parent_id=parent_id,
                    name=names[i] if i < len(names) else "",
                )
                doc.history.push(command)
                ids.append(command.variant_id)
        return ids

    def cancel(self, variant_id: str) -> bool:
        """Cancels a queued or running variant; False when it has no job to cancel."""
        doc = self.document
        if not doc.has_variant(variant_id):
            return False
        for job in self._jobs.values():
            if job.variant_id == variant_id and not job.orphan and job.job_id:
                return bool(self.engine and self.engine.cancel(job.job_id))
        if self._current is not None and self._current.variant_id == variant_id:
            self._current = None  # it was reading its inputs
            self._schedule_dispatch()
        if doc.variant(variant_id).status == Status.QUEUED:
            doc.set_status(variant_id, Status.CANCELLED, error="Cancelled before it started.")
            return True
        return False

    def retry(self, variant_id: str) -> None:
        """Queues a failed, cancelled or interrupted variant again."""
        self.document.retry(variant_id)

    def move_job(self, variant_id: str, index: int) -> None:
        """Moves a waiting variant in the queue (0 = first)."""
        self.document.move_job(variant_id, index)

    # -- inputs -----------------------------------------------------------------------------
    def import_image(
        self, source: bytes | Path, name: str, field: str,
        on_done: Callable[[MediaRef, np.ndarray], None],
        on_error: Callable[[str], None],
    ) -> None:
        """Reads and decodes a dropped, pasted or loaded image off the GUI thread
        (:func:`~studio.core.media.decode_user_image`), stores its converted pixels and calls
        ``on_done(ref, pixels)``; a missing or damaged file calls ``on_error(message)`` and
        leaves the project unchanged.

        Args:
            source: the file's bytes, or its path.
            name: the file name (shown and recorded in the request).
            field: the request field it is for (named in messages).
        """
        media = self.project.media

        def work() -> tuple[UserImage, StagedMedia]:
            if isinstance(source, Path):
                image = load_user_image(source, field)
            else:
                image = decode_user_image(source, name, field)
            return image, media.stage_image(image.pixels, {"source": image.source})

        def done(result: tuple[UserImage, StagedMedia]) -> None:
            image, staged = result
            try:
                media.commit(staged)
            except OSError as exc:
                on_error(f"{field}: could not store {name} in the project ({exc})")
                return
            on_done(MediaRef(image.content_id, image.source, image.conversion), image.pixels)

        def error(exc: BaseException) -> None:
            if isinstance(exc, ValueError):
                on_error(str(exc))
            else:
                log.error("importing %s failed", name, exc_info=exc)
                on_error(f"{field}: could not read {name} ({exc})")

        self._bg.submit(work, on_done=done, on_error=error)

    def input_from_frame(
        self, pixels: np.ndarray, source: str,
        on_done: Callable[[MediaRef, np.ndarray], None],
        on_error: Callable[[str], None],
    ) -> None:
        """Stores one result frame (uint8 (H, W, 3)) as an input image and calls ``on_done``."""
        media = self.project.media
        frame = np.ascontiguousarray(pixels[..., :3])

        def done(staged: StagedMedia) -> None:
            try:
                media.commit(staged)
            except OSError as exc:
                on_error(f"could not store the frame ({exc})")
                return
            on_done(MediaRef(staged.pixels_id, source, "result frame, 8-bit RGB as is"), frame)

        self._bg.submit(media.stage_image, frame, {"source": source}, on_done=done,
                        on_error=lambda exc: on_error(f"could not store the frame ({exc})"))

    def _input_sources(self, request: GenerationRequest) -> list[tuple[str, Path, list[int]]]:
        media = self.project.media
        sources = []
        for name, ref in request.media_refs():
            media_id = media.find_by_pixels(ref.content_id)
            if media_id is None:
                raise KeyError(f"{name}: the input image {ref.source or ref.content_id} is not "
                               f"in this project any more; set the input again")
            sources.append((ref.content_id, media.path(media_id),
                            media.info(media_id)["meta"]["shape"]))
        return sources

    # -- dispatch ---------------------------------------------------------------------------
    def _schedule_dispatch(self) -> None:
        if self._dispatch_pending or self._closed:
            return
        self._dispatch_pending = True
        QTimer.singleShot(0, self._dispatch)

    def _dispatch(self) -> None:
        self._dispatch_pending = False
        if self._closed or self.engine is None or self._current is not None:
            return
        if self._restart_wanted:
            asyncio.ensure_future(self._restart())
            return
        doc = self.document
        # a variant whose result is being written is not run again: an undo and redo while
        # the save was in flight brings it back queued, and the save then finishes it
        vid = next((v for v in doc.queue()
                    if doc.variant(v).status == Status.QUEUED and v not in self._saving), None)
        if vid is None:
            return
        try:
            request = GenerationRequest.from_json(doc.variant(vid).request_json)
            sources = self._input_sources(request)
        except (ValueError, KeyError, OSError) as exc:
            message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
            doc.fail(vid, str(message))
            self.notice.emit(str(message), True)
            self._schedule_dispatch()
            return
        job = self._current = _Job(vid)
        if not sources:
            self._submit(job, request, {})
            return

        def loaded(inputs: dict[str, np.ndarray]) -> None:
            if self._current is job and doc.has_variant(vid):
                self._submit(job, request, inputs)

        def failed(exc: BaseException) -> None:
            if self._current is job:
                self._current = None
                if doc.has_variant(vid) and doc.variant(vid).status == Status.QUEUED:
                    doc.fail(vid, f"could not read an input image ({exc})")
                self._schedule_dispatch()

        self._bg.submit(_read_inputs, sources, on_done=loaded, on_error=failed)

    def _submit(self, job: _Job, request: GenerationRequest, inputs: dict) -> None:
        if self.engine is None:
            self._current = None
            return
        job.job_id = self.engine.submit(request, inputs)
        self._jobs[job.job_id] = job

    # -- engine events ----------------------------------------------------------------------
    def _on_event(self, event: ev.JobEvent) -> None:
        job = self._jobs.get(event.job_id)
        if job is None:
            return
        if event.terminal:
            del self._jobs[event.job_id]
            if self._current is job:
                self._current = None
                self._schedule_dispatch()
        vid = job.variant_id
        doc = self.document
        if job.orphan or not doc.has_variant(vid):
            return
        status = doc.variant(vid).status
        if isinstance(event, ev.Started):
            if status == Status.QUEUED:
                doc.set_status(vid, Status.RUNNING)
        elif isinstance(event, ev.Progress):
            self._progress[vid] = JobProgress(event.step, event.total_steps, event.elapsed_s,
                                              event.eta_s)
            if event.preview is not None:
                self._previews[vid] = event.preview
                self.previewReady.emit(vid)
            self.progressChanged.emit(vid)
        elif isinstance(event, ev.Finished):
            self._save(vid, event)
        elif isinstance(event, ev.Failed):
            self._end(vid)
            if status in PENDING:
                doc.fail(vid, event.message or "the engine failed without a message")
            self.notice.emit(f"Generation failed: {event.message}", True)
        elif isinstance(event, ev.Cancelled):
            self._end(vid)
            if status in PENDING:
                doc.set_status(vid, Status.CANCELLED, error="Cancelled.")

    def _end(self, vid: str) -> None:
        self._progress.pop(vid, None)
        self._previews.pop(vid, None)
        self.progressChanged.emit(vid)

    def _save(self, vid: str, event: ev.Finished) -> None:
        frames = event.frames
        kind = "image" if len(frames) == 1 else "video"
        # The engine's copy of the request names the exact weights (model_hash) even when the
        # draft was queued before the studio had hashed them; exports embed this copy.
        extra = {"fps": event.fps, "environment": event.environment, "timings": event.timings,
                 "request_json": event.request_json, "notes": list(event.notes)}
        # what the model ignored of the user's input is said at once; the rest (what the
        # levers did) stays with the result
        about_input = [n for n in event.notes if n.startswith(INPUT_NOTE_PREFIXES)]
        media = self.project.media

        def stage() -> StagedMedia:
            if kind == "image":
                return media.stage_image(frames[0], extra)
            return media.stage_video(frames, extra)

        def done(staged: StagedMedia) -> None:
            self._saving.pop(vid, None)
            self._end(vid)
            doc = self.document
            if not doc.has_variant(vid) or doc.variant(vid).status not in PENDING:
                media.release(staged)  # deleted or undone meanwhile: an orphan for the collector
                return
            # the media row first (its own transaction), then the variant: a finish whose
            # save fails leaves the variant pending in memory too (Document.finish), so
            # nothing on screen names a medium the file does not have; a row left without
            # its variant is collected as garbage
            try:
                with self.project.save_errors_raised():
                    media_id = media.commit(staged)
                    doc.finish(vid, [Artifact(media_id, kind)])
            except Exception as exc:
                log.exception("saving the result of %s failed", vid)
                self._save_failed(vid, exc)
                return
            self.resultSaved.emit(vid)
            if about_input:
                self.notice.emit("Note: " + "; ".join(about_input), False)
            else:  # what ran, from this job's own event (a stored result may be shared)
                from studio.ui.variants import variant_label  # (variants imports this module)

                self.notice.emit(finished_text(variant_label(doc.variant(vid)), event.timings,
                                               event.notes), False)

        def error(exc: BaseException) -> None:
            self._saving.pop(vid, None)
            self._end(vid)
            log.error("writing the result of %s failed", vid, exc_info=exc)
            self._save_failed(vid, exc)

        self._saving[vid] = self._bg.submit(stage, on_done=done, on_error=error)

    def _save_failed(self, vid: str, exc: BaseException) -> None:
        doc = self.document
        message = f"the result could not be saved in the project ({exc})"
        if doc.has_variant(vid) and doc.variant(vid).status in PENDING:
            doc.fail(vid, message)
        self.notice.emit(message, True)

    # -- document changes -------------------------------------------------------------------
    def _on_document(self, events: Sequence[ChangeEvent]) -> None:
        for event in events:
            if event.kind == VARIANTS_REMOVED:
                self._forget(event.ids)
            if event.kind in (QUEUE_CHANGED, VARIANTS_ADDED, VARIANTS_CHANGED):
                self._schedule_dispatch()

    def _forget(self, removed_ids: Iterable[str]) -> None:
        removed = set(removed_ids)
        for job in self._jobs.values():
            if job.variant_id in removed and not job.orphan:
                job.orphan = True
                if self.engine is not None and job.job_id:
                    self.engine.cancel(job.job_id)
        current = self._current
        if current is not None and current.job_id is None and current.variant_id in removed:
            self._current = None
            self._schedule_dispatch()
        for vid in removed:
            self._progress.pop(vid, None)
            self._previews.pop(vid, None)


def describe(request: dict[str, Any]) -> str:
    """A one-line summary of a request dict for labels: mode, size, frames, seed."""
    size = f"{request.get('width')}x{request.get('height')}"
    frames = request.get("num_frames", 1)
    what = f"{size}, {frames} frames" if frames and frames > 1 else size
    return f"{request.get('mode')} · {what} · seed {request.get('seed')}"
