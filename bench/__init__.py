"""Benchmarks: ``python -m bench <name>``. Results go to bench/results/ with the command."""
