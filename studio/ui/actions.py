"""The studio window's actions, menus and context menu, as tables.

Every user command is one QAction on the window (attribute ``<name>_action``), so the menus,
the variant tree's context menu, the keyboard and the tests all trigger the same thing. An
action's handler runs through :meth:`MainWindow._guard`, so an unexpected error becomes a
message in the window instead of a crash.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QMenu

if TYPE_CHECKING:
    from studio.ui.main_window import MainWindow

Key = QKeySequence.StandardKey
Handler = Callable[["MainWindow"], Any]

# (attribute, text, handler, shortcuts, tip)
ACTIONS: tuple[tuple[str, str, Handler, tuple[Any, ...], str], ...] = (
    ("generate", "Generate", lambda w: w.generate(), ("Ctrl+Return", "Ctrl+Enter"),
     "Queue the settings as new variants"),
    ("undo", "Undo", lambda w: w.undo(), (Key.Undo,), ""),
    ("redo", "Redo", lambda w: w.redo(), ("Ctrl+Shift+Z", "Ctrl+Y"), ""),
    ("clear_history", "Clear undo history", lambda w: w.clear_history(), (),
     "Forget every undo step; media only they could bring back are deleted from the disk"),
    ("delete", "Delete", lambda w: w.delete(), (Key.Delete,),
     "Delete the selected variants (and their branches)"),
    ("rename", "Rename…", lambda w: w.start_rename(), ("F2",), ""),
    ("star", "Star / unstar", lambda w: w.toggle_star(), (), ""),
    ("branch", "Branch from here", lambda w: w.branch_from_current(), (),
     "Prefill the settings from this variant; new results become its children"),
    ("use_init", "Use as init image", lambda w: w.use_as_input("init_image"), (), ""),
    ("use_first", "Use as first frame", lambda w: w.use_as_input("first_frame"), (), ""),
    ("use_reference", "Add as reference", lambda w: w.use_as_input("references"), (), ""),
    ("add_shot", "Add to timeline", lambda w: w.add_selected_to_timeline(), (), ""),
    ("compare", "Compare selected", lambda w: w.compare_selected(), (), ""),
    ("export", "Export result…", lambda w: w.ask_export_variant(), ("Ctrl+E",), ""),
    ("contact_sheet", "Export contact sheet…", lambda w: w.ask_contact_sheet(), (), ""),
    ("storyboard", "Export storyboard MP4…", lambda w: w.timeline.ask_export(), (), ""),
    ("play_storyboard", "Play storyboard", lambda w: w.playback.toggle(), ("Ctrl+Shift+Space",),
     "Play the whole timeline in the canvas, as the MP4 export would"),
    ("copy_settings", "Copy settings", lambda w: w.copy_settings(), ("Ctrl+Shift+C",),
     "Copy the request JSON to the clipboard"),
    ("reproduce", "Reproduce", lambda w: w.reproduce(), (),
     "Run the exact same request again as a new variant"),
    ("retry", "Retry", lambda w: w.retry_selected(), (), ""),
    ("cancel", "Cancel job", lambda w: w.cancel_selected(), (), ""),
    ("play", "Play / pause", lambda w: w.toggle_play(), ("Space",), ""),
    ("prev_frame", "Previous frame", lambda w: w.step_frame(-1), ("Left",), ""),
    ("next_frame", "Next frame", lambda w: w.step_frame(1), ("Right",), ""),
    ("fit", "Fit", lambda w: w.active_view().fit(), ("Ctrl+0",), ""),
    ("actual_size", "100%", lambda w: w.active_view().actual_size(), ("Ctrl+1",), ""),
    ("paste", "Paste image as input", lambda w: w.canvas.paste(), (Key.Paste,), ""),
    ("settings", "Settings…", lambda w: w.open_settings(), (), ""),
    ("open_project", "Open or create project…", lambda w: w.ask_open_project(), (Key.Open,),
     ""),
    ("quit", "Quit", lambda w: w.close(), (Key.Quit,), ""),
)

MENUS: tuple[tuple[str, tuple[str | None, ...]], ...] = (
    ("&File", ("open_project", None, "export", "contact_sheet", "storyboard", None,
               "settings", None, "quit")),
    ("&Edit", ("undo", "redo", "clear_history", None, "rename", "star", "delete", None, "copy_settings",
               "paste")),
    ("&Generate", ("generate", "branch", "reproduce", None, "use_init", "use_first",
                   "use_reference", None, "retry", "cancel")),
    ("&View", ("compare", "add_shot", None, "fit", "actual_size", None, "play", "prev_frame",
               "next_frame", "play_storyboard", None)),
)

VARIANT_MENU: tuple[str | None, ...] = (
    "branch", "reproduce", None, "use_init", "use_first", "use_reference", None, "add_shot",
    "compare", None, "star", "rename", "delete", None, "export", "contact_sheet",
    "copy_settings", None, "retry", "cancel")

VARIANT_TOOLS = ("branch", "compare", "add_shot")


def create_actions(window: MainWindow) -> None:
    """Creates every action of :data:`ACTIONS` on the window (``window.<name>_action``)."""
    for name, text, handler, shortcuts, tip in ACTIONS:
        action = QAction(text, window)
        if shortcuts:
            action.setShortcuts([QKeySequence(k) for k in shortcuts])
        if tip:
            action.setToolTip(tip)
            action.setStatusTip(tip)
        action.triggered.connect(lambda *_, h=handler: window._guard(lambda: h(window)))
        action.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        window.addAction(action)
        setattr(window, f"{name}_action", action)
    for name in VARIANT_TOOLS:
        window.variants.add_tool(getattr(window, f"{name}_action"))
    window.variants.toolbar.addStretch(1)


def _fill(menu: QMenu, window: MainWindow, names: tuple[str | None, ...]) -> None:
    for name in names:
        if name is None:
            menu.addSeparator()
        else:
            menu.addAction(getattr(window, f"{name}_action"))


def create_menus(window: MainWindow) -> None:
    """The menu bar of :data:`MENUS`; View also toggles the docks."""
    bar = window.menuBar()
    view = None
    for title, names in MENUS:
        menu = bar.addMenu(title)
        _fill(menu, window, names)
        view = menu
    if view is not None:
        for dock in window.docks.values():
            view.addAction(dock.toggleViewAction())


def popup_variant_menu(window: MainWindow, pos: Any) -> None:
    """Shows the variant tree's context menu at ``pos`` (viewport coordinates)."""
    menu = QMenu(window)
    _fill(menu, window, VARIANT_MENU)
    menu.popup(window.variants.view.viewport().mapToGlobal(pos))
