"""FLUX.2: text-to-image with ``Flux2Pipeline`` (Mistral-3 text encoder, guidance-distilled:
the request's guidance scale is the embedded guidance; no negative prompt).

Latents are 2x2-patchified, batch-normalised tokens while denoising; the step preview maps
them back exactly as the pipeline's decode does (unpack, undo the VAE's batch-norm
statistics, unpatchify) before the fitted latent-to-RGB projection.
"""

from __future__ import annotations

import numpy as np
import torch

from studio.core.request import GenerationRequest
from studio.engine.pipelines.base import (
    FamilyRunner,
    RunOutput,
    StageClock,
    StepFn,
    load_pipeline,
    make_callback,
)
from studio.engine.preview import LatentPreview


class Flux2Runner(FamilyRunner):
    """Runs FLUX.2 text-to-image requests on one loaded model."""

    classifier_free_guidance = False  # guidance-distilled

    def __init__(self, entry, device, dtype, load_device=None):
        super().__init__(entry, device, dtype, load_device)
        import diffusers

        base = load_pipeline(diffusers.Flux2Pipeline, entry, dtype).to(self.load_device)
        base.set_progress_bar_config(disable=True)
        self.base = base
        self.pipes = {"t2i": base}
        self.vae_scale_factor = base.vae_scale_factor
        self.preview = self._fit_preview()

    def _to_vae_latents(self, z: torch.Tensor) -> torch.Tensor:
        """Patchified, normalised latents (B, 4C, h/2, w/2) -> VAE latents (B, C, h, w)."""
        vae = self.base.vae
        mean = vae.bn.running_mean.view(1, -1, 1, 1).to(z.device, z.dtype)
        std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) +
                         vae.config.batch_norm_eps).to(z.device, z.dtype)
        return self.base._unpatchify_latents(z * std + mean)

    def _fit_preview(self) -> LatentPreview:
        vae = self.base.vae

        def decode(z: torch.Tensor) -> torch.Tensor:
            return vae.decode(self._to_vae_latents(z), return_dict=False)[0]

        channels = int(vae.config.latent_channels) * 4
        return LatentPreview.fit(decode, (channels, 4, 4), self.vae_scale_factor * 2,
                                 device=vae.device, dtype=vae.dtype)

    @torch.no_grad()
    def run(self, request: GenerationRequest, inputs: dict[str, np.ndarray],
            on_step: StepFn) -> RunOutput:
        pipe = self.base
        h, w = request.height, request.width
        clock = StageClock([pipe.transformer])
        timings: dict[str, float] = {}
        notes: list[str] = []
        max_len = int(self.entry.call_kwargs.get("max_sequence_length", 512))
        prompt_embeds, _ = self.encode_text(
            ("flux2", request.prompt, max_len),
            lambda: pipe.encode_prompt(request.prompt, device=self.device,
                                       max_sequence_length=max_len),
            timings, notes)
        side = self.vae_scale_factor * 2

        def view(latents: torch.Tensor) -> torch.Tensor:  # (B, seq, C) -> (B, C, h, w)
            b, _, c = latents.shape
            return latents.view(b, h // side, w // side, c).permute(0, 3, 1, 2)

        kwargs = dict(prompt_embeds=prompt_embeds, height=h, width=w,
                      num_inference_steps=request.steps, guidance_scale=request.guidance_scale,
                      generator=self.generator(request.seed), output_type="np",
                      max_sequence_length=max_len,
                      callback_on_step_end=make_callback(on_step, clock, view),
                      callback_on_step_end_tensor_inputs=["latents"])
        notes = self.apply_profile(request) + notes
        if request.negative_prompt:
            notes.append("FLUX.2 is guidance-distilled: the negative prompt has no effect")
        images = np.asarray(pipe(**kwargs).images, dtype=np.float32)
        return self.result(images, timings, clock, notes)

    def stage_inputs(self, request: GenerationRequest) -> dict:
        base, dev = self.base, self.weights_device()
        tr, vae = base.transformer, base.vae
        cfg = tr.config
        side = self.vae_scale_factor * 2
        h, w = request.height // side, request.width // side
        max_len = int(self.entry.call_kwargs.get("max_sequence_length", 512))
        hidden = torch.zeros(1, h * w, cfg.in_channels, device=dev, dtype=tr.dtype)
        text = torch.zeros(1, max_len, cfg.joint_attention_dim, device=dev, dtype=tr.dtype)
        img_ids = torch.zeros(1, h * w, 4, device=dev, dtype=torch.long)
        txt_ids = torch.zeros(1, max_len, 4, device=dev, dtype=torch.long)

        def denoise(x, t, ii, ti):
            return tr(hidden_states=x, encoder_hidden_states=t,
                      timestep=torch.zeros(1, device=x.device),
                      guidance=torch.zeros(1, device=x.device), img_ids=ii, txt_ids=ti,
                      return_dict=False)

        ids = torch.zeros(1, max_len, dtype=torch.long, device=dev)
        latents = torch.zeros(1, int(vae.config.latent_channels), h * 2, w * 2, device=dev,
                              dtype=vae.dtype)
        return {
            "text_encode": ([base.text_encoder],
                            lambda i: base.text_encoder(input_ids=i, output_hidden_states=True,
                                                        use_cache=False), (ids,)),
            "denoise": ([tr], denoise, (hidden, text, img_ids, txt_ids)),
            "decode": ([vae], lambda z: vae.decode(z, return_dict=False), (latents,)),
        }
