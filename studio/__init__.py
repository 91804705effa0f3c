"""Diffusion Studio: a local studio over an optimized diffusion engine."""

import os as _os

__version__ = "0.1.0"

# Same request, same pixels (case 003) on the CPU: Intel MKL, torch's CPU BLAS, may otherwise
# use fewer threads than asked when the machine is busy (MKL_DYNAMIC) and pick code paths by
# memory alignment, and either changes the rounding of a sum from one run to the next. Set
# before torch makes its first MKL call; a value the user exported wins. See Intel's
# "Conditional Numerical Reproducibility" (MKL developer guide).
_os.environ.setdefault("MKL_DYNAMIC", "FALSE")
_os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
