"""A submitted job: what crosses from the engine's caller to its worker.

No torch here: the caller (the studio's GUI thread) builds jobs, and importing torch there
would freeze the window for seconds on the first Generate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from studio.core.request import GenerationRequest


@dataclass
class Job:
    """A submitted job: the request and the pixels of the inputs it names (by content id).

    Attributes:
        job_id: unique id (hex).
        request: the request.
        inputs: content id -> uint8 pixels ((H, W, 3), or (H, W) for masks).
    """

    job_id: str
    request: GenerationRequest
    inputs: dict[str, np.ndarray] = field(default_factory=dict)
