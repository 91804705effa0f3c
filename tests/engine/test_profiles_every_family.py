"""Every profile on the families whose own tests ran only some of them (Flux 2, HiDream, Wan
VACE, Qwen-Image): each cached profile reports its step cache and skips work on ``fast``, and
``exact`` run again after the cached profiles gives the first ``exact`` pixels, so no cache
state outlives its job. Wan, Flux, the SD family, LTX and LTX-2 run every profile in their
own tests (test_step_cache, test_unet_cache, test_families_ltx)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from studio.core.request import GenerationRequest, OptimizationSettings
from studio.engine.executor import runner_class
from studio.engine.models.registry import ModelRegistry
from studio.testing.tiny_pipelines import (
    build_tiny_flux2,
    build_tiny_hidream,
    build_tiny_qwen_image,
    build_tiny_wan_vace,
)

FAMILIES = {"flux2": (build_tiny_flux2, dict(mode="t2i")),
            "hidream": (build_tiny_hidream, dict(mode="t2i")),
            "qwen-image": (build_tiny_qwen_image, dict(mode="t2i")),
            "wan-vace": (build_tiny_wan_vace, dict(mode="t2v", num_frames=5))}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_profile_runs_and_exact_stays_stock(tmp_path, family):
    build, fields = FAMILIES[family]
    folder = build(tmp_path / family)
    entry = ModelRegistry(include_hf_cache=False).resolve(str(folder))
    assert entry.family == family and entry.usable, entry.error
    runner = runner_class(entry.family)(entry, torch.device("cpu"), torch.float32)
    frames, notes = {}, {}
    for profile in ("exact", "quality", "balanced", "fast", "exact"):
        request = GenerationRequest(model=str(folder), prompt="a red circle", seed=1, steps=8,
                                    guidance_scale=4.0, width=32, height=32,
                                    optimization=OptimizationSettings(profile), **fields)
        out = runner.run(request, {}, lambda *a: None)
        assert np.isfinite(out.frames).all(), profile
        cache_notes = [n for n in out.notes if n.startswith("step cache:")]
        if profile == "exact":
            assert cache_notes == [], out.notes
            if profile in frames:  # after three cached jobs: still the uncached pixels
                np.testing.assert_array_equal(out.frames, frames[profile])
        else:
            assert len(cache_notes) == 1, out.notes
            assert out.frames.shape == frames["exact"].shape
        frames[profile], notes[profile] = out.frames, cache_notes
    forecast = int(re.findall(r"(\d+) forecast", notes["fast"][0])[0])
    assert forecast > 0, notes["fast"]  # fast really skipped denoiser work
    assert not np.array_equal(frames["fast"], frames["exact"])
