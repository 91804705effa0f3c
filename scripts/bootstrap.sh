#!/usr/bin/env bash
# Creates and fills .venv when missing or when pyproject.toml changed. Sourced by the two
# entry scripts (scripts/studio.sh, scripts/test.sh); safe to run again.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3}"
STAMP="$VENV/.studio-installed"
want="$(sha256sum "$ROOT/pyproject.toml" | cut -c1-16)"

if [ ! -x "$VENV/bin/python" ]; then
    echo "[bootstrap] creating virtual environment in .venv" >&2
    "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' \
        || { echo "Python 3.11 or newer is required (found: $("$PY" --version))" >&2; exit 1; }
    "$PY" -m venv "$VENV"
fi
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$want" ]; then
    echo "[bootstrap] installing dependencies (first run only; a few minutes)" >&2
    "$VENV/bin/python" -m pip install -q --upgrade pip >&2 || true
    if ! "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
        if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
            "$VENV/bin/python" -m pip install -q "torch>=2.4,<3" >&2
        else
            # No NVIDIA GPU: the CPU build, not a multi-GB CUDA download. PyPI's Linux torch
            # is the CUDA build; PyTorch's CPU index has 2.13.0+cpu, which pip prefers (a
            # local wheel of it, where the machine has one, serves offline).
            echo "[bootstrap] torch 2.13.0 (CPU build); offline, pip's retry warnings for" \
                "download.pytorch.org are harmless when a local wheel serves" >&2
            "$VENV/bin/python" -m pip install -q --retries 1 "torch==2.13.0" \
                --extra-index-url https://download.pytorch.org/whl/cpu >&2
        fi
    fi
    "$VENV/bin/python" -m pip install -q -e "$ROOT[test]" >&2
    echo "$want" > "$STAMP"
fi
