"""bench/gpu/run.sh's one deadline: the engine stage skips rows rather than overrun it, and
keeps its JSON written as it goes (the GPU machine's run is killed at its limit)."""

from __future__ import annotations

import json
import time

import pytest

from bench.gpu import DEADLINE_ENV, seconds_left
from bench.gpu import engine as gpu_engine


def test_seconds_left_reads_the_deadline(monkeypatch):
    monkeypatch.delenv(DEADLINE_ENV, raising=False)
    assert seconds_left() == float("inf")
    monkeypatch.setenv(DEADLINE_ENV, str(time.time() + 100))
    assert 90 < seconds_left() <= 100
    monkeypatch.setenv(DEADLINE_ENV, "soon")
    with pytest.raises(ValueError, match=DEADLINE_ENV):
        seconds_left()


def test_engine_stage_past_the_deadline_skips_every_lever(monkeypatch, tmp_path):
    monkeypatch.setenv(DEADLINE_ENV, str(time.time() + 1))  # inside every row kind's reserve
    out = tmp_path / "engine.json"
    assert gpu_engine.main(["--cpu-smoke", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    stock = [r for r in rows if r["lever"] == "stock (SDPA)"]
    assert [r["model"] for r in stock] == ["flux-tiny", "wan-tiny"]  # the baselines ran
    others = [r for r in rows if r["lever"] != "stock (SDPA)"]
    assert len(others) > 10  # every lever has its row, marked as skipped
    assert all(r.get("error") == "skipped: time budget" for r in others), others
