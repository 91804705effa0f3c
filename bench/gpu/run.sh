#!/usr/bin/env bash
# The GPU checks and timings, in one command (< 5 minutes; no network on that machine):
#  1. studio.kernels: correctness of every kernel, then timings against torch SDPA (flash,
#     cuDNN) at the Flux 1024² and Wan 720p attention shapes (bench/gpu/kernels.py);
#  2. the engine's levers on full-size random-weight FLUX.1-dev (12B) and Wan 2.1 14B
#     transformers: attention routing (sage/sparse/flash), fused block ops, the step cache
#     hooks' overhead, fp8/int8 dynamic precision, and "ours" against issue 7's per-step
#     targets (bench/gpu/engine.py). Needs diffusers (and torchao) there: their wheels travel
#     in bench/gpu/wheels (ignored by git; pass it in the run's carry list). To fill it, on a
#     machine with network (the GPU machine has Python 3.12):
#       python -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#         --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#         --platform manylinux2014_x86_64 -d bench/gpu/wheels diffusers==0.42.1 torchao==0.18.0
# A failing stage does not stop the next one; the exit status is the first failure's (3 when
# diffusers is missing and the engine stage could not run). Both stages share one deadline,
# $STUDIO_GPU_BUDGET_S (285) seconds from the start: rows past it are skipped, not overrun.
# With $OUT set, the JSON results and the whole log are written under it.
#
#   bench/gpu/run.sh                       # JSON under $OUT when it is set
#   bench/gpu/run.sh --cpu-smoke           # both, tiny shapes, on the CPU (interpreter)
set -uo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
args=("$@")
if [[ -n "${OUT:-}" && " $* " != *" --json "* ]]; then
  args+=(--json "$OUT/kernels-gpu.json")
fi
log=/dev/null
[[ -n "${OUT:-}" ]] && log="$OUT/run.log"
# One deadline for both stages (seconds since the epoch): the kernel timings stop early
# enough to leave the engine stage its share, and the engine skips rows rather than overrun.
export STUDIO_GPU_DEADLINE="${STUDIO_GPU_DEADLINE:-$(( $(date +%s) + ${STUDIO_GPU_BUDGET_S:-285} ))}"
if ls bench/gpu/wheels/*.whl >/dev/null 2>&1 && ! "$PY" -c "import diffusers" 2>/dev/null; then
  site="${TMPDIR:-/tmp}/studio-site"
  "$PY" -m pip install -q --no-index --no-deps --target "$site" bench/gpu/wheels/*.whl
  export PYTHONPATH="$site:${PYTHONPATH:-}"
fi
engine=1
if ! "$PY" -c "import diffusers" 2>/dev/null; then
  # said up front, not found as an ImportError after the kernel stage has spent its minutes
  echo "run.sh: diffusers does not import: the engine stage is skipped. Carry its wheels:" \
       "download them into bench/gpu/wheels (the command is at the top of bench/gpu/run.sh) and pass" \
       "carry: [\"bench/gpu/wheels\"] to the run" | tee -a "$log" >&2
  engine=0
fi
smoke=()
[[ " $* " == *" --cpu-smoke "* ]] && smoke=(--cpu-smoke)
status=0
"$PY" -m bench.gpu.kernels --budget-s 120 "${args[@]}" 2>&1 | tee -a "$log" || status=$?
if (( engine )); then
  "$PY" -m bench.gpu.engine "${smoke[@]}" ${OUT:+--json "$OUT/engine-gpu.json" --profile "$OUT/profile.txt"} 2>&1 \
    | tee -a "$log" || { rc=$?; [[ $status == 0 ]] && status=$rc; }
elif [[ $status == 0 ]]; then
  status=3
fi
exit "$status"
