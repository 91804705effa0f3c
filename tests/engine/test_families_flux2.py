"""FLUX.2 through the registry: text-to-image on a tiny random-weight pipeline (real
Mistral-3, VAE and transformer classes) gives stock diffusers' pixels; previews decode; the
cache runs (diffusers' own FirstBlockCache fails on this family)."""

from __future__ import annotations

import numpy as np
import torch

from studio.core.request import GenerationRequest, OptimizationSettings
from studio.engine.executor import runner_class
from studio.engine.models.registry import ModelRegistry
from studio.testing.tiny_pipelines import build_tiny_flux2


def test_flux2_same_pixels_as_stock_and_cached(tmp_path):
    import diffusers

    folder = build_tiny_flux2(tmp_path / "flux2")
    entry = ModelRegistry(include_hf_cache=False).resolve(str(folder))
    assert entry.family == "flux2" and entry.usable, entry.error
    runner = runner_class(entry.family)(entry, torch.device("cpu"), torch.float32)
    request = GenerationRequest(model=str(folder), prompt="a red circle on grass", seed=2,
                                steps=2, guidance_scale=4.0, width=32, height=32, mode="t2i")
    assert request.validate(entry.capabilities) == []
    previews = []
    ours = runner.run(request, {}, lambda i, n, lat: previews.append(runner.preview(lat).shape))
    pipe = diffusers.Flux2Pipeline.from_pretrained(folder, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    theirs = np.asarray(pipe(prompt=request.prompt, height=32, width=32, num_inference_steps=2,
                             guidance_scale=4.0, generator=torch.Generator().manual_seed(2),
                             output_type="np").images, dtype=np.float32)
    assert ours.frames.shape == theirs.shape
    assert np.abs(ours.frames - theirs).max() <= 1e-5
    assert len(previews) == 2 and all(p[2] == 3 for p in previews)
    cached = runner.run(GenerationRequest(
        model=str(folder), prompt="a red circle", seed=1, steps=8, guidance_scale=4.0,
        width=32, height=32, mode="t2i", optimization=OptimizationSettings("fast")), {},
        lambda *a: None)
    assert np.isfinite(cached.frames).all()
    assert any("denoiser calls computed in full" in n for n in cached.notes), cached.notes
    assert not any("computed in full, 0 forecast" in n for n in cached.notes), cached.notes
