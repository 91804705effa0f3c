"""Stable Diffusion 1.5, SDXL (and an inpainting UNet) and SD3 through the registry: each
family × mode on a tiny random-weight pipeline saved in diffusers format, run by the studio's
runner for 2 steps on the CPU, gives stock diffusers' pixels for the same seed."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from studio.core.media import pixels_content_id
from studio.core.request import GenerationRequest, MediaRef
from studio.engine.executor import runner_class
from studio.engine.models.registry import ModelRegistry
from studio.testing.tiny_pipelines import build_tiny_sd

RNG = np.random.default_rng(11)
IMAGE = (RNG.random((64, 64, 3)) * 255).astype(np.uint8)
MASK = np.zeros((64, 64), np.uint8)
MASK[16:48, 8:40] = 255
REF = MediaRef(pixels_content_id(IMAGE), "init.png")
MASK_REF = MediaRef(pixels_content_id(MASK), "mask.png")


@pytest.fixture(scope="module")
def sd_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("sd-models")
    return {v: build_tiny_sd(root / v, variant=v) for v in ("sd15", "sdxl", "sd3",
                                                             "sd15-inpaint")}


def stock(cls_name, folder, **kwargs):
    import diffusers

    pipe = getattr(diffusers, cls_name).from_pretrained(folder, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    out = pipe(generator=torch.Generator().manual_seed(kwargs.pop("seed")), output_type="np",
               **kwargs)
    return np.asarray(out.images, dtype=np.float32)


CASES = [
    ("sd15", "sd", "StableDiffusionPipeline", dict(mode="t2i"), {}),
    ("sd15", "sd", "StableDiffusionImg2ImgPipeline", dict(mode="i2i", init_image=REF,
                                                          strength=0.7),
     dict(image=Image.fromarray(IMAGE), strength=0.7)),
    ("sd15", "sd", "StableDiffusionInpaintPipeline",
     dict(mode="i2i", init_image=REF, mask=MASK_REF, strength=0.9),
     dict(image=Image.fromarray(IMAGE), mask_image=Image.fromarray(MASK), strength=0.9)),
    ("sd15-inpaint", "sd", "StableDiffusionInpaintPipeline",
     dict(mode="i2i", init_image=REF, mask=MASK_REF, strength=1.0),
     dict(image=Image.fromarray(IMAGE), mask_image=Image.fromarray(MASK), strength=1.0)),
    ("sdxl", "sdxl", "StableDiffusionXLPipeline", dict(mode="t2i"), {}),
    ("sdxl", "sdxl", "StableDiffusionXLImg2ImgPipeline",
     dict(mode="i2i", init_image=REF, strength=0.7),
     dict(image=Image.fromarray(IMAGE), strength=0.7)),
    ("sdxl", "sdxl", "StableDiffusionXLInpaintPipeline",
     dict(mode="i2i", init_image=REF, mask=MASK_REF, strength=0.9),
     dict(image=Image.fromarray(IMAGE), mask_image=Image.fromarray(MASK), strength=0.9)),
    ("sd3", "sd3", "StableDiffusion3Pipeline", dict(mode="t2i"), {}),
    ("sd3", "sd3", "StableDiffusion3Img2ImgPipeline",
     dict(mode="i2i", init_image=REF, strength=0.7),
     dict(image=Image.fromarray(IMAGE), strength=0.7)),
    ("sd3", "sd3", "StableDiffusion3InpaintPipeline",
     dict(mode="i2i", init_image=REF, mask=MASK_REF, strength=0.9),
     dict(image=Image.fromarray(IMAGE), mask_image=Image.fromarray(MASK), strength=0.9)),
]


@pytest.mark.parametrize("model,family,cls_name,fields,extra", CASES,
                         ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_same_pixels_as_stock_diffusers(sd_models, model, family, cls_name, fields, extra):
    folder = sd_models[model]
    entry = ModelRegistry(include_hf_cache=False).resolve(str(folder))
    assert entry.family == family and entry.usable, entry.error
    runner = runner_class(entry.family)(entry, torch.device("cpu"), torch.float32)
    request = GenerationRequest(model=str(folder), prompt="a red circle on grass",
                                negative_prompt="blurry", seed=5, steps=2, guidance_scale=5.0,
                                width=64, height=64, **fields)
    assert request.validate(entry.capabilities) == []
    steps = []
    ours = runner.run(request, {REF.content_id: IMAGE, MASK_REF.content_id: MASK},
                      lambda i, n, lat: steps.append((i, runner.preview(lat).shape)))
    more = {"max_sequence_length": 256} if family == "sd3" else {}
    theirs = stock(cls_name, folder, prompt=request.prompt, negative_prompt="blurry", seed=5,
                   num_inference_steps=2, guidance_scale=5.0, height=64, width=64,
                   **extra, **more)
    if "mask" in fields:  # pixels outside the mask are the init image's, exactly
        keep = (MASK < 128)[None, :, :, None]
        theirs = np.where(keep, IMAGE[None].astype(np.float32) / 255.0, theirs)
        assert np.array_equal(ours.frames[0][MASK < 128], IMAGE[MASK < 128] / np.float32(255))
    assert ours.frames.shape == theirs.shape
    assert np.abs(ours.frames - theirs).max() <= 1e-5
    assert steps and all(s[1][2] == 3 for s in steps)


def test_inpainting_unet_offers_image_to_image_only(sd_models):
    entry = ModelRegistry(include_hf_cache=False).resolve(str(sd_models["sd15-inpaint"]))
    assert entry.capabilities.modes == {"i2i"} and entry.capabilities.supports_mask
    for v in ("sd15", "sdxl", "sd3"):
        caps = ModelRegistry(include_hf_cache=False).resolve(str(sd_models[v])).capabilities
        assert caps.modes == {"t2i", "i2i"}
