"""Stable Diffusion 1.5, SDXL and SD 3/3.5: text-to-image, image-to-image and inpainting
(image-to-image with a mask) through diffusers' own pipelines, sharing one set of weights.

Families and classes (derived from the loaded pipeline's modules, never copied):

=======  ============================  =================================  ==============================
family   t2i                           i2i                                i2i with a mask (inpaint)
=======  ============================  =================================  ==============================
sd       StableDiffusionPipeline       StableDiffusionImg2ImgPipeline     StableDiffusionInpaintPipeline
sdxl     StableDiffusionXLPipeline     StableDiffusionXLImg2ImgPipeline   StableDiffusionXLInpaintPipeline
sd3      StableDiffusion3Pipeline      StableDiffusion3Img2ImgPipeline    StableDiffusion3InpaintPipeline
=======  ============================  =================================  ==============================

A 9-channel inpainting UNet (SD 1.5 / SDXL inpainting checkpoints) runs the inpaint pipeline
only (mode i2i; without a mask the whole image is repainted). Pixels outside a mask are the
init image's, exactly, as for every family. The safety checker is not loaded.
"""

from __future__ import annotations

import numpy as np
import torch

from studio.core.media import fit_image
from studio.core.request import GenerationRequest
from studio.engine.pipelines.base import (
    FamilyRunner,
    RunOutput,
    StageClock,
    StepFn,
    derive_pipeline,
    load_pipeline,
    make_callback,
    to_pil,
)

CLASSES = {
    "sd": ("StableDiffusionPipeline", "StableDiffusionImg2ImgPipeline",
           "StableDiffusionInpaintPipeline"),
    "sdxl": ("StableDiffusionXLPipeline", "StableDiffusionXLImg2ImgPipeline",
             "StableDiffusionXLInpaintPipeline"),
    "sd3": ("StableDiffusion3Pipeline", "StableDiffusion3Img2ImgPipeline",
            "StableDiffusion3InpaintPipeline"),
}


class StableDiffusionRunner(FamilyRunner):
    """Runs SD 1.5, SDXL and SD3 requests on one loaded model."""

    def __init__(self, entry, device, dtype, load_device=None):
        super().__init__(entry, device, dtype, load_device)
        import diffusers

        base = load_pipeline(diffusers.DiffusionPipeline, entry, dtype).to(self.load_device)
        base.set_progress_bar_config(disable=True)
        self.family = entry.family
        t2i, i2i, inpaint = (getattr(diffusers, name) for name in CLASSES[self.family])
        self.denoiser = getattr(base, "unet", None) or base.transformer
        self.inpaint_only = self.denoiser.config.in_channels == 9
        self.pipes = {"inpaint": derive_pipeline(inpaint, base)}
        if not self.inpaint_only:
            self.pipes.update(t2i=derive_pipeline(t2i, base), i2i=derive_pipeline(i2i, base))
        for pipe in self.pipes.values():
            pipe.set_progress_bar_config(disable=True)
        self.base = base
        self.vae_scale_factor = base.vae_scale_factor
        self.preview = self.kl_latent_preview()

    def _prompt_kwargs(self, pipe, request: GenerationRequest, timings, notes) -> dict:
        """The pipeline's prompt embeddings for the request, from the embedding cache."""
        cfg = request.guidance_scale > 1.0
        negative = request.negative_prompt if cfg else None
        if self.family == "sd":
            def encode():
                return pipe.encode_prompt(request.prompt, self.device, 1, cfg,
                                          negative_prompt=negative or None)
            names = ("prompt_embeds", "negative_prompt_embeds")
        else:
            extra = {}
            if self.family == "sd3":
                extra["max_sequence_length"] = int(
                    self.entry.call_kwargs.get("max_sequence_length", 256))

            def encode():
                return pipe.encode_prompt(
                    prompt=request.prompt, prompt_2=None,
                    **({"prompt_3": None} if self.family == "sd3" else {}),
                    device=self.device, num_images_per_prompt=1,
                    do_classifier_free_guidance=cfg, negative_prompt=negative or None,
                    **extra)
            names = ("prompt_embeds", "negative_prompt_embeds", "pooled_prompt_embeds",
                     "negative_pooled_prompt_embeds")
        values = self.encode_text((self.family, request.prompt, negative), encode, timings,
                                  notes)
        kwargs = {n: v for n, v in zip(names, values, strict=True) if v is not None}
        if self.family == "sd3":
            kwargs["max_sequence_length"] = int(
                self.entry.call_kwargs.get("max_sequence_length", 256))
        return kwargs

    @torch.no_grad()
    def run(self, request: GenerationRequest, inputs: dict[str, np.ndarray],
            on_step: StepFn) -> RunOutput:
        w, h = request.width, request.height
        masked = request.mode == "i2i" and (request.mask is not None or self.inpaint_only)
        key = "inpaint" if masked else request.mode
        pipe = self.pipes[key]
        clock = StageClock([self.denoiser])
        timings: dict[str, float] = {}
        notes: list[str] = []
        kwargs = dict(height=h, width=w, num_inference_steps=request.steps,
                      guidance_scale=request.guidance_scale,
                      generator=self.generator(request.seed), output_type="np",
                      callback_on_step_end=make_callback(on_step, clock),
                      callback_on_step_end_tensor_inputs=["latents"],
                      **self._prompt_kwargs(pipe, request, timings, notes))
        init = mask = None
        if request.mode == "i2i":
            init = fit_image(inputs[request.init_image.content_id], w, h)
            kwargs.update(image=to_pil(init), strength=request.strength)
            if masked:
                mask = (fit_image(inputs[request.mask.content_id], w, h)
                        if request.mask is not None else np.full((h, w), 255, np.uint8))
                if mask.ndim == 3:
                    mask = mask[..., 0]
                from PIL import Image

                kwargs["mask_image"] = Image.fromarray(np.ascontiguousarray(mask), "L")
        notes = self.apply_profile(request) + notes
        images = np.asarray(pipe(**kwargs).images, dtype=np.float32)
        if mask is not None:
            keep = (mask < 128)[None, :, :, None]
            images = np.where(keep, init[None].astype(np.float32) / 255.0, images)
        return self.result(images, timings, clock, notes)

    def stage_inputs(self, request: GenerationRequest) -> dict:
        base, dev = self.base, self.weights_device()
        vae, den = base.vae, self.denoiser
        h, w = request.height // self.vae_scale_factor, request.width // self.vae_scale_factor
        batch = 2 if request.guidance_scale > 1.0 else 1  # CFG runs as one batch here
        cfg = den.config
        ids = torch.zeros(1, base.tokenizer.model_max_length, dtype=torch.long, device=dev)
        encoders = [m for m in (base.text_encoder, getattr(base, "text_encoder_2", None),
                                getattr(base, "text_encoder_3", None)) if m is not None]
        if self.family == "sd3":
            text_len = ids.shape[1] + int(self.entry.call_kwargs.get("max_sequence_length", 256))
            args = (torch.zeros(batch, cfg.in_channels, h, w, device=dev, dtype=den.dtype),
                    torch.zeros(batch, text_len, cfg.joint_attention_dim, device=dev,
                                dtype=den.dtype),
                    torch.zeros(batch, cfg.pooled_projection_dim, device=dev, dtype=den.dtype))

            def denoise(x, text, pooled):
                return den(hidden_states=x, encoder_hidden_states=text,
                           pooled_projections=pooled,
                           timestep=torch.zeros(x.shape[0], device=x.device), return_dict=False)
        else:
            args = (torch.zeros(batch, cfg.in_channels, h, w, device=dev, dtype=den.dtype),
                    torch.zeros(batch, ids.shape[1], cfg.cross_attention_dim, device=dev,
                                dtype=den.dtype))
            added = None
            if self.family == "sdxl":
                added = {"text_embeds": torch.zeros(
                    batch, base.text_encoder_2.config.projection_dim, device=dev,
                    dtype=den.dtype),
                    "time_ids": torch.zeros(batch, 6, device=dev, dtype=den.dtype)}

            def denoise(x, text):
                return den(x, torch.zeros(1, device=x.device), text,
                           added_cond_kwargs=added, return_dict=False)
        latents = torch.zeros(1, int(vae.config.latent_channels), h, w, device=dev,
                              dtype=vae.dtype)
        return {
            "text_encode": (encoders, lambda i: base.text_encoder(i), (ids,)),
            "denoise": ([den], denoise, args),
            "decode": ([vae], lambda z: vae.decode(z, return_dict=False), (latents,)),
        }
