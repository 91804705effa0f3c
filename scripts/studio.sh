#!/usr/bin/env bash
# Launches the studio on the embedded default model (creates .venv on first use).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/bootstrap.sh"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# Qt 6.5+ needs a few X11 libraries that a minimal Linux may lack: say which, once.
# (not for the windowless commands: --samples, render, models)
case "${1:-}" in --samples|render|models|--help|-h) window=0 ;; *) window=1 ;; esac
if [ "$window" = 1 ] && [ -n "${DISPLAY:-}" ] && [ -z "${QT_QPA_PLATFORM:-}" ] && \
        command -v ldconfig >/dev/null; then
    missing=""
    libs="$(ldconfig -p)"  # read once: `ldconfig -p | grep -q` can die of SIGPIPE (pipefail)
    for lib in libxcb-cursor.so.0 libxcb-icccm.so.4 libxcb-image.so.0 libxcb-keysyms.so.1 \
               libxcb-render-util.so.0 libxcb-shape.so.0 libxcb-xkb.so.1 libxkbcommon-x11.so.0; do
        grep -qF "$lib" <<< "$libs" || missing="$missing $lib"
    done
    if [ -n "$missing" ]; then
        echo "The studio window needs X11 libraries this system lacks:$missing" >&2
        echo "On Debian/Ubuntu: sudo apt-get install libxcb-cursor0 libxcb-icccm4 libxcb-image0 \\" >&2
        echo "  libxcb-keysyms1 libxcb-render-util0 libxcb-shape0 libxcb-xkb1 libxkbcommon-x11-0" >&2
        echo "(or run ./scripts/studio.sh --samples to render samples without a window)" >&2
        exit 1
    fi
fi
exec "$VENV/bin/python" -m studio "$@"
