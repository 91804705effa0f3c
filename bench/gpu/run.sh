#!/usr/bin/env bash
# The GPU checks and timings, in one command (< 5 minutes; no network on that machine):
#  1. studio.kernels: correctness of every kernel, then timings against torch SDPA (flash,
#     cuDNN) at the Flux 1024² and Wan 720p attention shapes (bench/gpu/kernels.py);
#  2. the engine's levers on full-size random-weight FLUX.1-dev (12B) and Wan 2.1 14B
#     transformers: attention routing (sage/sparse/flash), fused block ops, the step cache
#     hooks' overhead, fp8/int8 dynamic precision, and "ours" against issue 7's per-step
#     targets (bench/gpu/engine.py). Needs diffusers (and torchao) there: their wheels travel
#     in bench/gpu/wheels (ignored by git; pass it in the run's carry list).
# A failing stage does not stop the next one; the exit status is the first failure's.
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
if ls bench/gpu/wheels/*.whl >/dev/null 2>&1 && ! "$PY" -c "import diffusers" 2>/dev/null; then
  site="${TMPDIR:-/tmp}/studio-site"
  "$PY" -m pip install -q --no-index --no-deps --target "$site" bench/gpu/wheels/*.whl
  export PYTHONPATH="$site:${PYTHONPATH:-}"
fi
smoke=()
[[ " $* " == *" --cpu-smoke "* ]] && smoke=(--cpu-smoke)
status=0
"$PY" -m bench.gpu.kernels --budget-s 120 "${args[@]}" 2>&1 | tee -a "$log" || status=$?
"$PY" -m bench.gpu.engine "${smoke[@]}" ${OUT:+--json "$OUT/engine-gpu.json" --profile "$OUT/profile.txt"} 2>&1 \
  | tee -a "$log" || { rc=$?; [[ $status == 0 ]] && status=$rc; }
exit "$status"
