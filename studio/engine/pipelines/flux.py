"""FLUX.1 (dev, schnell): text-to-image with ``FluxPipeline``, image-to-image with
``FluxImg2ImgPipeline`` sharing the same weights.

``guidance_scale`` is FLUX.1-dev's distilled guidance (the embedded guidance vector); true
classifier-free guidance with a negative prompt is not used, so a negative prompt has no
effect on FLUX.1 and the finished job says so.
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


class FluxRunner(FamilyRunner):
    """Runs FLUX.1 requests on one loaded model."""

    classifier_free_guidance = False  # guidance-distilled; true CFG is not used

    def __init__(self, entry, device, dtype, load_device=None):
        super().__init__(entry, device, dtype, load_device)
        from diffusers import FluxImg2ImgPipeline, FluxPipeline

        base = load_pipeline(FluxPipeline, entry, dtype).to(self.load_device)
        base.set_progress_bar_config(disable=True)
        self.pipes = {"t2i": base, "i2i": derive_pipeline(FluxImg2ImgPipeline, base)}
        self.base = base
        self.vae_scale_factor = base.vae_scale_factor
        self.preview = self.kl_latent_preview()

    @torch.no_grad()
    def decode(self, pipe, latents: torch.Tensor, height: int, width: int) -> np.ndarray:
        """Packed latents -> float32 images (B, H, W, 3) in [0, 1], as FluxPipeline's own
        tail does it (same ops, same order: the same pixels)."""
        vae = self.base.vae
        latents = pipe._unpack_latents(latents, height, width, self.vae_scale_factor)
        latents = (latents / vae.config.scaling_factor) + vae.config.shift_factor
        image = vae.decode(latents, return_dict=False)[0]
        return np.asarray(pipe.image_processor.postprocess(image, output_type="np"),
                          dtype=np.float32)

    def stage_inputs(self, request: GenerationRequest) -> dict:
        base, dev = self.base, self.weights_device()
        tr, vae = base.transformer, base.vae
        cfg = tr.config
        h, w = request.height // self.vae_scale_factor, request.width // self.vae_scale_factor
        tokens = (h // 2) * (w // 2)
        max_len = int(self.entry.call_kwargs.get("max_sequence_length", 512))
        hidden = torch.zeros(1, tokens, cfg.in_channels, device=dev, dtype=tr.dtype)
        text = torch.zeros(1, max_len, cfg.joint_attention_dim, device=dev, dtype=tr.dtype)
        pooled = torch.zeros(1, cfg.pooled_projection_dim, device=dev, dtype=tr.dtype)
        img_ids = torch.zeros(tokens, 3, device=dev)
        txt_ids = torch.zeros(max_len, 3, device=dev)
        guidance = torch.zeros(1, device=dev) if cfg.guidance_embeds else None

        def denoise(hs, eh, pp, ii, ti):
            return tr(hidden_states=hs, timestep=torch.zeros(1, device=hs.device),
                      encoder_hidden_states=eh, pooled_projections=pp, img_ids=ii,
                      txt_ids=ti, guidance=guidance, return_dict=False)

        ids = torch.zeros(1, max_len, dtype=torch.long, device=dev)
        clip_ids = torch.zeros(1, base.tokenizer.model_max_length, dtype=torch.long, device=dev)
        latents = torch.zeros(1, int(vae.config.latent_channels), h, w, device=dev,
                              dtype=vae.dtype)

        def text_encode(t5_ids, c_ids):
            base.text_encoder(c_ids)
            return base.text_encoder_2(t5_ids)

        return {
            "text_encode": ([base.text_encoder, base.text_encoder_2], text_encode,
                            (ids, clip_ids)),
            "denoise": ([tr], denoise, (hidden, text, pooled, img_ids, txt_ids)),
            "decode": ([vae], lambda z: vae.decode(z, return_dict=False), (latents,)),
        }

    @torch.no_grad()
    def run(self, request: GenerationRequest, inputs: dict[str, np.ndarray],
            on_step: StepFn) -> RunOutput:
        from diffusers import FluxPipeline

        pipe = self.pipes[request.mode]
        clock = StageClock([pipe.transformer])
        h, w, vsf = request.height, request.width, self.vae_scale_factor

        def unpack(latents: torch.Tensor) -> torch.Tensor:
            return FluxPipeline._unpack_latents(latents, h, w, vsf)

        timings: dict[str, float] = {}
        notes: list[str] = []
        max_len = int(self.entry.call_kwargs.get("max_sequence_length", 512))
        prompt_embeds, pooled, _ = self.encode_text(
            (request.prompt, max_len),
            lambda: pipe.encode_prompt(request.prompt, None, device=self.device,
                                       max_sequence_length=max_len),
            timings, notes)
        kwargs = dict(prompt_embeds=prompt_embeds, pooled_prompt_embeds=pooled,
                      max_sequence_length=max_len, height=h, width=w,
                      num_inference_steps=request.steps, guidance_scale=request.guidance_scale,
                      generator=self.generator(request.seed), output_type="np",
                      callback_on_step_end=make_callback(on_step, clock, unpack),
                      callback_on_step_end_tensor_inputs=["latents"])
        if request.mode == "i2i":
            image = fit_image(inputs[request.init_image.content_id], w, h)
            kwargs.update(image=to_pil(image), strength=request.strength)
        notes = self.apply_profile(request) + notes
        kwargs["output_type"] = "latent"  # kept: a failed decode is retried tiled
        latents = pipe(**kwargs).images
        images = self.decode_with_retry(lambda: self.decode(pipe, latents, h, w), notes)
        if request.negative_prompt:
            notes.append("FLUX.1 ignores the negative prompt")
        return self.result(images, timings, clock, notes)
