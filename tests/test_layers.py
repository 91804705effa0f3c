"""Import contracts of ../shared/DESIGN.md, checked in fresh interpreters.

core and store import neither torch nor Qt; the engine never imports Qt; the engine's API and
events import no torch (the UI imports them); kernels import no diffusers and no Qt; the UI
imports from the engine only its API, events, worker config and model registry.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STUDIO = ROOT / "studio"


def loaded_after(modules: list[str], forbidden: list[str]) -> list[str]:
    code = ("import sys\n" + "".join(f"import {m}\n" for m in modules) +
            f"print(','.join(m for m in {forbidden!r} if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    return [m for m in out.stdout.strip().split(",") if m]


def modules_in(package: str) -> list[str]:
    base = STUDIO / package
    return sorted("studio." + ".".join(p.relative_to(STUDIO).with_suffix("").parts)
                  .removesuffix(".__init__")
                  for p in base.rglob("*.py"))


@pytest.mark.parametrize("package,forbidden", [
    ("core", ["torch", "PySide6", "diffusers"]),
    ("store", ["torch", "PySide6", "diffusers"]),
    ("engine", ["PySide6"]),
    ("tiny", ["PySide6"]),
    ("kernels", ["PySide6", "diffusers"]),
])
def test_layer_does_not_load_forbidden_modules(package, forbidden):
    assert loaded_after(modules_in(package), forbidden) == []


def test_engine_api_is_light():
    assert loaded_after(["studio.engine.api", "studio.engine.events", "studio.engine.job"],
                        ["torch", "diffusers", "PySide6"]) == []


def test_ui_imports_only_the_engine_api():
    allowed = ("studio.engine.api", "studio.engine.events", "studio.engine.worker",
               "studio.engine.models.registry")
    for path in (STUDIO / "ui").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
                if node.module in ("studio", "studio.engine", "studio.engine.models"):
                    names = [f"{node.module}.{a.name}" for a in node.names]
            for name in names:
                if name.startswith("studio.engine"):
                    assert name in allowed, f"{path.name} imports {name}"
                assert not name.startswith(("torch", "diffusers")), f"{path.name}: {name}"


def test_no_side_effects_at_import():
    code = ("import os, sys; before = dict(os.environ); import studio.cli, studio.engine.api, "
            "studio.core.request, studio.store.export; "
            "sys.exit(0 if dict(os.environ) == before else 1)")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
