"""Shared fixtures: offline environment, a private user folder, tiny real models."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# Kernel tests run Triton's interpreter on the CPU; it must be chosen before triton is first
# imported (anything importing torch._inductor may import it), so it is set here, first.
os.environ.setdefault("TRITON_INTERPRET", "1")

DATA = Path(__file__).parent / "data"
CASES = DATA / "cases"


@pytest.fixture(autouse=True)
def _private_user_dir(tmp_path_factory, monkeypatch):
    """Each test gets its own STUDIO_HOME (logs, hash cache) and an empty HF cache."""
    home = tmp_path_factory.mktemp("studio-home")
    monkeypatch.setenv("STUDIO_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(home / "hf-hub"))


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    """Tiny random-weight pipelines saved in diffusers format: Wan 2.1 T2V, Wan 2.2
    TI2V-style, Wan 2.1 I2V (with a CLIP image encoder), Wan 2.2 A14B (two experts) and
    FLUX.1."""
    from studio.testing.tiny_pipelines import build_tiny_flux, build_tiny_wan

    root = tmp_path_factory.mktemp("tiny-models")
    return {
        "wan-t2v": build_tiny_wan(root / "wan-t2v", variant="t2v"),
        "wan-ti2v": build_tiny_wan(root / "wan-ti2v", variant="ti2v"),
        "wan-i2v": build_tiny_wan(root / "wan-i2v", variant="i2v"),
        "wan-a14b": build_tiny_wan(root / "wan-a14b", variant="a14b"),
        "flux": build_tiny_flux(root / "flux"),
    }


def sigterm_and_wait(proc, *, timeout: float = 120) -> str:
    """Sends SIGTERM to a running ``subprocess.Popen`` (text mode, stderr piped), waits for
    it to exit and returns its stderr; kills it if it outlives ``timeout`` seconds."""
    import signal

    try:
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        proc.send_signal(signal.SIGTERM)
        return proc.communicate(timeout=timeout)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
