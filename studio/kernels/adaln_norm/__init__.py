"""LayerNorm / RMSNorm fused with AdaLN modulation (see README.md)."""

from .op import LAUNCHES, adaln_norm
from .reference import adaln_norm_reference

__all__ = ["LAUNCHES", "adaln_norm", "adaln_norm_reference"]
