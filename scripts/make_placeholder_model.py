"""Builds the placeholder embedded model (random weights) in assets/models/tiny-wan.

A Wan 2.2 TI2V-architecture pipeline (text and image to video in one transformer) shrunk to a
few layers; it stands in until the trained embedded model (issue 3) replaces it. Deterministic:
the same seed gives the same weights.

    .venv/bin/python scripts/make_placeholder_model.py
"""

import json
import shutil
import sys

from studio.paths import ASSETS
from studio.testing.tiny_pipelines import build_tiny_wan

out = ASSETS / "models" / "tiny-wan"
if out.exists():
    shutil.rmtree(out)
build_tiny_wan(out, variant="ti2v", seed=1234, heads=2, head_dim=64)  # kernel head dim
(out / "studio.json").write_text(json.dumps({
    "description": "placeholder: random weights until the trained embedded model lands",
    "capabilities": {"default_width": 64, "default_height": 64, "default_frames": 9,
                     "default_fps": 8.0, "default_steps": 20, "default_guidance": 5.0,
                     "max_size": 256, "max_pixels": 65536, "max_frames": 33},
    "call_kwargs": {"max_sequence_length": 32},
    "reference_frames": "append",
}, indent=2) + "\n")
print(f"wrote {out}", file=sys.stderr)
