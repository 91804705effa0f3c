"""Benchmarks that need the GPU machine (see shared/notes/gpu-machine.md)."""
