"""SageAttention: int8 Q·Kᵀ, fp8 or 16-bit P·V (see README.md)."""

from .op import LAUNCHES, device_supports_fp8, sage_attention
from .reference import sage_attention_reference

__all__ = ["LAUNCHES", "device_supports_fp8", "sage_attention", "sage_attention_reference"]
