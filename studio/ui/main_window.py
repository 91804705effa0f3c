"""The studio window: docks around a canvas, the actions, and their wiring.

Docks (movable, floatable; the layout is saved in QSettings): Prompt & settings, Variants,
Timeline, Queue. The centre holds the Canvas and the Compare view as tabs. Every user action
is a QAction (menus, context menus, shortcuts and tests use the same ones):

    Ctrl+Enter generate · Space play/pause · Left/Right frame step · Ctrl+Z / Ctrl+Shift+Z
    undo/redo · Delete delete variants (or the timeline shot when the timeline has focus) ·
    F2 rename · Ctrl+V paste an image as input · Ctrl+0 fit · Ctrl+1 100%

Text fields keep their own keys (Space types a space in the prompt; Ctrl+Z undoes typing):
Qt gives a focused text widget first refusal of such shortcuts.

The window also ties together what spans panels: the canvas's Mask tool follows the settings
panel's init image and hands its mask to the draft (stored in the project's media when it is
generated with); the timeline's Play shows the storyboard in the canvas; and a
:class:`~studio.ui.garbage.MediaCollector` deletes media the document and its (bounded) undo
history no longer refer to, off the GUI thread, when the history lets go of some, when the
window starts and when it shuts down.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sqlite3
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PySide6.QtCore import QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QCloseEvent, QGuiApplication, QImage, QShowEvent
from PySide6.QtWidgets import (
    QApplication,
    QDockWidget,
    QFileDialog,
    QLabel,
    QMainWindow,
    QTabWidget,
    QWidget,
)

from studio.core.commands import (
    AddVariant,
    DeleteVariant,
    RenameVariant,
    StarVariant,
    clean_variant_name,
)
from studio.core.document import (
    PENDING,
    QUEUE_CHANGED,
    RETRYABLE,
    VARIANTS_CHANGED,
    ChangeEvent,
    Status,
)
from studio.core.request import GenerationRequest, MediaRef
from studio.engine.models.registry import ModelRegistry
from studio.store.project import Project
from studio.ui.actions import create_actions, create_menus, popup_variant_menu
from studio.ui.background import Background
from studio.ui.canvas import Canvas
from studio.ui.compare import CompareView
from studio.ui.controller import EngineFactory, StudioController
from studio.ui.exporting import (
    ExportError,
    default_suffix,
    export_contact_sheet,
    export_variant,
    settings_text,
)
from studio.ui.garbage import MediaCollector
from studio.ui.mask_tool import MaskLink
from studio.ui.media_cache import MediaCache
from studio.ui.params import ParamsPanel
from studio.ui.queue_panel import QueueModel, QueuePanel, format_eta
from studio.ui.settings import AppSettings, SettingsDialog
from studio.ui.storyboard_playback import StoryboardPlayback
from studio.ui.timeline import TimelineModel, TimelinePanel
from studio.ui.variants import VariantPanel, VariantTreeModel, variant_label

log = logging.getLogger(__name__)

#: the draft is saved in the project this long after the last edit (and at close)
DRAFT_SAVE_DELAY_MS = 500
SAVE_RETRY_MS = 5000  # a failed save of the project is tried again this often
MAX_MESSAGE_CHARS = 600  # longer messages are cut in the status bar and the banner

INPUT_FIELDS = {"init_image": "init image", "first_frame": "first frame",
                "references": "reference"}


def drop_bad_attention_override() -> str:
    """Checks ``STUDIO_ATTENTION`` and ``STUDIO_CPU_THREADS`` before the engine starts. A bad
    value is removed from this process's environment (so the engine, which inherits it, runs
    each profile's own attention, or torch's default threads, instead of failing every job)
    and described in the returned notice; "" when both are unset or valid."""
    from studio.engine.api import ATTENTION_ENV, attention_override
    from studio.engine.worker import CPU_THREADS_ENV, cpu_threads_auto

    notices = []
    for env, check, fallback in (
            (ATTENTION_ENV, attention_override, "Each profile's own attention runs."),
            (CPU_THREADS_ENV, cpu_threads_auto, "Jobs run on torch's default thread count.")):
        try:
            check()
        except ValueError as exc:
            value = os.environ.pop(env, "")
            notices.append(f"{env}={value!r} is ignored: {str(exc).split(': ', 1)[-1]}. "
                           f"{fallback}")
    return " ".join(notices)


class MainWindow(QMainWindow):
    """The studio window over one open project.

    Args:
        project: the open project (the window never closes it; the caller does).
        settings: application settings (a QSettings store).
        engine_factory: makes the engine (tests: a thread worker); default: a ProcessWorker
            configured from the settings.
        registry: where models are listed (default: from the settings' model folders).

    Actions: one QAction per command, ``window.<name>_action`` (``generate_action``,
    ``undo_action``, ``delete_action``, ...), made from the tables in :mod:`studio.ui.actions`.

    Signals:
        closed(): the window was closed; call :meth:`shutdown` next.
    """

    closed = Signal()

    def __init__(
        self,
        project: Project,
        settings: AppSettings | QSettings,
        *,
        engine_factory: EngineFactory | None = None,
        registry: ModelRegistry | None = None,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.project = project
        self.document = project.document
        self.settings = settings if isinstance(settings, AppSettings) else AppSettings(settings)
        self.registry = registry or ModelRegistry(self.settings.model_folders)
        self.next_project: Path | None = None
        self.last_message = ("", False)
        self._tasks: set[asyncio.Future] = set()
        self.model_scan: asyncio.Future | None = None  # the last Settings rescan of models
        self._restored = False
        self._shut = False
        self.setWindowTitle(f"Diffusion Studio — {project.folder.name}")
        self.background = Background(parent=self)
        self.media = MediaCache(project.media, self.background, parent=self)
        self.controller = StudioController(project, self.background,
                                           config=self.settings.worker_config(),
                                           engine_factory=engine_factory, parent=self)
        self.collector = MediaCollector(project, self.background, self._draft_media,
                                        parent=self)
        self._build_views()
        self.mask_link = MaskLink(self.canvas, self.params, project.media, self.media,
                                  self.background, self.notify, parent=self)
        self.playback = StoryboardPlayback(
            self.document, self.canvas, self.timeline,
            lambda: self.tabs.setCurrentWidget(self.canvas), self.spawn, parent=self)
        create_actions(self)
        create_menus(self)
        self._wire()
        self.params.set_models(self.registry.list(), self.registry.content_hash)
        self._draft_timer = QTimer(self, singleShot=True, interval=DRAFT_SAVE_DELAY_MS)
        self._draft_timer.timeout.connect(self.save_draft)
        # a failed save of the project's changes (disk full): said, and tried again every
        # few seconds (and with every change) until they are in the file
        self._save_retry = QTimer(self, interval=SAVE_RETRY_MS)
        self._save_retry.timeout.connect(self._retry_save)
        project.on_save_state = self._on_save_state
        # a draft restored in part (its model missing here) is not saved over the whole one
        # until the user edits the prompt or generates (the panel also changes by itself:
        # a model's hash arriving)
        self._draft_partial = False
        try:
            self._restore_draft()
        except Exception:  # a convenience: never keeps the window from opening
            log.exception("restoring the saved draft failed")
        self.params.draftChanged.connect(self._draft_timer.start)
        # "Cannot generate yet" goes once the settings are fixed, not at the next success
        self.params.draftChanged.connect(
            lambda: self.params.is_valid() and self.canvas.clear_error("draft"))
        self.params.prompt_edit.textChanged.connect(self._on_prompt_typed)
        self._unsubscribe = self.document.subscribe(self._on_document)
        self._update_actions()
        self._update_queue_status()

    # -- construction -----------------------------------------------------------------------
    def _build_views(self) -> None:
        doc = self.document
        self.canvas = Canvas(doc, self.media, self.controller)
        self.compare = CompareView(doc, self.media)
        self.tabs = QTabWidget()
        self.tabs.addTab(self.canvas, "Canvas")
        self.tabs.addTab(self.compare, "Compare")
        self.setCentralWidget(self.tabs)
        self.params = ParamsPanel(self.background)
        self.variant_model = VariantTreeModel(doc, self.media, self.controller, parent=self)
        self.variants = VariantPanel(self.variant_model)
        self.timeline_model = TimelineModel(doc, self.media, parent=self)
        self.timeline = TimelinePanel(self.timeline_model, doc, self.background, self.media)
        self.queue_model = QueueModel(doc, self.controller, parent=self)
        self.queue = QueuePanel(self.queue_model, self.controller)
        self.docks: dict[str, QDockWidget] = {}
        for name, title, widget, area in (
            ("paramsDock", "Prompt && settings", self.params, Qt.DockWidgetArea.LeftDockWidgetArea),
            ("variantsDock", "Variants", self.variants, Qt.DockWidgetArea.RightDockWidgetArea),
            ("queueDock", "Queue", self.queue, Qt.DockWidgetArea.RightDockWidgetArea),
            ("timelineDock", "Timeline", self.timeline, Qt.DockWidgetArea.BottomDockWidgetArea),
        ):
            dock = QDockWidget(title, self)  # "&&": a dock title takes "&" as a mnemonic
            dock.setObjectName(name)
            dock.setWidget(widget)
            self.addDockWidget(area, dock)
            self.docks[name] = dock
        self.queue_status = QLabel("")
        self.statusBar().addPermanentWidget(self.queue_status)
        self.resize(1400, 900)
        # the default layout (a saved one replaces it when the window is shown)
        self.resizeDocks([self.docks["timelineDock"]], [200], Qt.Orientation.Vertical)
        self.resizeDocks([self.docks["paramsDock"], self.docks["variantsDock"]], [450, 360],
                         Qt.Orientation.Horizontal)
        self.resizeDocks([self.docks["variantsDock"], self.docks["queueDock"]], [520, 260],
                         Qt.Orientation.Vertical)

    def _wire(self) -> None:
        self.params.generateRequested.connect(lambda: self._guard(self.generate))
        self.params.loadInputRequested.connect(self.ask_load_input)
        self.variants.currentChanged.connect(self._on_current_variant)
        self.variants.selectionChanged.connect(lambda *_: self._update_actions())
        self.variants.view.customContextMenuRequested.connect(
            lambda pos: popup_variant_menu(self, pos))
        self.queue.activated.connect(lambda vid: vid and self.variants.select([vid]))
        self.canvas.inputOffered.connect(lambda source, name: self.import_input(source, name))
        self.controller.notice.connect(self.notify)
        self.controller.progressChanged.connect(lambda *_: self._update_queue_status())
        self.timeline.message.connect(self.notify)
        self.compare.message.connect(self.notify)
        self.media.thumbnailReady.connect(lambda *_: self.params.update())
        self.timeline.playRequested.connect(lambda: self._guard(self.playback.toggle))

    # -- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        """Starts the engine and runs the queued variants (on the running asyncio loop)."""
        attention_notice = drop_bad_attention_override()
        await self.controller.start()
        if attention_notice:
            self.notify(attention_notice, True)
        self.collector.request()  # what the last session left behind
        if self.project.recovered:
            self.notify(f"{len(self.project.recovered)} generation(s) were interrupted when "
                        f"the studio stopped; select them in the Queue and press Retry.")

    async def shutdown(self) -> None:
        """Stops the engine and the background work; the project stays open for the caller."""
        if self._shut:
            return
        self.save_draft()
        self._shut = True
        self._save_retry.stop()
        if self.project.on_save_state == self._on_save_state:
            self.project.on_save_state = None  # the project tries once more at close
        for task in list(self._tasks):
            task.cancel()
        await self.controller.aclose()
        await self.collector.aclose(final=True)  # the undo history goes with the window
        self._unsubscribe()
        for model in (self.variant_model, self.timeline_model, self.queue_model, self.canvas,
                      self.compare, self.playback):
            model.detach()
        self.background.shutdown()

    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802
        """Restores the saved geometry and dock layout the first time."""
        if not self._restored:
            self._restored = True
            geometry, state = self.settings.window_state()
            if geometry is not None:
                self.restoreGeometry(geometry)
            if state is not None:
                self.restoreState(state)
        super().showEvent(event)

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802
        """Saves the layout and tells the app to shut down."""
        self.settings.save_window_state(self.saveGeometry(), self.saveState())
        super().closeEvent(event)
        self.closed.emit()

    # -- saving -----------------------------------------------------------------------------
    def _on_save_state(self, error: BaseException | None, pending: int) -> None:
        """The project could not save ``pending`` changes (``error``), or (None) saved them
        after all: says so, and keeps trying while they are pending."""
        if error is None:
            self._save_retry.stop()
            self.canvas.clear_error("save")
            self.notify("The project is saved again: no change was lost")
            return
        self.notify(f"Cannot save to the project ({error}): {pending} change(s) are kept "
                    f"and saved as soon as the disk takes them (free some space, and keep "
                    f"the studio open until this says they are saved)", error=True,
                    about="save")
        if not self._save_retry.isActive():
            self._save_retry.start()

    def _retry_save(self) -> None:
        try:
            self.project.save_pending()
        except (sqlite3.Error, OSError) as exc:
            log.info("saving the pending changes failed again: %s", exc)

    # -- the draft --------------------------------------------------------------------------
    def _on_prompt_typed(self) -> None:
        self._draft_partial = False

    def save_draft(self) -> None:
        """Saves the settings panel's draft in the project: the request (prompt, settings,
        inputs, mask), the seed lock and text, the batch size and the branch parent. Runs
        :data:`DRAFT_SAVE_DELAY_MS` after the last edit and at shutdown; not while a draft
        restored without its model waits for the user's first prompt edit or Generate (it
        must not overwrite the whole saved one). A failed write is logged (the draft is a
        convenience; the variants are saved on their own)."""
        self._draft_timer.stop()
        if self._shut or self._draft_partial:
            return
        params = self.params
        state = {"request": json.loads(params.draft().to_json()),
                 "seed_locked": params.seed_lock.isChecked(),
                 "seed_text": params.seed_edit.text(),
                 "batch": params.batch_spin.value(),
                 "parent_id": params.parent_id}
        try:
            self.project.save_draft(state)
        except (OSError, sqlite3.Error, ValueError) as exc:
            log.warning("saving the draft failed: %s", exc)

    def _restore_draft(self) -> None:
        """Puts the project's saved draft back in the settings panel (at open)."""
        state = self.project.load_draft()
        if not state:
            return
        try:
            request = GenerationRequest.from_dict(state["request"])
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("the saved draft is not restored: %s", exc)
            return
        params = self.params
        notes = params.set_from_request(request, self._ref_thumbnail)
        params.seed_lock.setChecked(state.get("seed_locked") is True)
        if isinstance(state.get("seed_text"), str):
            params.seed_edit.setText(state["seed_text"])
        if isinstance(state.get("batch"), int):
            params.batch_spin.setValue(state["batch"])
        parent = state.get("parent_id")
        if isinstance(parent, str) and self.document.has_variant(parent):
            params.set_parent(parent, variant_label(self.document.variant(parent)))
        if request.mode == "i2i" and request.mask is not None:
            self.mask_link.load(request.mask, "Restore the draft's mask")
        if notes:
            self._draft_partial = True
            self.notify("The last draft is back; " + "; ".join(notes))

    # -- helpers ----------------------------------------------------------------------------
    def _guard(self, fn: Callable[[], Any]) -> Any:
        """Runs an action; an unexpected error becomes a message, never a crash."""
        try:
            return fn()
        except Exception as exc:
            log.exception("action failed")
            self.notify(f"Something went wrong: {exc}", True)
            return None

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Future:
        """Runs a coroutine on the loop; its errors are reported to the user."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)

        def done(t: asyncio.Future) -> None:
            self._tasks.discard(t)
            if t.cancelled():
                return
            exc = t.exception()
            if isinstance(exc, ExportError):
                self.notify(str(exc), True)
            elif exc is not None:
                log.error("task failed", exc_info=exc)
                self.notify(f"Something went wrong: {exc}", True)

        task.add_done_callback(done)
        return task

    def notify(self, text: str, error: bool = False, about: str = "") -> None:
        """Tells the user something: the status bar, and the canvas banner for errors
        (``about``: what an error is about, see :meth:`Canvas.show_error`)."""
        self.last_message = (text, error)
        # a message quoting a 10,000-character prompt is cut for the screen (the log has it)
        shown = text if len(text) <= MAX_MESSAGE_CHARS else text[:MAX_MESSAGE_CHARS - 1] + "…"
        self.statusBar().showMessage(shown, 15000 if error else 8000)
        if error:
            self.canvas.show_error(shown, about)
            log.warning("%s", text)
        else:  # something worked: an error about an earlier attempt no longer applies
            self.canvas.clear_error()

    def active_view(self):
        """The image view of the active tab (canvas, or the compare view's first)."""
        if self.tabs.currentWidget() is self.compare:
            return self.compare._active_views()[0]
        return self.canvas.view

    def active_player(self):
        """The frame player of the active tab."""
        return self.compare.player if self.tabs.currentWidget() is self.compare \
            else self.canvas.player

    def selected_ids(self) -> list[str]:
        """The selected variants (the current one when nothing is selected)."""
        ids = self.variants.selected()
        if not ids and self.variants.current():
            ids = [self.variants.current()]
        return [v for v in ids if self.document.has_variant(v)]

    def current_id(self) -> str | None:
        """The current variant, if any."""
        vid = self.variants.current()
        return vid if vid and self.document.has_variant(vid) else None

    def _on_current_variant(self, vid: str) -> None:
        self.canvas.show_variant(vid or None)
        if vid:
            self.tabs.setCurrentWidget(self.canvas)
        self._update_actions()

    def _on_document(self, events: Sequence[ChangeEvent]) -> None:
        kinds = {e.kind for e in events}
        self._update_actions()
        if kinds & {QUEUE_CHANGED, VARIANTS_CHANGED}:
            self._update_queue_status()

    def _update_actions(self) -> None:
        h = self.document.history
        self.undo_action.setEnabled(h.can_undo)
        self.undo_action.setText(f"Undo {h.undo_label}" if h.can_undo else "Undo")
        self.redo_action.setEnabled(h.can_redo)
        self.redo_action.setText(f"Redo {h.redo_label}" if h.can_redo else "Redo")
        self.clear_history_action.setEnabled(len(h) > 0)
        ids = self.selected_ids()
        current = self.current_id()
        cv = self.document.variant(current) if current else None
        done = [v for v in ids if self.document.variant(v).status == Status.DONE]
        has = bool(ids)
        for action in (self.delete_action, self.star_action, self.rename_action):
            action.setEnabled(has)
        for action in (self.branch_action, self.copy_settings_action, self.reproduce_action):
            action.setEnabled(cv is not None)
        cur_done = cv is not None and cv.status == Status.DONE and bool(cv.artifacts)
        for action in (self.use_init_action, self.use_first_action, self.use_reference_action,
                       self.export_action):
            action.setEnabled(cur_done)
        self.add_shot_action.setEnabled(bool(ids))
        self.compare_action.setEnabled(len(done) >= 2)
        self.contact_sheet_action.setEnabled(bool(done))
        self.retry_action.setEnabled(cv is not None and cv.status in RETRYABLE)
        self.cancel_action.setEnabled(cv is not None and cv.status in PENDING)

    def _update_queue_status(self) -> None:
        doc = self.document
        waiting = sum(1 for v in doc.queue() if doc.variant(v).status == Status.QUEUED)
        running = self.controller.running_variant
        text = f"Queue: {waiting} waiting"
        if running:
            progress = self.controller.progress(running)
            if progress is not None:
                text += (f" · running {round(progress.fraction * 100)}%, "
                         f"{format_eta(progress.eta_s)}")
            else:
                text += " · starting"
        self.queue_status.setText(text)

    # -- generating -------------------------------------------------------------------------
    def generate(self) -> list[str]:
        """Queues the settings panel's batch as new variants (one undo step); selects the
        first so the canvas shows its previews. Returns the new ids ([] when invalid)."""
        self._draft_partial = False  # the user took the draft as it is now
        self.mask_link.store()
        requests = self.params.batch_requests()
        if not requests:
            problems = "; ".join(str(p) for p in self.params.problems())
            self.notify(f"Cannot generate yet: {problems}", True, about="draft")
            return []
        parent = self.params.parent_id
        gone = parent is not None and not self.document.has_variant(parent)
        if gone:
            self.params.set_parent(None)
            parent = None
        ids = self.controller.generate(requests, parent)
        self.canvas.clear_error()  # an earlier attempt's error
        self.canvas.clear_error("draft")  # "Cannot generate yet"
        if gone:  # said, not done quietly: the user asked for branches of it
            self.notify("The variant to branch from was deleted or undone: the new variants "
                        "are new roots.", False)
        self.variants.select(ids[:1])
        self.canvas.show_variant(ids[0])
        return ids

    def branch_from_current(self) -> None:
        """Prefills the settings from the current variant and makes it the next parent."""
        vid = self.current_id()
        if vid is None:
            return
        v = self.document.variant(vid)
        request = GenerationRequest.from_json(v.request_json)
        notes = self.params.set_from_request(request, self._ref_thumbnail)
        if request.mode == "i2i" and request.mask is not None:
            self.mask_link.load(request.mask, f"Mask of {variant_label(v)}")
        elif request.mode == "i2i":  # the tool keeps one mask per init image: not this one's
            self.mask_link.clear()
        self.params.set_parent(vid, variant_label(v))
        self.docks["paramsDock"].show()
        self.docks["paramsDock"].raise_()
        self.notify(f"Branching from {variant_label(v)}" + ("; " + "; ".join(notes)
                                                            if notes else ""))

    def reproduce(self) -> list[str]:
        """Runs the current variant's exact request again as a child of it."""
        vid = self.current_id()
        if vid is None:
            return []
        v = self.document.variant(vid)
        command = AddVariant(v.request_json, v.request_id, parent_id=vid,
                             name=clean_variant_name(f"{variant_label(v)} (reproduced)"))
        self.document.history.push(command)
        self.variants.select([command.variant_id])
        return [command.variant_id]

    def retry_selected(self) -> None:
        """Queues the current failed, cancelled or interrupted variant again."""
        vid = self.current_id()
        if vid and self.document.variant(vid).status in RETRYABLE:
            self.controller.retry(vid)

    def cancel_selected(self) -> None:
        """Cancels the current variant's job."""
        vid = self.current_id()
        if vid:
            self.controller.cancel(vid)

    # -- inputs -----------------------------------------------------------------------------
    def _field_for_mode(self) -> str:
        mode = self.params.mode()
        caps = self.params.capabilities()
        if mode == "r2v":
            return "references"
        if mode in ("i2v", "t2v") and caps is not None and "i2v" in caps.modes:
            return "first_frame"
        return "init_image"

    def import_input(self, source: bytes | Path, name: str, field: str | None = None) -> None:
        """Decodes an image (dropped, pasted or loaded) and sets it as an input: the field
        the current mode uses (video modes: first frame; r2v: reference; else init image).
        A damaged file is reported and changes nothing."""
        field = field or self._field_for_mode()
        self.statusBar().showMessage(f"Reading {name}…", 5000)

        def done(ref: MediaRef, pixels: np.ndarray) -> None:
            try:
                note = self.params.set_input(field, ref, pixels)
            except ValueError as exc:
                self.notify(str(exc), True)
                return
            self.canvas.clear_banner()
            self.notify(f"{name} is the {INPUT_FIELDS[field]}" + (f"; {note}" if note else ""))

        self.controller.import_image(source, name, field, done,
                                     lambda message: self.notify(message, True))

    def ask_load_input(self, field: str) -> None:
        """Asks for an image file for an input slot."""
        path, _ = QFileDialog.getOpenFileName(
            self, f"Load {INPUT_FIELDS[field]}", str(Path.home()),
            "Images (*.png *.jpg *.jpeg *.webp *.bmp *.tif *.tiff *.gif)")
        if path:
            self.import_input(Path(path), Path(path).name, field)

    def use_as_input(self, field: str, variant_id: str | None = None) -> None:
        """Uses a variant's result as an input image. For a video: the frame on the canvas
        when it is shown there, else its last frame (a new video continues where it ends)."""
        vid = variant_id or self.current_id()
        if vid is None:
            return
        v = self.document.variant(vid)
        if v.status != Status.DONE or not v.artifacts:
            self.notify(f"{variant_label(v)} has no result to use yet.", True)
            return
        art = v.artifacts[0]
        label = f"result of {variant_label(v)}"

        def set_input(ref: MediaRef, pixels: np.ndarray) -> None:
            try:
                note = self.params.set_input(field, ref, pixels)
            except ValueError as exc:
                self.notify(str(exc), True)
                return
            self.notify(f"{label} is the {INPUT_FIELDS[field]}" + (f"; {note}" if note else ""))

        def with_frames(frames: np.ndarray | None) -> None:
            if frames is None:
                self.notify(f"Cannot read the {label}.", True)
                return
            if art.kind == "image":
                pixels_id = self.media.info(art.media_id)["pixels_id"]
                set_input(MediaRef(pixels_id, label, "result, 8-bit RGB as is"),
                          np.asarray(frames[0]))
                return
            frame = self.canvas.current_frame() if self.canvas.variant_id == vid else None
            if frame is None:
                frame = np.asarray(frames[-1])
            self.controller.input_from_frame(frame, label, set_input,
                                             lambda m: self.notify(m, True))

        self.media.request_frames(art.media_id, with_frames)

    def _ref_thumbnail(self, ref: MediaRef) -> QImage | None:
        media_id = self.project.media.find_by_pixels(ref.content_id)
        return self.media.thumbnail(media_id) if media_id else None

    # -- media lifetime ---------------------------------------------------------------------
    def _draft_media(self) -> set[str]:
        """Pixels ids the settings panel holds (inputs and the mask), kept by the collector."""
        ids = {ref.content_id for ref in self.params.input_refs()}
        ref = self.mask_link.ref()
        if ref is not None:
            ids.add(ref.content_id)
        return ids

    def clear_history(self) -> None:
        """Forgets the undo history; media only it could bring back are deleted."""
        self.document.history.clear()
        self.notify("Undo history cleared.")

    # -- editing ----------------------------------------------------------------------------
    def undo(self) -> None:
        """Undoes one step (an undone running variant's job is cancelled)."""
        self.document.history.undo()

    def redo(self) -> None:
        """Redoes one step."""
        self.document.history.redo()

    def delete(self) -> None:
        """Deletes the selected variants with their branches (one undo step); with the
        timeline focused, removes its selected shot instead."""
        focus = QApplication.focusWidget()
        if focus is not None and self.timeline.isAncestorOf(focus) and self.timeline.selected():
            self.timeline.remove_selected()
            return
        self.delete_variants(self.selected_ids())

    def delete_variants(self, ids: Sequence[str]) -> None:
        """Deletes variants (their subtrees, shots and jobs go too) as one undo step."""
        doc = self.document
        chosen = set(ids)

        def has_chosen_ancestor(vid: str) -> bool:
            parent = doc.variant(vid).parent_id
            while parent is not None:
                if parent in chosen:
                    return True
                parent = doc.variant(parent).parent_id
            return False

        tops = [v for v in ids if doc.has_variant(v) and not has_chosen_ancestor(v)]
        if not tops:
            return
        with doc.history.group(f"Delete {len(tops)} variants" if len(tops) > 1 else
                               "Delete variant"):
            for vid in tops:
                doc.history.push(DeleteVariant(vid))

    def start_rename(self) -> None:
        """Opens the name editor of the current variant in the tree."""
        vid = self.current_id()
        if vid:
            self.variants.view.edit(self.variant_model.index_for(vid))

    def rename(self, variant_id: str, name: str) -> None:
        """Renames a variant (undoable); the name is made one line of at most 200
        characters (:func:`~studio.core.commands.clean_variant_name`)."""
        name = clean_variant_name(name)
        if self.document.variant(variant_id).name != name:
            self.document.history.push(RenameVariant(variant_id, name))

    def toggle_star(self) -> None:
        """Stars the selected variants, or un-stars them when all are starred."""
        ids = self.selected_ids()
        if not ids:
            return
        doc = self.document
        star = not all(doc.variant(v).starred for v in ids)
        with doc.history.group("Star" if star else "Unstar"):
            for vid in ids:
                if doc.variant(vid).starred != star:
                    doc.history.push(StarVariant(vid, star))

    def add_selected_to_timeline(self) -> list[str]:
        """Appends the selected variants to the timeline."""
        ids = self.selected_ids()
        if not ids:
            return []
        shots = self.timeline.add_variants(ids)
        self.docks["timelineDock"].show()
        return shots

    def compare_selected(self) -> bool:
        """Shows the selected variants in the compare view."""
        if self.compare.set_variants(self.selected_ids()):
            self.tabs.setCurrentWidget(self.compare)
            return True
        return False

    # -- playback ---------------------------------------------------------------------------
    def toggle_play(self) -> None:
        """Play/pause the video on the active tab."""
        self.active_player().toggle()

    def step_frame(self, delta: int) -> None:
        """Steps the video on the active tab by ``delta`` frames."""
        self.active_player().step(delta)

    # -- exports ----------------------------------------------------------------------------
    def copy_settings(self) -> None:
        """Copies the current variant's request JSON to the clipboard."""
        vid = self.current_id()
        if vid:
            QGuiApplication.clipboard().setText(settings_text(self.document, vid))
            self.notify("Settings copied (request JSON).")

    def ask_export_variant(self) -> None:
        """Asks where to export the current variant's result."""
        vid = self.current_id()
        if vid is None:
            return
        suffix = default_suffix(self.document, vid)
        filters = ("PNG image (*.png)" if suffix == ".png" else
                   "MP4 video (*.mp4);;GIF animation (*.gif);;WebP animation (*.webp)")
        name = f"{variant_label(self.document.variant(vid))[:40]}{suffix}".replace("/", "_")
        path, _ = QFileDialog.getSaveFileName(self, "Export result", name, filters)
        if path:
            if not Path(path).suffix:  # as the storyboard and contact sheet exports do
                path += suffix
            self.spawn(self.export_variant(vid, path))

    async def export_variant(self, variant_id: str, path: str | Path) -> Path:
        """Exports a variant's result with its request embedded."""
        out = await export_variant(self.document, self.media, self.background, variant_id,
                                   path)
        self.notify(f"Exported {out}")
        return out

    def ask_contact_sheet(self) -> None:
        """Asks where to write a contact sheet of the selected variants."""
        ids = self.selected_ids()
        path, _ = QFileDialog.getSaveFileName(self, "Contact sheet", "contact-sheet.png",
                                              "PNG image (*.png)")
        if path:
            if not path.lower().endswith(".png"):
                path += ".png"
            self.spawn(self.export_contact_sheet(ids, path))

    async def export_contact_sheet(self, ids: Sequence[str], path: str | Path) -> Path:
        """Writes a labelled grid of the variants' results."""
        out = await export_contact_sheet(self.document, self.media, self.background, ids, path)
        self.notify(f"Contact sheet written to {out}")
        return out

    # -- settings and projects --------------------------------------------------------------
    def open_settings(self) -> None:
        """Shows the Settings dialog and applies it (the engine restarts when idle)."""
        dialog = SettingsDialog(self.settings, self)
        if dialog.exec():
            dialog.apply()
            self.apply_settings()

    def apply_settings(self) -> None:
        """Re-reads the model folders and hands the new engine settings to the controller.

        The folders are scanned off the GUI thread (:attr:`model_scan`): a scan reads every
        weight file's header and walks each folder, seconds on a cold or network disk."""
        registry = self.registry = ModelRegistry(self.settings.model_folders)

        async def rescan() -> None:
            models = await self.background.call(registry.list)
            if self.registry is registry:  # not overtaken by a later Settings change
                self.params.set_models(models, registry.content_hash)

        self.statusBar().showMessage("Scanning the model folders…", 5000)
        self.model_scan = self.spawn(rescan())
        self.spawn(self.controller.reconfigure(self.settings.worker_config()))

    def ask_open_project(self) -> None:
        """Asks for a project folder (an empty folder makes a new project) and switches."""
        folder = QFileDialog.getExistingDirectory(self, "Open or create a project",
                                                  str(self.project.folder.parent))
        if folder:
            self.switch_project(Path(folder))

    def switch_project(self, folder: Path) -> bool:
        """Closes this project's window so that the studio opens ``folder``'s project next
        (a new one when ``folder`` is new or empty). A folder that cannot be a project (a
        file, or other files without a project: see
        :func:`studio.ui.app.project_folder_problem`) is said in the status bar and this
        project stays open; so does choosing this project's own folder. Returns whether the
        window closes."""
        from studio.ui.app import project_folder_problem

        folder = folder.expanduser().absolute()
        if folder == self.project.folder.absolute():
            self.notify(f"{folder} is the project open now")
            return False
        problem = project_folder_problem(folder)
        if problem is not None:
            self.notify(f"Cannot open that project: {problem}", error=True)
            return False
        self.next_project = folder
        self.close()
        return True
