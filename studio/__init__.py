"""Diffusion Studio: a local studio over an optimized diffusion engine."""

__version__ = "0.1.0"
