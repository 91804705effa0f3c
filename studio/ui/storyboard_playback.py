"""Playing the timeline's storyboard in the canvas.

The timeline's Play button (:attr:`TimelinePanel.playRequested
<studio.ui.timeline.TimelinePanel.playRequested>`) gathers the shots' frames, plans the film
with :func:`~studio.store.storyboard.plan_storyboard` (the frame selection the MP4 export
encodes: film size of the first shot and fps of the first video shot, trims, image
durations, nearest-frame rate conversion, letterboxing) and shows it in the canvas, whose player runs it at the film's fps
on a clock. Editing the timeline meanwhile re-plans the film in place; Stop, or selecting a
variant, goes back to the variant.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from PySide6.QtCore import QObject

from studio.core.document import (
    SHOTS_ADDED,
    SHOTS_CHANGED,
    SHOTS_MOVED,
    SHOTS_REMOVED,
    VARIANTS_REMOVED,
    ChangeEvent,
    Document,
)
from studio.store.storyboard import StoryboardPlan, plan_storyboard
from studio.ui.canvas import Canvas
from studio.ui.timeline import TimelinePanel

FILM_EVENTS = {SHOTS_ADDED, SHOTS_CHANGED, SHOTS_MOVED, SHOTS_REMOVED, VARIANTS_REMOVED}
"""Document changes that change the film."""


class StoryboardPlayback(QObject):
    """Connects the timeline's Play and Stop to the canvas (see the module docstring).

    Args:
        document: the document (its shots).
        canvas: where the film plays.
        timeline: the timeline panel (buttons, and the shots' frames).
        show_canvas: brings the canvas to the front.
        spawn: runs a coroutine on the loop, reporting its errors.
    """

    def __init__(self, document: Document, canvas: Canvas, timeline: TimelinePanel,
                 show_canvas: Callable[[], None],
                 spawn: Callable[[Coroutine[Any, Any, Any]], Any],
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._canvas = canvas
        self._timeline = timeline
        self._show_canvas = show_canvas
        self._spawn = spawn
        self._token = 0
        timeline.stopRequested.connect(canvas.leave_storyboard)
        canvas.modeChanged.connect(lambda *_: self._update_buttons())
        canvas.player.playingChanged.connect(lambda *_: self._update_buttons())
        self._unsubscribe = document.subscribe(self._on_document)

    def detach(self) -> None:
        """Stops following the document."""
        self._unsubscribe()

    def toggle(self) -> None:
        """Plays the storyboard from the start, or pauses / resumes it when shown."""
        if self._canvas.storyboard is not None:
            self._show_canvas()
            self._canvas.player.toggle()
        else:
            self._spawn(self.play())

    async def play(self, start: bool = True) -> StoryboardPlan | None:
        """Shows the film in the canvas and, with ``start``, plays it from its first frame;
        without, keeps the position shown (the timeline was edited). Returns the film (None
        when the timeline cannot play; the timeline says why)."""
        self._token += 1
        token = self._token
        shots = await self._timeline.gather_shots()
        if token != self._token:
            return None  # a newer request superseded this one
        if shots is None:
            if not start:
                self._canvas.leave_storyboard()
            return None
        film = plan_storyboard(shots)
        canvas = self._canvas
        position = canvas.player.position if canvas.storyboard is not None else 0
        self._show_canvas()
        canvas.show_storyboard(film, 0 if start else position)
        if start:
            canvas.player.play()
        return film

    def _on_document(self, events: Sequence[ChangeEvent]) -> None:
        if self._canvas.storyboard is not None and {e.kind for e in events} & FILM_EVENTS:
            self._spawn(self.play(start=False))

    def _update_buttons(self) -> None:
        shown = self._canvas.storyboard is not None
        self._timeline.set_playing(shown, shown and self._canvas.player.playing)
