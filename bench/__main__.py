"""``python -m bench <benchmark> [args]``: runs one benchmark (see bench/*.py)."""

import importlib
import sys

BENCHMARKS = {"cpu": "bench.cpu", "calibrate": "bench.calibrate", "precision": "bench.precision",
              "preview": "bench.preview", "gpu-kernels": "bench.gpu.kernels",
              "ui-stalls": "bench.ui_stalls", "scaling": "bench.scaling",
              "model": "bench.model", "kernel-quality": "bench.kernel_quality",
              "adherence": "bench.adherence"}


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in BENCHMARKS:
        print(f"usage: python -m bench {{{','.join(BENCHMARKS)}}} [args]", file=sys.stderr)
        return 2
    return importlib.import_module(BENCHMARKS[sys.argv[1]]).main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
