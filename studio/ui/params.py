"""The prompt & settings panel: the widgets bound to a draft :class:`GenerationRequest`.

Every edit rebuilds the draft and validates it against the selected model's capabilities
(:meth:`GenerationRequest.validate`); each problem is shown under the field it names, and
Generate stays disabled until there are none. Modes the model cannot run are disabled in the
mode list. Size presets (1:1, 16:9, 9:16, 4:5, 4:3, 3:4) keep about the model's default pixel
count and are snapped to its spatial multiple (:func:`preset_size`).

Presets and the input slot are in :mod:`studio.ui.param_widgets`.

Seeds: with "Lock" on, Generate uses the seed shown; with it off, each Generate draws a new
random seed first (and shows it). A batch of N makes N variants with consecutive seeds.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable
from dataclasses import replace

import numpy as np
from PySide6.QtCore import Signal
from PySide6.QtGui import QImage, QStandardItemModel
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QSpinBox,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from studio.core.capabilities import MODE_NAMES, MODES, VIDEO_MODES, ModelCapabilities
from studio.core.media import fit_size
from studio.core.request import (
    MAX_SEED,
    PROFILES,
    GenerationRequest,
    MediaRef,
    OptimizationSettings,
    RequestProblem,
)
from studio.engine.models.registry import ModelEntry
from studio.ui.background import Background, thumbnail_pixels, to_qimage
from studio.ui.param_widgets import PRESETS, DecimalSpinBox, InputSlot, preset_size

CUSTOM = "Custom"
MAX_BATCH = 16
ERROR_STYLE = "color: #e0584f; font-size: 11px;"


class ParamsPanel(QWidget):
    """The draft request editor with in-place validation and the Generate button.

    Signals:
        generateRequested(): the user clicked Generate (and the draft is valid).
        draftChanged(): any setting changed.
        loadInputRequested(str): "Load…" of an input slot (its request field name).
        parentCleared(): the user stopped branching from a variant.
    """

    generateRequested = Signal()
    draftChanged = Signal()
    loadInputRequested = Signal(str)
    parentCleared = Signal()

    def __init__(self, background: Background, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._bg = background
        self._entries: dict[str, ModelEntry] = {}
        self._hashes: dict[str, str] = {}
        self._hash_fn: Callable[[ModelEntry], str] | None = None
        self._errors: dict[str, QLabel] = {}
        self._updating = False
        self._problems: list[RequestProblem] = []
        self._mask: MediaRef | None = None
        self.parent_id: str | None = None
        self._build()
        self._wire()

    # -- building ---------------------------------------------------------------------------
    def _build(self) -> None:
        self.model_combo = QComboBox()
        self.mode_combo = QComboBox()
        for mode in MODES:
            self.mode_combo.addItem(f"{mode} — {MODE_NAMES[mode]}", mode)
        self.prompt_edit = QPlainTextEdit(placeholderText="What to generate")
        self.prompt_edit.setTabChangesFocus(True)
        self.prompt_edit.setFixedHeight(80)
        self.negative_edit = QPlainTextEdit(placeholderText="What to avoid (optional)")
        self.negative_edit.setTabChangesFocus(True)
        self.negative_edit.setFixedHeight(48)
        self.init_slot = InputSlot()
        self.first_frame_slot = InputSlot()
        self.references_slot = InputSlot(multi=True)
        self.strength_spin = DecimalSpinBox(minimum=0.0, maximum=1.0, singleStep=0.05,
                                            decimals=2, value=0.8)
        self.mask_label = QLabel("")
        self.mask_label.setWordWrap(True)
        self.mask_label.hide()
        self.seed_edit = QLineEdit("1")
        self.seed_edit.setInputMask("")
        self.seed_edit.setMaxLength(19)
        self.seed_lock = QCheckBox("Lock", checked=False,
                                   toolTip="Keep this seed; unlocked, every Generate draws a "
                                           "new random seed")
        self.seed_random = QToolButton(text="Random", toolTip="Draw a random seed now")
        self.steps_spin = QSpinBox(minimum=1, maximum=1000, value=20)
        self.guidance_spin = DecimalSpinBox(minimum=0.0, maximum=100.0, singleStep=0.5,
                                            decimals=2, value=5.0)
        self.preset_combo = QComboBox()
        for name, _, _ in PRESETS:
            self.preset_combo.addItem(name)
        self.preset_combo.addItem(CUSTOM)
        self.width_spin = QSpinBox(minimum=8, maximum=16384, value=512, suffix=" px")
        self.height_spin = QSpinBox(minimum=8, maximum=16384, value=512, suffix=" px")
        self.frames_spin = QSpinBox(minimum=1, maximum=10_000, value=9)
        self.fps_spin = DecimalSpinBox(minimum=0.0, maximum=240.0, decimals=2, value=16.0)
        self.batch_spin = QSpinBox(minimum=1, maximum=MAX_BATCH, value=1,
                                   toolTip="Variants per click, with consecutive seeds")
        self.profile_combo = QComboBox()
        for profile in PROFILES:
            self.profile_combo.addItem(profile)
        self.parent_label = QLabel("")
        self.parent_label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.parent_clear = QToolButton(text="✕", toolTip="Generate new roots instead")
        self.general_error = QLabel("")
        self.general_error.setStyleSheet(ERROR_STYLE)
        self.general_error.setWordWrap(True)
        self.generate_button = QPushButton("Generate")
        self.generate_button.setToolTip("Generate (Ctrl+Enter)")
        self.generate_button.setDefault(True)

        form = self._form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)

        def row(label: str, widget: QWidget, *fields: str) -> QWidget:
            box = QWidget()
            lay = QVBoxLayout(box)
            lay.setContentsMargins(0, 0, 0, 0)
            lay.setSpacing(1)
            lay.addWidget(widget)
            err = QLabel("")
            err.setStyleSheet(ERROR_STYLE)
            err.setWordWrap(True)
            err.hide()
            lay.addWidget(err)
            for f in fields:
                self._errors[f] = err
            form.addRow(label, box)
            return box

        def hbox(*widgets: QWidget) -> QWidget:
            w = QWidget()
            lay = QHBoxLayout(w)
            lay.setContentsMargins(0, 0, 0, 0)
            for x in widgets:
                lay.addWidget(x)
            return w

        row("Model", self.model_combo, "model", "model_hash")
        row("Mode", self.mode_combo, "mode")
        row("Prompt", self.prompt_edit, "prompt")
        row("Negative", self.negative_edit, "negative_prompt")
        init_box = QWidget()
        init_lay = QVBoxLayout(init_box)
        init_lay.setContentsMargins(0, 0, 0, 0)
        init_lay.setSpacing(1)
        init_lay.addWidget(self.init_slot)
        init_lay.addWidget(self.mask_label)
        self.init_row = row("Init image", init_box, "init_image", "mask")
        self.strength_row = row("Strength", self.strength_spin, "strength")
        self.first_frame_row = row("First frame", self.first_frame_slot, "first_frame")
        self.references_row = row("References", self.references_slot, "references")
        self.references_slot.setToolTip(
            "Images of what the clip should contain. On the embedded model, write 'object' in "
            "the prompt where the reference's object goes: \"a small object slides left\".")
        row("Seed", hbox(self.seed_edit, self.seed_random, self.seed_lock), "seed")
        row("Steps", self.steps_spin, "steps")
        row("Guidance", self.guidance_spin, "guidance_scale")
        size = hbox(self.preset_combo, self.width_spin, QLabel("×"), self.height_spin)
        row("Size", size, "width", "height", "width x height")
        self.frames_row = row("Frames", self.frames_spin, "num_frames")
        self.fps_row = row("FPS", self.fps_spin, "fps")
        row("Batch", self.batch_spin)
        row("Profile", self.profile_combo, "optimization.profile")
        self.parent_row = hbox(self.parent_label, self.parent_clear)
        form.addRow("Branch of", self.parent_row)

        inner = QWidget()
        column = QVBoxLayout(inner)
        column.setContentsMargins(0, 0, 0, 0)
        column.addLayout(form)
        column.addStretch(1)
        scroll = QScrollArea()
        scroll.setWidget(inner)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QScrollArea.Shape.NoFrame)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(4, 4, 4, 4)
        outer.addWidget(scroll, 1)
        outer.addWidget(self.general_error)
        outer.addWidget(self.generate_button)
        self.setMinimumWidth(300)
        self._set_parent_label(None, "")

    def _wire(self) -> None:
        self.model_combo.currentIndexChanged.connect(self._on_model_changed)
        self.mode_combo.currentIndexChanged.connect(self._on_mode_changed)
        self.preset_combo.currentIndexChanged.connect(self._on_preset)
        for spin in (self.width_spin, self.height_spin):
            spin.valueChanged.connect(self._on_size_edited)
        for signal in (self.prompt_edit.textChanged, self.negative_edit.textChanged,
                       self.seed_edit.textChanged, self.seed_lock.toggled,
                       self.steps_spin.valueChanged,
                       self.guidance_spin.valueChanged, self.frames_spin.valueChanged,
                       self.fps_spin.valueChanged, self.strength_spin.valueChanged,
                       self.batch_spin.valueChanged, self.profile_combo.currentIndexChanged,
                       self.init_slot.changed, self.first_frame_slot.changed,
                       self.references_slot.changed):
            signal.connect(self._changed)
        self.seed_random.clicked.connect(self.randomize_seed)
        self.generate_button.clicked.connect(self._on_generate)
        self.parent_clear.clicked.connect(self.clear_parent)
        self.init_slot.loadRequested.connect(lambda: self.loadInputRequested.emit("init_image"))
        self.first_frame_slot.loadRequested.connect(
            lambda: self.loadInputRequested.emit("first_frame"))
        self.references_slot.loadRequested.connect(
            lambda: self.loadInputRequested.emit("references"))

    # -- models -----------------------------------------------------------------------------
    def set_models(
        self, entries: Iterable[ModelEntry], hash_fn: Callable[[ModelEntry], str] | None = None,
    ) -> None:
        """Fills the model list (unusable models are listed disabled with their reason).

        Args:
            hash_fn: computes a model's content hash (run on a worker thread); the draft
                carries the hash once known, so results record the exact weights.
        """
        self._hash_fn = hash_fn
        current = self.model_combo.currentData()
        self._updating = True
        self.model_combo.clear()
        self._entries = {}
        model = self.model_combo.model()
        assert isinstance(model, QStandardItemModel)
        for entry in entries:
            self._entries[entry.model_id] = entry
            label = entry.model_id if entry.usable else f"{entry.model_id} (unusable)"
            if entry.usable and entry.description.startswith("placeholder"):
                label += " (placeholder: random weights)"
            self.model_combo.addItem(label, entry.model_id)
            item = model.item(self.model_combo.count() - 1)
            item.setEnabled(entry.usable)
            item.setToolTip(entry.error or entry.description or
                            f"{entry.family}, {entry.source}, {entry.path}")
        self._updating = False
        found = self.model_combo.findData(current) if current else -1
        index = found
        if index < 0:
            index = next((i for i in range(self.model_combo.count())
                          if self._entry_at(i) is not None and self._entry_at(i).usable), -1)
        self._updating = True
        self.model_combo.setCurrentIndex(index)
        self._updating = False
        self._on_model_changed(apply_defaults=found < 0)

    def _entry_at(self, index: int) -> ModelEntry | None:
        return self._entries.get(self.model_combo.itemData(index))

    def entry(self) -> ModelEntry | None:
        """The selected model."""
        return self._entry_at(self.model_combo.currentIndex())

    def capabilities(self) -> ModelCapabilities | None:
        """The selected model's capabilities (None when there is no usable model)."""
        entry = self.entry()
        return entry.capabilities if entry is not None and entry.usable else None

    def _on_model_changed(self, *_: object, apply_defaults: bool = True) -> None:
        if self._updating:
            return
        caps = self.capabilities()
        model = self.mode_combo.model()
        assert isinstance(model, QStandardItemModel)
        for i, mode in enumerate(MODES):
            ok = caps is not None and mode in caps.modes
            model.item(i).setEnabled(ok)
            model.item(i).setToolTip("" if ok else f"not supported by "
                                     f"{caps.name if caps else 'this model'}")
        self._updating = True
        if caps is not None:
            m = caps.spatial_multiple
            self.width_spin.setSingleStep(m)
            self.height_spin.setSingleStep(m)
            self.frames_spin.setSingleStep(max(1, caps.frame_multiple))
            self.steps_spin.setMaximum(max(caps.max_steps, 1))
            self.guidance_spin.setRange(*caps.guidance_range)
            if apply_defaults:
                self.steps_spin.setValue(caps.default_steps)
                self.guidance_spin.setValue(caps.default_guidance)
                self.frames_spin.setValue(caps.default_frames if caps.default_frames > 1
                                          else caps.nearest_frames(9))
                self.fps_spin.setValue(caps.default_fps)
                self.width_spin.setValue(caps.default_width)
                self.height_spin.setValue(caps.default_height)
                self._select_preset_for_size()
            if self.mode() not in caps.modes:
                first = next(m for m in MODES if m in caps.modes)
                self.mode_combo.setCurrentIndex(MODES.index(first))
        self._updating = False
        self._request_hash()
        self._on_mode_changed()

    def _request_hash(self) -> None:
        entry = self.entry()
        if entry is None or not entry.usable or self._hash_fn is None:
            return
        if entry.model_id in self._hashes:
            return
        self._hashes[entry.model_id] = ""  # computing

        def done(value: str, mid: str = entry.model_id) -> None:
            self._hashes[mid] = value
            self._changed()

        self._bg.submit(self._hash_fn, entry, on_done=done,  # minutes for 30 GB of weights
                        on_error=lambda exc: self._hashes.pop(entry.model_id, None),
                        detached=True)  # a close does not wait for it

    def model_hash(self) -> str:
        """The selected model's content hash ("" while it is computed)."""
        entry = self.entry()
        return self._hashes.get(entry.model_id, "") if entry is not None else ""

    # -- mode and size ----------------------------------------------------------------------
    def mode(self) -> str:
        """The selected mode (t2i, i2i, t2v, i2v, r2v)."""
        return self.mode_combo.currentData() or "t2i"

    def set_mode(self, mode: str) -> bool:
        """Selects a mode; False when the model does not support it."""
        caps = self.capabilities()
        if caps is None or mode not in caps.modes:
            return False
        self.mode_combo.setCurrentIndex(MODES.index(mode))
        return True

    def _on_mode_changed(self, *_: object) -> None:
        if self._updating:
            return
        mode = self.mode()
        video = mode in VIDEO_MODES
        self.frames_row.setEnabled(video)
        self.fps_row.setEnabled(video)
        for row, shown in ((self.init_row, mode == "i2i"), (self.strength_row, mode == "i2i"),
                           (self.first_frame_row, mode == "i2v"),
                           (self.references_row, mode == "r2v")):
            self._form.setRowVisible(row, shown)
        self._changed()

    def _on_preset(self, index: int) -> None:
        caps = self.capabilities()
        if self._updating or caps is None or index >= len(PRESETS):
            return
        _, rw, rh = PRESETS[index]
        w, h = preset_size(rw, rh, caps)
        self._updating = True
        self.width_spin.setValue(w)
        self.height_spin.setValue(h)
        self._updating = False
        self._changed()

    def set_preset(self, name: str) -> None:
        """Selects a size preset by name (e.g. "Landscape 16:9")."""
        index = self.preset_combo.findText(name)
        if index < 0:
            raise ValueError(f"preset: unknown preset {name!r}")
        if index == self.preset_combo.currentIndex():
            self._on_preset(index)
        self.preset_combo.setCurrentIndex(index)

    def _on_size_edited(self, *_: object) -> None:
        if self._updating:
            return
        self._select_preset_for_size()
        self._changed()

    def _select_preset_for_size(self) -> None:
        caps = self.capabilities()
        size = (self.width_spin.value(), self.height_spin.value())
        name = CUSTOM
        if caps is not None:
            for preset, rw, rh in PRESETS:
                if preset_size(rw, rh, caps) == size:
                    name = preset
                    break
        was = self._updating
        self._updating = True
        self.preset_combo.setCurrentIndex(self.preset_combo.findText(name))
        self._updating = was

    def set_size(self, width: int, height: int) -> None:
        """Sets the output size (the preset follows)."""
        self._updating = True
        self.width_spin.setValue(width)
        self.height_spin.setValue(height)
        self._updating = False
        self._select_preset_for_size()
        self._changed()

    # -- seeds ------------------------------------------------------------------------------
    def seed(self) -> int:
        """The seed field as a number (-1 when it is not a whole number)."""
        text = self.seed_edit.text().strip()
        return int(text) if text.isascii() and text.isdigit() else -1

    def set_seed(self, seed: int, lock: bool | None = None) -> None:
        """Shows ``seed``; optionally locks or unlocks it."""
        self.seed_edit.setText(str(seed))
        if lock is not None:
            self.seed_lock.setChecked(lock)

    def randomize_seed(self) -> None:
        """Draws a random seed (below 2**32, so it is easy to read and type)."""
        self.seed_edit.setText(str(secrets.randbelow(2**32)))

    # -- inputs -----------------------------------------------------------------------------
    def slot(self, field: str) -> InputSlot:
        """The input slot of a request field (init_image, first_frame or references)."""
        return {"init_image": self.init_slot, "first_frame": self.first_frame_slot,
                "references": self.references_slot}[field]

    def set_input(self, field: str, ref: MediaRef, pixels: np.ndarray | None) -> str:
        """Puts an input image in a slot, switches to the mode using it and, for an init
        image or first frame, fits the output size to the image (the CLI's rule).

        Returns:
            A note for the user ("" when nothing needs saying).
        Raises:
            ValueError: a reference beyond the model's several (nothing changes); past a
                model's single reference, the new one replaces it (said in the note).
        """
        thumb = to_qimage(thumbnail_pixels(pixels, 64)) if pixels is not None else None
        note = ""
        caps = self.capabilities()
        if field == "references" and caps is not None and caps.max_references >= 1 \
                and len(self.references_slot.refs()) >= caps.max_references:
            if caps.max_references > 1:  # the user picks which one goes
                raise ValueError(f"references: {caps.name} takes at most "
                                 f"{caps.max_references}; clear the references first (this "
                                 f"one was not added)")
            self.references_slot.clear()
            note = f"this reference replaces the one before ({caps.name} takes one)"
        self.slot(field).add(ref, thumb)
        mode = {"init_image": "i2i", "first_frame": "i2v", "references": "r2v"}[field]
        if self.mode() != mode and not self.set_mode(mode):
            entry = self.entry()
            note = (f"{MODE_NAMES[mode]} is not supported by "
                    f"{entry.model_id if entry else 'this model'}; the image is kept for a "
                    f"model that does")
        caps = self.capabilities()
        if field != "references" and pixels is not None and caps is not None:
            h, w = pixels.shape[:2]
            size = fit_size((w, h), caps.spatial_multiple, caps.max_pixels, caps.min_size,
                            caps.max_size)
            self.set_size(*size)
            if size != (w, h):
                note = note or (f"size: using {size[0]}x{size[1]} for the {w}x{h} image "
                                f"(resized to cover and centre-cropped)")
        self._changed()
        return note

    def set_mask(self, ref: MediaRef | None, note: str = "") -> None:
        """The inpainting mask painted on the init image (None: repaint everything); the
        draft carries it in image-to-image mode. ``note`` is shown under the init image."""
        self.mask_label.setText(note if ref is not None else "")
        self.mask_label.setVisible(ref is not None and bool(note))
        if ref != self._mask:
            self._mask = ref
            self._changed()

    def mask_ref(self) -> MediaRef | None:
        """The mask the draft carries in image-to-image mode (None: none)."""
        return self._mask

    def input_refs(self) -> list[MediaRef]:
        """Every input the panel holds, mask included (their media must stay stored)."""
        refs = [*self.init_slot.refs(), *self.first_frame_slot.refs(),
                *self.references_slot.refs()]
        return refs + ([self._mask] if self._mask is not None else [])

    # -- the draft --------------------------------------------------------------------------
    def draft(self) -> GenerationRequest:
        """The request the widgets describe now (it may be invalid; see :meth:`problems`)."""
        entry = self.entry()
        mode = self.mode()
        video = mode in VIDEO_MODES
        init = self.init_slot.refs()
        first = self.first_frame_slot.refs()
        return GenerationRequest(
            mode=mode,
            model=entry.model_id if entry is not None else "",
            prompt=self.prompt_edit.toPlainText(),
            negative_prompt=self.negative_edit.toPlainText(),
            seed=self.seed(),
            steps=self.steps_spin.value(),
            guidance_scale=round(self.guidance_spin.value(), 4),
            width=self.width_spin.value(),
            height=self.height_spin.value(),
            num_frames=self.frames_spin.value() if video else 1,
            fps=round(self.fps_spin.value(), 4),
            model_hash=self.model_hash(),
            init_image=init[0] if mode == "i2i" and init else None,
            strength=round(self.strength_spin.value(), 4),
            mask=self._mask if mode == "i2i" and init else None,
            first_frame=first[0] if mode == "i2v" and first else None,
            references=self.references_slot.refs() if mode == "r2v" else (),
            optimization=OptimizationSettings(self.profile_combo.currentText()),
        )

    def problems(self) -> list[RequestProblem]:
        """Every problem of the draft against the selected model."""
        caps = self.capabilities()
        if caps is None:
            return [RequestProblem("model", "", "no usable model; add a model folder in "
                                               "Settings")]
        problems = self.draft().validate(caps)
        if not self.seed_lock.isChecked():  # Generate draws a new seed: the text is moot
            return [p for p in problems if p.field != "seed"]
        text = self.seed_edit.text().strip()
        if not (text.isascii() and text.isdigit()):  # what is wrong with it, not its -1
            if not text:
                why = "is empty: type a whole number, or press Random"
            elif text.isascii() and text.lstrip("+-").isdigit():
                why = "must be in [0, 9223372036854775807]"
            else:
                why = "is not a whole number (0 to 9223372036854775807)"
            problems = [p for p in problems if p.field != "seed"] + [
                RequestProblem("seed", text, why)]
        return problems

    def is_valid(self) -> bool:
        """Whether Generate can run."""
        return not self._problems

    def error_text(self, field: str) -> str:
        """The problem shown under a field ("" when none)."""
        label = self._errors.get(field)
        return label.text() if label is not None and label.isVisibleTo(self) else ""

    def _changed(self, *_: object) -> None:
        if self._updating:
            return
        self._problems = self.problems()
        shown: dict[QLabel, list[str]] = {}
        general = []
        for p in self._problems:
            label = self._errors.get(p.field)
            if label is None:
                general.append(str(p))
            else:
                shown.setdefault(label, []).append(p.rule if label is not self._errors.get(
                    "width") else str(p))
        for label in set(self._errors.values()):
            lines = list(dict.fromkeys(shown.get(label, [])))  # one label serves several fields
            label.setText("\n".join(lines))
            label.setVisible(bool(lines))
        self.general_error.setText("\n".join(general))
        self.general_error.setVisible(bool(general))
        self.generate_button.setEnabled(not self._problems)
        self.generate_button.setToolTip(
            "Generate (Ctrl+Enter)" if not self._problems else
            "Fix the settings marked in red first:\n" + "\n".join(str(p) for p in self._problems))
        self.draftChanged.emit()

    def batch_requests(self) -> list[GenerationRequest]:
        """The requests one Generate click makes: N variants with consecutive seeds.

        Unlocked, a new random seed is drawn first. Returns [] when the draft is invalid.
        """
        if not self.seed_lock.isChecked():
            self.randomize_seed()
        self._changed()
        if self._problems:
            return []
        base = self.draft()
        return [replace(base, seed=(base.seed + i) % (MAX_SEED + 1))
                for i in range(self.batch_spin.value())]

    def _on_generate(self) -> None:
        if self.is_valid():
            self.generateRequested.emit()

    # -- prefill ----------------------------------------------------------------------------
    def set_from_request(
        self, request: GenerationRequest,
        thumbnail: Callable[[MediaRef], QImage | None] = lambda ref: None,
    ) -> list[str]:
        """Fills every widget from ``request`` (branching); the seed is locked.

        Returns:
            Notes for the user (e.g. the request's model is not available here).
        """
        notes = []
        index = self.model_combo.findData(request.model)
        if index >= 0 and self._entry_at(index) is not None and self._entry_at(index).usable:
            if index != self.model_combo.currentIndex():
                self._updating = True
                self.model_combo.setCurrentIndex(index)
                self._updating = False
                self._on_model_changed(apply_defaults=False)
        else:
            notes.append(f"model: {request.model} is not available; keeping "
                         f"{self.model_combo.currentData()}")
        self._updating = True
        try:
            if not self.set_mode(request.mode):
                notes.append(f"mode: {request.mode} is not supported by the selected model")
            self.prompt_edit.setPlainText(request.prompt)
            self.negative_edit.setPlainText(request.negative_prompt)
            self.set_seed(request.seed, lock=True)
            self.steps_spin.setValue(request.steps)
            self.guidance_spin.setValue(request.guidance_scale)
            self.width_spin.setValue(request.width)
            self.height_spin.setValue(request.height)
            if request.is_video:
                self.frames_spin.setValue(request.num_frames)
            self.fps_spin.setValue(request.fps)
            self.strength_spin.setValue(request.strength)
            self.profile_combo.setCurrentText(request.optimization.profile)
            self.init_slot.set_items([(r, thumbnail(r)) for r in (request.init_image,) if r])
            self._mask = request.mask
            self.first_frame_slot.set_items(
                [(r, thumbnail(r)) for r in (request.first_frame,) if r])
            self.references_slot.set_items([(r, thumbnail(r)) for r in request.references])
        finally:
            self._updating = False
        self._select_preset_for_size()
        self._on_mode_changed()
        return notes

    def set_parent(self, variant_id: str | None, label: str = "") -> None:
        """Makes the next Generate a child of ``variant_id`` (None: new roots)."""
        self.parent_id = variant_id
        self._set_parent_label(variant_id, label)

    def clear_parent(self) -> None:
        """Stops branching: the next Generate makes a root."""
        self.set_parent(None)
        self.parentCleared.emit()

    def _set_parent_label(self, variant_id: str | None, label: str) -> None:
        self.parent_label.setText(label or (variant_id[:8] if variant_id else "— (new root)"))
        self.parent_clear.setEnabled(variant_id is not None)
