#!/usr/bin/env bash
# studio.kernels on the GPU machine, in one command (no network, no diffusers, < 5 minutes):
# correctness of every kernel first, then timings against torch SDPA (flash, cuDNN) at the
# Flux 1024² and Wan 720p attention shapes; a markdown table is printed last.
#
#   bench/gpu/run.sh                       # JSON next to the output when $OUT is set
#   bench/gpu/run.sh --json results.json --budget-s 240
#   bench/gpu/run.sh --cpu-smoke           # correctness only, tiny shapes, CPU interpreter
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-python3}"
args=("$@")
if [[ -n "${OUT:-}" && " $* " != *" --json "* ]]; then
  args+=(--json "$OUT/kernels-gpu.json")
fi
exec "$PY" -m bench.gpu.kernels "${args[@]}"
