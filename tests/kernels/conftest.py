"""Run the Triton kernels under Triton's interpreter on the CPU.

Triton reads TRITON_INTERPRET when it decorates a kernel, and its own library functions
(``tl.zeros``, ``tl.sum``...) are decorated when ``triton.language`` is first imported: the
variable must be set before Triton is imported at all. pytest imports this file while it
collects, before any test runs and before the test modules of this folder import the ops, so
setting it here is in time for ``pytest tests/kernels`` and for the full suite (no other test
folder imports Triton at collection). If Triton was imported earlier anyway, every kernel test
fails with a message saying so, rather than silently testing the torch fallbacks.
"""

from __future__ import annotations

import os
import sys

import pytest

_TRITON_IMPORTED_TOO_EARLY = ("triton" in sys.modules
                              and os.environ.get("TRITON_INTERPRET") != "1")
os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(autouse=True)
def _interpreter_is_on():
    if _TRITON_IMPORTED_TOO_EARLY:
        pytest.fail("triton was imported before tests/kernels/conftest.py could set "
                    "TRITON_INTERPRET=1; run with TRITON_INTERPRET=1 in the environment")
