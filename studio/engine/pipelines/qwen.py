"""Qwen-Image: text-to-image (``QwenImagePipeline``), image-to-image
(``QwenImageImg2ImgPipeline``) and inpainting (``QwenImageInpaintPipeline``) on one set of
weights.

Qwen-Image runs true classifier-free guidance: the request's guidance scale is its
``true_cfg_scale`` and the negative prompt (empty by default) is always encoded when the scale
is above 1, as the stock pipeline does when given one. Latents are 2x2-packed tokens during
denoising; the preview unpacks them with the pipeline's own helper.
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
from studio.engine.preview import LatentPreview


class QwenImageRunner(FamilyRunner):
    """Runs Qwen-Image requests on one loaded model."""

    def __init__(self, entry, device, dtype, load_device=None):
        super().__init__(entry, device, dtype, load_device)
        import diffusers

        base = load_pipeline(diffusers.DiffusionPipeline, entry, dtype).to(self.load_device)
        base.set_progress_bar_config(disable=True)
        self.pipes = {"t2i": derive_pipeline(diffusers.QwenImagePipeline, base),
                      "i2i": derive_pipeline(diffusers.QwenImageImg2ImgPipeline, base),
                      "inpaint": derive_pipeline(diffusers.QwenImageInpaintPipeline, base)}
        for pipe in self.pipes.values():
            pipe.set_progress_bar_config(disable=True)
        self.base = base
        self.vae_scale_factor = base.vae_scale_factor
        self.preview = self._fit_preview()

    def _fit_preview(self) -> LatentPreview:
        vae = self.base.vae
        z = int(vae.config.z_dim)
        mean = torch.tensor(vae.config.latents_mean).view(1, z, 1, 1, 1)
        std = torch.tensor(vae.config.latents_std).view(1, z, 1, 1, 1)

        def decode(latents: torch.Tensor) -> torch.Tensor:
            return vae.decode(latents * std.to(latents) + mean.to(latents),
                              return_dict=False)[0]

        return LatentPreview.fit(decode, (z, 1, 4, 4), self.vae_scale_factor,
                                 device=vae.device, dtype=vae.dtype)

    @torch.no_grad()
    def run(self, request: GenerationRequest, inputs: dict[str, np.ndarray],
            on_step: StepFn) -> RunOutput:
        w, h = request.width, request.height
        masked = request.mode == "i2i" and request.mask is not None
        pipe = self.pipes["inpaint" if masked else request.mode]
        clock = StageClock([pipe.transformer])
        timings: dict[str, float] = {}
        notes: list[str] = []
        max_len = int(self.entry.call_kwargs.get("max_sequence_length", 512))
        cfg = request.guidance_scale > 1.0

        def encode():
            pe, pm = pipe.encode_prompt(request.prompt, device=self.device,
                                        max_sequence_length=max_len)
            if not cfg:
                return pe, pm, None, None
            ne, nm = pipe.encode_prompt(request.negative_prompt or "", device=self.device,
                                        max_sequence_length=max_len)
            return pe, pm, ne, nm

        pe, pm, ne, nm = self.encode_text(
            ("qwen", request.prompt, request.negative_prompt if cfg else None, max_len),
            encode, timings, notes)
        vsf = self.vae_scale_factor

        def unpack(latents: torch.Tensor) -> torch.Tensor:
            return pipe._unpack_latents(latents, h, w, vsf)

        kwargs = dict(prompt_embeds=pe, prompt_embeds_mask=pm, height=h, width=w,
                      num_inference_steps=request.steps,
                      true_cfg_scale=request.guidance_scale if cfg else 1.0,
                      generator=self.generator(request.seed), output_type="np",
                      max_sequence_length=max_len,
                      callback_on_step_end=make_callback(on_step, clock, unpack),
                      callback_on_step_end_tensor_inputs=["latents"])
        if cfg:
            kwargs.update(negative_prompt_embeds=ne, negative_prompt_embeds_mask=nm)
        init = mask = None
        if request.mode == "i2i":
            init = fit_image(inputs[request.init_image.content_id], w, h)
            kwargs.update(image=to_pil(init), strength=request.strength)
            if masked:
                from PIL import Image

                mask = fit_image(inputs[request.mask.content_id], w, h)
                mask = mask[..., 0] if mask.ndim == 3 else mask
                kwargs["mask_image"] = Image.fromarray(np.ascontiguousarray(mask), "L")
        notes = self.apply_profile(request) + notes
        images = np.asarray(pipe(**kwargs).images, dtype=np.float32)
        if mask is not None:
            keep = (mask < 128)[None, :, :, None]
            images = np.where(keep, init[None].astype(np.float32) / 255.0, images)
        return self.result(images, timings, clock, notes)

    def stage_inputs(self, request: GenerationRequest) -> dict:
        base, dev = self.base, self.weights_device()
        tr, vae = base.transformer, base.vae
        cfg = tr.config
        h, w = request.height // self.vae_scale_factor, request.width // self.vae_scale_factor
        tokens = (h // 2) * (w // 2)
        max_len = int(self.entry.call_kwargs.get("max_sequence_length", 512))
        hidden = torch.zeros(1, tokens, cfg.in_channels, device=dev, dtype=tr.dtype)
        text = torch.zeros(1, max_len, cfg.joint_attention_dim, device=dev, dtype=tr.dtype)
        mask = torch.ones(1, max_len, device=dev, dtype=torch.long)

        def denoise(x, t, m):
            return tr(hidden_states=x, encoder_hidden_states=t, encoder_hidden_states_mask=m,
                      timestep=torch.zeros(1, device=x.device), img_shapes=[[(1, h // 2,
                                                                              w // 2)]],
                      return_dict=False)

        ids = torch.zeros(1, max_len + 34, dtype=torch.long, device=dev)
        latents = torch.zeros(1, int(vae.config.z_dim), 1, h, w, device=dev, dtype=vae.dtype)
        return {
            "text_encode": ([base.text_encoder],
                            lambda i: base.text_encoder(input_ids=i, output_hidden_states=True),
                            (ids,)),
            "denoise": ([tr], denoise, (hidden, text, mask)),
            "decode": ([vae], lambda z: vae.decode(z, return_dict=False), (latents,)),
        }
