"""Gated residual ``x + gate * y`` (see README.md)."""

from .op import LAUNCHES, gated_residual
from .reference import gated_residual_reference

__all__ = ["LAUNCHES", "gated_residual", "gated_residual_reference"]
