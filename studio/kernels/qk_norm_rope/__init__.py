"""Query/key RMSNorm fused with rotary position embedding (see README.md)."""

from .op import LAUNCHES, qk_norm_rope
from .reference import qk_norm_rope_reference

__all__ = ["LAUNCHES", "qk_norm_rope", "qk_norm_rope_reference"]
