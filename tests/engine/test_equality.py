"""Our pipelines give stock diffusers' pixels for the same seed and settings (float32, CPU).

Each tiny model is saved with save_pretrained, loaded through the registry and run by the
studio's family runner; the stock pipeline is loaded from the same folder by diffusers alone.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from studio.core.media import pixels_content_id
from studio.core.request import GenerationRequest, MediaRef
from studio.engine.executor import JobExecutor, runner_class
from studio.engine.models.registry import ModelRegistry

RNG = np.random.default_rng(7)
IMAGE = (RNG.random((32, 48, 3)) * 255).astype(np.uint8)
REF = MediaRef(pixels_content_id(IMAGE), "test.png")


def stock(cls_name: str, folder, **kwargs) -> np.ndarray:
    import diffusers

    cls = getattr(diffusers, cls_name)
    pipe = cls.from_pretrained(folder, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    out = pipe(generator=torch.Generator().manual_seed(kwargs.pop("seed")), output_type="np",
               **kwargs)
    frames = out.frames[0] if hasattr(out, "frames") else out.images
    return np.asarray(frames, dtype=np.float32)


CASES = [
    # (model, stock class, request fields, stock extra kwargs)
    ("wan-t2v", "WanPipeline", dict(mode="t2v", num_frames=5), dict(num_frames=5)),
    ("wan-t2v", "WanPipeline", dict(mode="t2i", num_frames=1), dict(num_frames=1)),
    ("wan-t2v", "WanVideoToVideoPipeline", dict(mode="i2i", init_image=REF, strength=0.6),
     dict(video=[Image.fromarray(IMAGE)], strength=0.6)),
    ("wan-ti2v", "WanImageToVideoPipeline", dict(mode="i2v", num_frames=5, first_frame=REF),
     dict(num_frames=5, image=Image.fromarray(IMAGE))),
    ("wan-i2v", "WanImageToVideoPipeline", dict(mode="i2v", num_frames=5, first_frame=REF),
     dict(num_frames=5, image=Image.fromarray(IMAGE))),
    ("wan-a14b", "WanPipeline", dict(mode="t2v", num_frames=5), dict(num_frames=5)),
    ("flux", "FluxPipeline", dict(mode="t2i"), dict()),
    ("flux", "FluxImg2ImgPipeline", dict(mode="i2i", init_image=REF, strength=0.7),
     dict(image=Image.fromarray(IMAGE), strength=0.7)),
]


@pytest.mark.parametrize("model,cls_name,fields,extra", CASES,
                         ids=[f"{c[0]}-{c[2]['mode']}" for c in CASES])
def test_same_pixels_as_stock_diffusers(tiny_models, model, cls_name, fields, extra):
    folder = tiny_models[model]
    entry = ModelRegistry(include_hf_cache=False).resolve(str(folder))
    runner = runner_class(entry.family)(entry, torch.device("cpu"), torch.float32)
    request = GenerationRequest(model=str(folder), prompt="a red circle on grass",
                                negative_prompt="", seed=11, steps=3, guidance_scale=4.0,
                                width=48, height=32, **fields)
    assert request.validate(entry.capabilities) == []
    steps = []
    ours = runner.run(request, {REF.content_id: IMAGE},
                      lambda i, n, lat: steps.append((i, n, runner.preview(lat).shape)))
    theirs = stock(cls_name, folder, prompt=request.prompt, negative_prompt="", seed=11,
                   num_inference_steps=3, guidance_scale=4.0, height=32, width=48, **extra)
    assert ours.frames.shape == theirs.shape
    assert np.abs(ours.frames - theirs).max() <= 1e-5
    # one progress report per step actually run, with a preview no larger than 256 px
    total = steps[-1][1]
    assert [s[0] for s in steps] == list(range(1, total + 1))
    assert all(max(s[2][:2]) <= 256 and s[2][2] == 3 for s in steps)
    assert set(ours.timings) == {"prepare", "text_encode", "denoise", "decode"}


def test_finished_frames_are_stock_rounding(tiny_models):
    folder = tiny_models["wan-t2v"]
    from studio.engine.executor import Job

    request = GenerationRequest(mode="t2v", model=str(folder), prompt="a blue star", seed=5,
                                steps=2, guidance_scale=3.0, width=32, height=32, num_frames=5)
    events = []
    result = JobExecutor(ModelRegistry(include_hf_cache=False)).execute(
        Job("j", request), events.append, lambda: False)
    theirs = stock("WanPipeline", folder, prompt="a blue star", negative_prompt="", seed=5,
                   num_inference_steps=2, guidance_scale=3.0, height=32, width=32, num_frames=5)
    assert result.frames.dtype == np.uint8 and result.frames.shape == (5, 32, 32, 3)
    assert np.array_equal(result.frames, (theirs * 255).round().astype(np.uint8))


def test_two_expert_wan_uses_both_experts_and_caches_each(tiny_models):
    from studio.core.request import OptimizationSettings

    folder = tiny_models["wan-a14b"]
    entry = ModelRegistry(include_hf_cache=False).resolve(str(folder))
    runner = runner_class(entry.family)(entry, torch.device("cpu"), torch.float32)
    assert len(runner.denoisers()) == 2
    calls = {"high": 0, "low": 0}
    runner.base.transformer.register_forward_pre_hook(
        lambda *_: calls.__setitem__("high", calls["high"] + 1))
    runner.base.transformer_2.register_forward_pre_hook(
        lambda *_: calls.__setitem__("low", calls["low"] + 1))
    request = GenerationRequest(model=str(folder), prompt="a red circle", seed=1, steps=8,
                                guidance_scale=4.0, width=32, height=32, mode="t2v",
                                num_frames=5, optimization=OptimizationSettings("fast"))
    out = runner.run(request, {}, lambda *a: None)
    assert calls["high"] > 0 and calls["low"] > 0 and calls["high"] + calls["low"] == 16
    assert any("denoiser calls computed in full" in n for n in out.notes)
