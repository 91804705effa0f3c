"""Model families: which diffusers pipeline classes belong to which family, and the
capabilities (modes, size and frame rules, defaults) read from a folder's configs."""

from __future__ import annotations

import math
from pathlib import Path

from studio.core.capabilities import ModelCapabilities
from studio.engine.models.folders import ModelError, read_json

PIPELINE_FAMILIES = {
    "WanPipeline": "wan",
    "WanImageToVideoPipeline": "wan",
    "WanVideoToVideoPipeline": "wan",
    "FluxPipeline": "flux",
    "FluxImg2ImgPipeline": "flux",
    "StableDiffusionPipeline": "sd",
    "StableDiffusionImg2ImgPipeline": "sd",
    "StableDiffusionInpaintPipeline": "sd",
    "StableDiffusionXLPipeline": "sdxl",
    "StableDiffusionXLImg2ImgPipeline": "sdxl",
    "StableDiffusionXLInpaintPipeline": "sdxl",
    "StableDiffusion3Pipeline": "sd3",
    "StableDiffusion3Img2ImgPipeline": "sd3",
    "StableDiffusion3InpaintPipeline": "sd3",
    "WanVACEPipeline": "wan-vace",
    "QwenImagePipeline": "qwen-image",
    "QwenImageImg2ImgPipeline": "qwen-image",
    "QwenImageInpaintPipeline": "qwen-image",
    "Flux2Pipeline": "flux2",
    "HiDreamImagePipeline": "hidream",
    "LTXPipeline": "ltx",
    "LTXImageToVideoPipeline": "ltx",
    "LTX2Pipeline": "ltx2",
    "LTX2ImageToVideoPipeline": "ltx2",
}
SUPPORTED_FAMILIES = ("wan", "wan-vace", "flux", "flux2", "hidream", "sd", "sdxl", "sd3",
                      "ltx", "ltx2", "qwen-image")


def family_of(pipeline_class: str) -> str:
    """The family of a diffusers pipeline class name, or ``unknown``."""
    return PIPELINE_FAMILIES.get(pipeline_class, "unknown")


def _wan_caps(folder: Path, index: dict, name: str, extra: dict) -> ModelCapabilities:
    vae = read_json(folder / "vae" / "config.json", name)
    tr = read_json(folder / "transformer" / "config.json", name)
    spatial = int(vae.get("scale_factor_spatial") or 8)
    temporal = int(vae.get("scale_factor_temporal") or 4)
    patch = tr.get("patch_size") or [1, 2, 2]
    z_dim = int(vae.get("z_dim", 16))
    in_ch = int(tr.get("in_channels", z_dim))
    cls = index.get("_class_name")
    expand = bool(index.get("expand_timesteps"))
    modes: set[str] = set()
    if cls == "WanVACEPipeline":
        modes |= {"t2v", "t2i", "i2v", "r2v"}  # VACE: control frames, masks, references
    elif in_ch == z_dim:
        # Latents-only input: text-to-video, images as one-frame videos, and SDEdit.
        modes |= {"t2v", "t2i", "i2i"}
        if extra.get("reference_frames") == "append":
            modes.add("r2v")  # trained with a clean reference frame after the clip
        if expand:
            # Wan 2.2 TI2V: clean first-frame latents, zero timestep. Its folder says
            # WanPipeline with expand_timesteps (Wan-AI/Wan2.2-TI2V-5B-Diffusers), and the
            # runner derives the image-to-video pipeline over the same modules
            modes.add("i2v")
    elif cls == "WanImageToVideoPipeline":
        modes.add("i2v")  # Wan 2.1 I2V: image latents and mask concatenated on channels
    if not modes:
        raise ModelError(f"Wan transformer with {in_ch} input channels and a VAE with "
                         f"{z_dim} latent channels is not a layout this studio runs")
    big = int(tr.get("num_layers", 1)) >= 20
    ti2v = big and expand and in_ch == z_dim  # Wan 2.2 TI2V 5B: 24 fps, 121 frames, 720p
    multiple = spatial * int(patch[1])
    if cls == "WanImageToVideoPipeline":
        # its check_inputs wants sides divisible by 16 whatever the VAE and patch (a VAE
        # with 4x downsampling and patch 2 would otherwise allow multiples of 8)
        multiple = math.lcm(multiple, 16)
    return ModelCapabilities(
        name=name, family="wan-vace" if cls == "WanVACEPipeline" else "wan",
        modes=frozenset(modes),
        spatial_multiple=multiple, frame_multiple=temporal,
        min_size=multiple, max_size=1920 if big else 512,
        max_pixels=1280 * 720 if big else 512 * 512, max_frames=161 if big else 81,
        default_width=(1280 if ti2v else 832) if big else 64,
        default_height=(704 if ti2v else 480) if big else 64,
        default_frames=(121 if ti2v else 81) if big else 9,
        default_fps=24.0 if ti2v else 16.0, default_steps=50 if big else 20,
        default_guidance=5.0, guidance_range=(1.0, 20.0), supports_mask="i2i" in modes,
        max_references=(3 if cls == "WanVACEPipeline" else 1) if "r2v" in modes else 0)


def _flux_caps(folder: Path, index: dict, name: str, extra: dict) -> ModelCapabilities:
    vae = read_json(folder / "vae" / "config.json", name)
    tr = read_json(folder / "transformer" / "config.json", name)
    spatial = 2 ** (len(vae.get("block_out_channels", [0, 0, 0, 0])) - 1)
    big = int(tr.get("num_single_layers", 1)) >= 20
    distilled = bool(tr.get("guidance_embeds", False))
    return ModelCapabilities(
        name=name, family="flux", modes=frozenset({"t2i", "i2i"}),
        spatial_multiple=spatial * 2, min_size=spatial * 2, max_size=2048 if big else 512,
        max_pixels=2048 * 2048 if big else 512 * 512,
        default_width=1024 if big else 64, default_height=1024 if big else 64,
        default_steps=28 if big else 8, default_guidance=3.5 if distilled else 0.0,
        guidance_range=(0.0, 30.0))


def _sd_caps(folder: Path, index: dict, name: str, family: str) -> ModelCapabilities:
    vae = read_json(folder / "vae" / "config.json", name)
    spatial = 2 ** (len(vae.get("block_out_channels", [0, 0, 0, 0])) - 1)
    if family == "sd3":
        den = read_json(folder / "transformer" / "config.json", name)
        big = int(den.get("num_layers", 1)) >= 12
        multiple = spatial * int(den.get("patch_size", 2))
        inpaint_only = False
        native, steps, guidance = 1024, 28, 7.0
    else:
        den = read_json(folder / "unet" / "config.json", name)
        big = max(den.get("block_out_channels", [0])) >= 320
        multiple = spatial
        inpaint_only = int(den.get("in_channels", 4)) == 9
        native = 1024 if family == "sdxl" else 512
        steps, guidance = (30, 5.0) if family == "sdxl" else (30, 7.5)
    modes = {"i2i"} if inpaint_only else {"t2i", "i2i"}
    return ModelCapabilities(
        name=name, family=family, modes=frozenset(modes), spatial_multiple=multiple,
        min_size=multiple, max_size=2 * native if big else 512,
        max_pixels=(2 * native) ** 2 if big else 512 * 512,
        default_width=native if big else 64, default_height=native if big else 64,
        default_steps=steps if big else 8, default_guidance=guidance,
        guidance_range=(1.0, 20.0), supports_mask=True)


def _ltx_caps(folder: Path, index: dict, name: str) -> ModelCapabilities:
    vae = read_json(folder / "vae" / "config.json", name)
    tr = read_json(folder / "transformer" / "config.json", name)
    scaling = vae.get("spatio_temporal_scaling", [True, True, True, False])
    stages = 2 ** sum(bool(x) for x in scaling)
    # the explicit ratios first, as diffusers reads them (LTX-Video 0.9.5's VAE has four
    # scaling stages and says 32 and 8, not 64 and 16)
    spatial = int(vae.get("spatial_compression_ratio") or int(vae.get("patch_size", 4)) * stages)
    temporal = int(vae.get("temporal_compression_ratio")
                   or int(vae.get("patch_size_t", 1)) * stages)
    multiple = spatial * int(tr.get("patch_size", 1))
    big = int(tr.get("num_layers", 1)) >= 20
    return ModelCapabilities(
        name=name, family="ltx", modes=frozenset({"t2v", "t2i", "i2v"}),
        spatial_multiple=multiple, frame_multiple=temporal, min_size=multiple,
        max_size=1280 if big else 256, max_pixels=1280 * 720 if big else 256 * 256,
        max_frames=257 if big else 33, default_width=704 if big else 64,
        default_height=480 if big else 64, default_frames=121 if big else 9,
        default_fps=24.0, default_steps=50 if big else 8, default_guidance=3.0,
        guidance_range=(1.0, 20.0))


def _ltx2_caps(folder: Path, index: dict, name: str) -> ModelCapabilities:
    """LTX-2 (audio-video): sizes multiples of 32 (``LTX2Pipeline.check_inputs``) and of the
    VAE's spatial factor times the transformer's patch; frame counts ``8k+1`` (the VAE's
    temporal factor). The VAE's factors are read as diffusers computes them: the explicit
    ``spatial/temporal_compression_ratio`` when the config has one, else ``patch_size *
    2**(scaling stages)``."""
    vae = read_json(folder / "vae" / "config.json", name)
    tr = read_json(folder / "transformer" / "config.json", name)
    scaling = vae.get("spatio_temporal_scaling", [True] * 4)
    if isinstance(scaling, bool):
        scaling = [scaling] * (len(vae.get("layers_per_block", [0] * 5)) - 1)
    stages = 2 ** sum(bool(x) for x in scaling)
    spatial = int(vae.get("spatial_compression_ratio") or int(vae.get("patch_size", 4)) * stages)
    temporal = int(vae.get("temporal_compression_ratio")
                   or int(vae.get("patch_size_t", 1)) * stages)
    multiple = math.lcm(32, spatial * int(tr.get("patch_size", 1)))
    big = int(tr.get("num_layers", 1)) >= 20
    return ModelCapabilities(
        name=name, family="ltx2", modes=frozenset({"t2v", "t2i", "i2v"}),
        spatial_multiple=multiple, frame_multiple=temporal * int(tr.get("patch_size_t", 1)),
        min_size=multiple, max_size=1920 if big else 256,
        max_pixels=1920 * 1088 if big else 256 * 256, max_frames=257 if big else 33,
        default_width=768 if big else 96, default_height=512 if big else 64,
        default_frames=121 if big else 9, default_fps=24.0, default_steps=30 if big else 8,
        default_guidance=3.0, guidance_range=(1.0, 20.0))


def _qwen_caps(folder: Path, index: dict, name: str) -> ModelCapabilities:
    vae = read_json(folder / "vae" / "config.json", name)
    tr = read_json(folder / "transformer" / "config.json", name)
    spatial = 2 ** len(vae.get("temperal_downsample", [False, True, True]))
    multiple = spatial * int(tr.get("patch_size", 2))
    big = int(tr.get("num_layers", 1)) >= 20
    return ModelCapabilities(
        name=name, family="qwen-image", modes=frozenset({"t2i", "i2i"}),
        spatial_multiple=multiple, min_size=multiple, max_size=2048 if big else 256,
        max_pixels=2048 * 2048 if big else 256 * 256, default_width=1328 if big else 64,
        default_height=1328 if big else 64, default_steps=50 if big else 8,
        default_guidance=4.0, guidance_range=(1.0, 20.0), supports_mask=True)


def _flux2_caps(folder: Path, index: dict, name: str) -> ModelCapabilities:
    vae = read_json(folder / "vae" / "config.json", name)
    tr = read_json(folder / "transformer" / "config.json", name)
    multiple = 2 ** (len(vae.get("block_out_channels", [0, 0, 0, 0])) - 1) * 2
    big = int(tr.get("num_single_layers", 1)) >= 20
    return ModelCapabilities(
        name=name, family="flux2", modes=frozenset({"t2i"}), spatial_multiple=multiple,
        min_size=multiple, max_size=2048 if big else 256,
        max_pixels=2048 * 2048 if big else 256 * 256, default_width=1024 if big else 64,
        default_height=1024 if big else 64, default_steps=50 if big else 8,
        default_guidance=4.0, guidance_range=(0.0, 20.0))


def _hidream_caps(folder: Path, index: dict, name: str) -> ModelCapabilities:
    vae = read_json(folder / "vae" / "config.json", name)
    tr = read_json(folder / "transformer" / "config.json", name)
    multiple = 2 ** (len(vae.get("block_out_channels", [0, 0, 0, 0])) - 1) * int(
        tr.get("patch_size", 2))
    big = int(tr.get("num_single_layers", 1)) >= 20
    return ModelCapabilities(
        name=name, family="hidream", modes=frozenset({"t2i"}), spatial_multiple=multiple,
        min_size=multiple, max_size=2048 if big else 256,
        max_pixels=2048 * 2048 if big else 256 * 256, default_width=1024 if big else 64,
        default_height=1024 if big else 64, default_steps=50 if big else 8,
        default_guidance=5.0, guidance_range=(1.0, 20.0))


def capabilities_for(family: str, folder: Path, index: dict, *, name: str,
                     extra: dict | None = None) -> ModelCapabilities:
    """Reads a folder's configs (and its optional ``studio.json``, ``extra``) into
    :class:`ModelCapabilities`.

    Raises:
        ModelError: the family is not supported, or its configs do not fit it.
    """
    if family in ("wan", "wan-vace"):
        return _wan_caps(folder, index, name, extra or {})
    if family == "flux":
        return _flux_caps(folder, index, name, extra or {})
    if family in ("sd", "sdxl", "sd3"):
        return _sd_caps(folder, index, name, family)
    if family == "ltx":
        return _ltx_caps(folder, index, name)
    if family == "ltx2":
        return _ltx2_caps(folder, index, name)
    if family == "qwen-image":
        return _qwen_caps(folder, index, name)
    if family == "flux2":
        return _flux2_caps(folder, index, name)
    if family == "hidream":
        return _hidream_caps(folder, index, name)
    cls = index.get("_class_name", "?")
    raise ModelError(f"pipeline {cls} is not supported yet (supported families: "
                     f"{', '.join(SUPPORTED_FAMILIES)})")
