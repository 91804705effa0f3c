"""Flash-style attention forward (see README.md)."""

from .op import LAUNCHES, Config, attention, use_config
from .reference import attention_reference

__all__ = ["LAUNCHES", "Config", "attention", "attention_reference", "use_config"]
