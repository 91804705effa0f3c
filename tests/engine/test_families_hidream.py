"""HiDream-I1 through the registry: text-to-image on a tiny random-weight pipeline (real
CLIP, T5, Llama, VAE and MoE transformer classes) gives stock diffusers' pixels at the size
asked for, and the step cache runs on its double- and single-stream block lists."""

from __future__ import annotations

import numpy as np
import torch

from studio.core.request import GenerationRequest, OptimizationSettings
from studio.engine.executor import runner_class
from studio.engine.models.registry import ModelRegistry
from studio.engine.pipelines.hidream import native_sample_size
from studio.testing.tiny_pipelines import build_tiny_hidream


def test_hidream_same_pixels_as_stock_at_the_asked_size_and_cached(tmp_path):
    import diffusers

    folder = build_tiny_hidream(tmp_path / "hidream")
    entry = ModelRegistry(include_hf_cache=False).resolve(str(folder))
    assert entry.family == "hidream" and entry.usable, entry.error
    runner = runner_class(entry.family)(entry, torch.device("cpu"), torch.float32)
    request = GenerationRequest(model=str(folder), prompt="a red circle on grass",
                                negative_prompt="blurry", seed=2, steps=2, guidance_scale=4.0,
                                width=48, height=32, mode="t2i")
    assert request.validate(entry.capabilities) == []
    ours = runner.run(request, {}, lambda *a: None)
    assert ours.frames.shape == (1, 32, 48, 3)  # not rescaled to the native pixel count
    pipe = diffusers.HiDreamImagePipeline.from_pretrained(folder, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    pipe.default_sample_size = native_sample_size(48, 32, pipe.vae_scale_factor)
    theirs = np.asarray(pipe(prompt=request.prompt, negative_prompt="blurry", height=32,
                             width=48, num_inference_steps=2, guidance_scale=4.0,
                             max_sequence_length=128, generator=torch.Generator().manual_seed(2),
                             output_type="np").images, dtype=np.float32)
    assert np.abs(ours.frames - theirs).max() <= 1e-5
    cached = runner.run(GenerationRequest(
        model=str(folder), prompt="a red circle", seed=1, steps=8, guidance_scale=4.0,
        width=32, height=32, mode="t2i", optimization=OptimizationSettings("fast")), {},
        lambda *a: None)
    assert np.isfinite(cached.frames).all()
    assert any("denoiser calls computed in full" in n for n in cached.notes), cached.notes
    assert not any(", 0 forecast" in n for n in cached.notes), cached.notes  # it skipped
