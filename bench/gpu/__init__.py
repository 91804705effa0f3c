"""Benchmarks that need the GPU machine (see shared/notes/gpu-machine.md)."""

from __future__ import annotations

import math
import os
import time

#: The whole run's end, in seconds since the epoch, set once by ``bench/gpu/run.sh`` so
#: that its stages share one budget (each stage used to count from its own start).
DEADLINE_ENV = "STUDIO_GPU_DEADLINE"


def seconds_left() -> float:
    """Seconds until ``$STUDIO_GPU_DEADLINE`` (inf when unset).

    Raises:
        ValueError: the variable is set but is not a number of seconds since the epoch.
    """
    text = os.environ.get(DEADLINE_ENV, "").strip()
    if not text:
        return math.inf
    try:
        return float(text) - time.time()
    except ValueError:
        raise ValueError(f"{DEADLINE_ENV}: {text!r} is not seconds since the epoch") from None
