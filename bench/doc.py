"""Writing a benchmark's table into docs/PERFORMANCE.md, atomically.

Each benchmark owns one block between ``<!-- bench NAME: start -->`` and
``<!-- bench NAME: end -->``; rerunning it replaces that block and leaves the rest of the
document alone.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "PERFORMANCE.md"


def markers(name: str) -> tuple[str, str]:
    """The start and end comments of benchmark ``name``'s block."""
    return f"<!-- bench {name}: start -->", f"<!-- bench {name}: end -->"


def write_block(name: str, body: str, heading: str, doc: Path = DOC) -> None:
    """Replaces benchmark ``name``'s block in ``doc`` with ``body``, or appends it under a new
    ``## heading`` when the document has none. The file is replaced atomically (write to a
    sibling, then rename)."""
    start, end = markers(name)
    text = doc.read_text() if doc.exists() else "# Performance\n"
    block = f"{start}\n{body}\n{end}"
    if start in text:
        text = re.sub(re.escape(start) + ".*?" + re.escape(end), lambda _: block, text,
                      flags=re.S)
    else:
        text = text.rstrip("\n") + f"\n\n## {heading}\n\n{block}\n"
    tmp = doc.with_name(doc.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(doc)


def weights_record(folder: Path | None = None) -> dict:
    """Which weights a result was measured on: the model folder's ``training_step`` (from its
    ``studio.json``) and the first 16 hex digits of the sha256 of its transformer's
    safetensors, so a figure can be told stale when the shipped weights change. ``folder``:
    the embedded default model when None. Missing pieces are None."""
    import hashlib
    import json

    folder = folder or Path(__file__).resolve().parents[1] / "assets" / "models" / "tiny-wan"
    try:
        step = json.loads((folder / "studio.json").read_text()).get("training_step")
    except (OSError, ValueError):
        step = None
    weights = folder / "transformer" / "diffusion_pytorch_model.safetensors"
    try:
        digest = hashlib.sha256(weights.read_bytes()).hexdigest()[:16]
    except OSError:
        digest = None
    return {"model": str(folder.name), "training_step": step, "transformer_sha256": digest}


def save_result(out: Path, result: dict) -> None:
    """Writes a benchmark's result JSON to ``out`` atomically (a sibling, then rename)."""
    import json

    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(out)
