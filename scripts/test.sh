#!/usr/bin/env bash
# Runs the whole test suite offline (creates .venv on first use). Extra args go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/bootstrap.sh"
cd "$ROOT"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 QT_QPA_PLATFORM=offscreen
"$VENV/bin/ruff" check --quiet studio tests bench
exec "$VENV/bin/python" -m pytest -q "$@"
