"""Qwen-Image through the registry: t2i, i2i and inpainting on a tiny random-weight pipeline
(real Qwen2.5-VL, VAE and transformer classes) give stock diffusers' pixels."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from studio.core.media import pixels_content_id
from studio.core.request import GenerationRequest, MediaRef
from studio.engine.executor import runner_class
from studio.engine.models.registry import ModelRegistry
from studio.testing.tiny_pipelines import build_tiny_qwen_image

IMAGE = (np.random.default_rng(4).random((32, 32, 3)) * 255).astype(np.uint8)
MASK = np.zeros((32, 32), np.uint8)
MASK[8:24, 4:20] = 255
REF = MediaRef(pixels_content_id(IMAGE), "init.png")
MASK_REF = MediaRef(pixels_content_id(MASK), "mask.png")


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    folder = build_tiny_qwen_image(tmp_path_factory.mktemp("qwen") / "qwen")
    entry = ModelRegistry(include_hf_cache=False).resolve(str(folder))
    assert entry.family == "qwen-image" and entry.usable, entry.error
    return folder, runner_class(entry.family)(entry, torch.device("cpu"), torch.float32)


@pytest.mark.parametrize("cls_name,fields,extra", [
    ("QwenImagePipeline", dict(mode="t2i"), {}),
    ("QwenImageImg2ImgPipeline", dict(mode="i2i", init_image=REF, strength=0.7),
     dict(image=Image.fromarray(IMAGE), strength=0.7)),
    ("QwenImageInpaintPipeline", dict(mode="i2i", init_image=REF, mask=MASK_REF, strength=0.9),
     dict(image=Image.fromarray(IMAGE), mask_image=Image.fromarray(MASK), strength=0.9))])
def test_same_pixels_as_stock_diffusers(qwen, cls_name, fields, extra):
    import diffusers

    folder, runner = qwen
    request = GenerationRequest(model=str(folder), prompt="a red circle on grass",
                                negative_prompt="blurry", seed=8, steps=2, guidance_scale=4.0,
                                width=32, height=32, **fields)
    assert request.validate(runner.entry.capabilities) == []
    previews = []
    ours = runner.run(request, {REF.content_id: IMAGE, MASK_REF.content_id: MASK},
                      lambda i, n, lat: previews.append(runner.preview(lat).shape))
    pipe = getattr(diffusers, cls_name).from_pretrained(folder, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    theirs = np.asarray(pipe(prompt=request.prompt, negative_prompt="blurry", height=32,
                             width=32, num_inference_steps=2, true_cfg_scale=4.0,
                             max_sequence_length=512,
                             generator=torch.Generator().manual_seed(8), output_type="np",
                             **extra).images, dtype=np.float32)
    if "mask" in fields:
        keep = (MASK < 128)[None, :, :, None]
        theirs = np.where(keep, IMAGE[None].astype(np.float32) / 255.0, theirs)
    assert ours.frames.shape == theirs.shape
    assert np.abs(ours.frames - theirs).max() <= 1e-5
    assert previews and all(p[2] == 3 for p in previews)
