"""How responsive the GUI thread is: the lateness of a fast timer on its event loop.

:class:`StallMonitor` runs a precise Qt timer every ``interval_ms`` (10 ms) on the GUI thread
and records, for every tick, how much later than due it came: ``(now - previous tick) -
interval``. While the event loop is free, that is about 0-2 ms; anything the GUI thread does
for a long time in one go (decoding, hashing, waiting on a lock, a slow repaint) shows up as
one late tick of about that duration. ``bench/ui_stalls.py`` and the UI tests use it; the
goal is a 99th percentile under 50 ms while generations run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
from PySide6.QtCore import QObject, Qt, QTimer


class StallMonitor(QObject):
    """Records the event loop's lateness (see the module docstring).

    Args:
        interval_ms: the timer's period.
        clock: seconds, monotonic (default ``time.perf_counter``).
    """

    def __init__(self, interval_ms: int = 10, clock: Callable[[], float] = time.perf_counter,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.interval_ms = interval_ms
        self._clock = clock
        self._last: float | None = None
        self.samples_ms: list[float] = []
        self._timer = QTimer(self)
        self._timer.setTimerType(Qt.TimerType.PreciseTimer)
        self._timer.setInterval(interval_ms)
        self._timer.timeout.connect(self._tick)

    def start(self) -> None:
        """Starts measuring (samples gathered so far are kept)."""
        self._last = self._clock()
        self._timer.start()

    def stop(self) -> None:
        """Stops measuring."""
        self._timer.stop()
        self._last = None

    def reset(self) -> None:
        """Forgets the samples."""
        self.samples_ms.clear()

    @property
    def running(self) -> bool:
        """Whether the timer runs."""
        return self._timer.isActive()

    def _tick(self) -> None:
        now = self._clock()
        if self._last is not None:
            self.samples_ms.append(max(0.0, (now - self._last) * 1000.0 - self.interval_ms))
        self._last = now

    def stats(self) -> dict[str, Any]:
        """Percentiles of the lateness in ms (p50, p90, p99, max), the tick count, and how
        many ticks were over 50 ms and over 500 ms."""
        data = np.asarray(self.samples_ms, dtype=np.float64)
        if not len(data):
            return {"ticks": 0, "p50_ms": 0.0, "p90_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0,
                    "over_50ms": 0, "over_500ms": 0}
        p50, p90, p99 = np.percentile(data, [50, 90, 99])
        return {"ticks": int(len(data)), "p50_ms": round(float(p50), 3),
                "p90_ms": round(float(p90), 3), "p99_ms": round(float(p99), 3),
                "max_ms": round(float(data.max()), 3),
                "over_50ms": int((data > 50).sum()), "over_500ms": int((data > 500).sum())}
