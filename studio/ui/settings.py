"""Application settings (QSettings) and the Settings dialog.

Kept across restarts: model folders, device (auto/cpu/cuda), memory budget, multi-GPU plan,
the window's geometry and dock layout, the last project. Model folders and the device are
passed to the engine's :class:`~studio.engine.worker.WorkerConfig`, the memory budget
included (the engine's memory planner fits each job into it, :mod:`studio.engine.memory`),
and the plan (one job split over several GPUs, :mod:`studio.engine.parallel`): the dialog
offers only the plans that fit the GPUs this machine shows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import QByteArray, QSettings
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QListWidget,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from studio.engine.api import ParallelConfig, available_plans, visible_gpus
from studio.engine.worker import WorkerConfig
from studio.paths import expand_path
from studio.ui.param_widgets import DecimalSpinBox

DEVICES = ("auto", "cpu", "cuda")


class AppSettings:
    """Typed access to the studio's QSettings.

    Args:
        settings: the store (tests pass an INI file in a temporary folder).
    """

    def __init__(self, settings: QSettings) -> None:
        self.qsettings = settings

    def _get(self, key: str, default: Any) -> Any:
        value = self.qsettings.value(key, default)
        return default if value is None else value

    @property
    def model_folders(self) -> list[str]:
        """Folders whose sub-folders are diffusers models."""
        value = self._get("engine/model_folders", [])
        if isinstance(value, str):
            value = [value] if value else []
        return [str(v) for v in value if str(v)]

    @model_folders.setter
    def model_folders(self, folders: list[str]) -> None:
        self.qsettings.setValue("engine/model_folders", list(folders))

    @property
    def device(self) -> str:
        """``auto``, ``cpu`` or ``cuda`` (a stored ``cuda`` reads as ``auto`` on a machine
        that shows no NVIDIA GPU)."""
        value = str(self._get("engine/device", "auto"))
        if value == "cuda" and visible_gpus() == 0:
            return "auto"
        return value if value in DEVICES else "auto"

    @device.setter
    def device(self, device: str) -> None:
        if device not in DEVICES:
            raise ValueError(f"device: expected one of {DEVICES}, got {device!r}")
        self.qsettings.setValue("engine/device", device)

    @property
    def memory_budget_gb(self) -> float:
        """Device memory the engine may use, in GiB (0 = automatic)."""
        try:
            return max(0.0, float(self._get("engine/memory_budget_gb", 0.0)))
        except (TypeError, ValueError):
            return 0.0

    @memory_budget_gb.setter
    def memory_budget_gb(self, value: float) -> None:
        self.qsettings.setValue("engine/memory_budget_gb", float(value))

    @property
    def parallel_plan(self) -> ParallelConfig:
        """The multi-GPU plan; the single device when none is set or the stored plan no
        longer fits the GPUs present."""
        stored = str(self._get("engine/parallel", ""))
        for _, plan in available_plans(visible_gpus()):
            if stored == _plan_key(plan):
                return plan
        return ParallelConfig()

    @parallel_plan.setter
    def parallel_plan(self, plan: ParallelConfig) -> None:
        self.qsettings.setValue("engine/parallel", _plan_key(plan))

    @property
    def last_project(self) -> str:
        """The folder of the project opened last ("" if none)."""
        return str(self._get("app/last_project", ""))

    @last_project.setter
    def last_project(self, folder: str) -> None:
        self.qsettings.setValue("app/last_project", str(folder))

    def window_state(self) -> tuple[QByteArray | None, QByteArray | None]:
        """(geometry, dock state) saved by :meth:`save_window_state`."""
        geometry = self.qsettings.value("window/geometry")
        state = self.qsettings.value("window/state")
        return (geometry if isinstance(geometry, QByteArray) else None,
                state if isinstance(state, QByteArray) else None)

    def save_window_state(self, geometry: QByteArray, state: QByteArray) -> None:
        """Stores the main window's geometry and dock layout."""
        self.qsettings.setValue("window/geometry", geometry)
        self.qsettings.setValue("window/state", state)
        self.qsettings.sync()

    def stored_problems(self) -> list[str]:
        """Stored values the studio cannot use and has replaced (say them, once, at start):
        an unknown device, a memory budget that is not a number, model folders that are gone.
        """
        problems = []
        device = str(self._get("engine/device", "auto"))
        if device not in DEVICES:
            problems.append(f"device {device!r} is not one of {', '.join(DEVICES)}; using auto")
        elif device == "cuda" and visible_gpus() == 0:
            problems.append("device cuda: no NVIDIA GPU is visible; using auto")
        raw = self._get("engine/memory_budget_gb", 0.0)
        try:
            if float(raw) < 0:
                raise ValueError
        except (TypeError, ValueError):
            problems.append(f"memory budget {raw!r} is not a number of GiB >= 0; using "
                            f"automatic")
        for folder in self.model_folders:
            try:
                is_dir = expand_path(folder, "model folder").is_dir()
            except ValueError:
                is_dir = False
            if not is_dir:
                problems.append(f"model folder {folder} does not exist (Settings → Model "
                                f"folders)")
        return problems

    def worker_config(self) -> WorkerConfig:
        """The engine configuration these settings describe."""
        return WorkerConfig(model_folders=tuple(self.model_folders), device=self.device,
                            preload=("embedded",), memory_budget_gb=self.memory_budget_gb,
                            parallel=self.parallel_plan)


def _plan_key(plan: ParallelConfig) -> str:
    return f"ulysses={plan.ulysses_degree},ring={plan.ring_degree},cfg={plan.cfg_degree}"


class SettingsDialog(QDialog):
    """Edits model folders, device and memory budget; :meth:`apply` writes them."""

    def __init__(self, settings: AppSettings, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self.settings = settings
        self.folders = QListWidget()
        self.folders.addItems(settings.model_folders)
        add = QPushButton("Add folder…")
        remove = QPushButton("Remove")
        add.clicked.connect(self._add_folder)
        remove.clicked.connect(lambda: [self.folders.takeItem(self.folders.row(i))
                                        for i in self.folders.selectedItems()])
        folder_buttons = QHBoxLayout()
        folder_buttons.addWidget(add)
        folder_buttons.addWidget(remove)
        folder_buttons.addStretch(1)
        folder_box = QWidget()
        fl = QVBoxLayout(folder_box)
        fl.setContentsMargins(0, 0, 0, 0)
        fl.addWidget(self.folders)
        fl.addLayout(folder_buttons)
        self.device = QComboBox()
        self.device.addItems(DEVICES)
        if visible_gpus() == 0:  # no NVIDIA GPU here: "cuda" cannot run
            item = self.device.model().item(DEVICES.index("cuda"))
            item.setEnabled(False)
            item.setToolTip("No NVIDIA GPU was found on this machine")
        self.device.setCurrentText(settings.device)
        self.memory = DecimalSpinBox(minimum=0.0, maximum=4096.0, decimals=1, suffix=" GiB",
                                     specialValueText="automatic")
        self.memory.setValue(settings.memory_budget_gb)
        self.plan = QComboBox()
        self.plans = available_plans(visible_gpus())
        for label, plan in self.plans:
            self.plan.addItem(label)
            if plan == settings.parallel_plan:
                self.plan.setCurrentIndex(self.plan.count() - 1)
        self.plan.setEnabled(len(self.plans) > 1)
        self.plan.setToolTip(
            "How one job is split over the GPUs: CFG runs the two guidance branches on two "
            "GPUs; Ulysses and ring split the image or video tokens (Ulysses needs the "
            "model's attention heads to divide by its degree). The plan that ran is recorded "
            "with each result.")
        form = QFormLayout()
        form.addRow("Model folders", folder_box)
        form.addRow("Device", self.device)
        form.addRow("Memory budget", self.memory)
        form.addRow("Multi-GPU plan", self.plan)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok
                                   | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(buttons)

    def _add_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Model folder", str(Path.home()))
        if folder:
            self.folders.addItem(folder)

    def apply(self) -> None:
        """Writes the dialog's values to the settings."""
        self.settings.model_folders = [self.folders.item(i).text()
                                       for i in range(self.folders.count())]
        self.settings.device = self.device.currentText()
        self.settings.memory_budget_gb = self.memory.value()
        self.settings.parallel_plan = self.plans[self.plan.currentIndex()][1]
        self.settings.qsettings.sync()
