"""LTX-Video: text-to-video (``LTXPipeline``; an image is a one-frame video) and
image-to-video (``LTXImageToVideoPipeline``) on one set of weights.

LTX packs its latents as a token sequence (B, frames·h·w, C) during denoising; the step
preview unpacks and denormalises them with the pipeline's own helpers. Frame counts are
8k+1, sizes multiples of 32 (the VAE's compression). The request's fps is passed as LTX's
``frame_rate`` conditioning.
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


def _decode_timestep(vae, z: torch.Tensor) -> torch.Tensor | None:
    """The decode timestep a timestep-conditioned LTX VAE (0.9.1 and later:
    ``timestep_conditioning`` in its config) needs; None for the others. 0, as the pipeline's
    default ``decode_timestep``: the latents are taken as clean (z: (B, C, F, h, w))."""
    if not getattr(vae.config, "timestep_conditioning", False):
        return None
    return torch.zeros(z.shape[0], device=z.device, dtype=z.dtype)


class LTXRunner(FamilyRunner):
    """Runs LTX-Video requests on one loaded model (LTX-2 shares the loading and previews:
    :class:`~studio.engine.pipelines.ltx2.LTX2Runner` names its own pipeline classes)."""

    PIPELINES = {"t2v": "LTXPipeline", "i2v": "LTXImageToVideoPipeline"}

    def __init__(self, entry, device, dtype, load_device=None):
        super().__init__(entry, device, dtype, load_device)
        import diffusers

        base = load_pipeline(diffusers.DiffusionPipeline, entry, dtype).to(self.load_device)
        base.set_progress_bar_config(disable=True)
        self.pipes = {mode: derive_pipeline(getattr(diffusers, name), base)
                      for mode, name in self.PIPELINES.items()}
        for pipe in self.pipes.values():
            pipe.set_progress_bar_config(disable=True)
        self.base = base
        self.spatial = int(base.vae_spatial_compression_ratio)
        self.temporal = int(base.vae_temporal_compression_ratio)
        self.preview = self._fit_preview()

    def _fit_preview(self) -> LatentPreview:
        vae, pipe = self.base.vae, self.base

        def decode(z: torch.Tensor) -> torch.Tensor:
            z = pipe._denormalize_latents(z, vae.latents_mean, vae.latents_std,
                                          vae.config.scaling_factor)
            return vae.decode(z, _decode_timestep(vae, z), return_dict=False)[0]

        return LatentPreview.fit(decode, (int(vae.config.latent_channels), 1, 4, 4),
                                 self.spatial, device=vae.device, dtype=vae.dtype)

    def _latents_view(self, request: GenerationRequest, frames: int):
        f = (frames - 1) // self.temporal + 1
        h, w = request.height // self.spatial, request.width // self.spatial
        tr = self.base.transformer.config

        def view(latents: torch.Tensor) -> torch.Tensor:
            return self.base._unpack_latents(latents, f, h, w, tr.patch_size, tr.patch_size_t)
        return view

    @torch.no_grad()
    def run(self, request: GenerationRequest, inputs: dict[str, np.ndarray],
            on_step: StepFn) -> RunOutput:
        mode = request.mode
        pipe = self.pipes["i2v" if mode == "i2v" else "t2v"]
        frames = 1 if mode == "t2i" else request.num_frames
        clock = StageClock([pipe.transformer])
        timings: dict[str, float] = {}
        notes: list[str] = []
        max_len = int(self.entry.call_kwargs.get("max_sequence_length", 128))
        cfg = request.guidance_scale > 1.0
        pe, pm, ne, nm = self.encode_text(
            (request.prompt, request.negative_prompt if cfg else None, max_len),
            lambda: pipe.encode_prompt(request.prompt, request.negative_prompt or None,
                                       do_classifier_free_guidance=cfg,
                                       max_sequence_length=max_len, device=self.device),
            timings, notes)
        kwargs = dict(prompt_embeds=pe, prompt_attention_mask=pm, negative_prompt_embeds=ne,
                      negative_prompt_attention_mask=nm, height=request.height,
                      width=request.width, num_frames=frames, frame_rate=int(round(request.fps)),
                      num_inference_steps=request.steps, guidance_scale=request.guidance_scale,
                      generator=self.generator(request.seed), output_type="np",
                      max_sequence_length=max_len,
                      callback_on_step_end=make_callback(
                          on_step, clock, self._latents_view(request, frames)),
                      callback_on_step_end_tensor_inputs=["latents"])
        if mode == "i2v":
            kwargs["image"] = to_pil(fit_image(inputs[request.first_frame.content_id],
                                               request.width, request.height))
        notes = self.apply_profile(request) + notes
        frames_out = np.asarray(pipe(**kwargs).frames[0], dtype=np.float32)
        return self.result(frames_out, timings, clock, notes)

    def stage_inputs(self, request: GenerationRequest) -> dict:
        base, dev = self.base, self.weights_device()
        tr, vae = base.transformer, base.vae
        cfg = tr.config
        frames = 1 if request.mode == "t2i" else request.num_frames
        f = (frames - 1) // self.temporal + 1
        h, w = request.height // self.spatial, request.width // self.spatial
        max_len = int(self.entry.call_kwargs.get("max_sequence_length", 128))
        batch = 2 if request.guidance_scale > 1.0 else 1
        hidden = torch.zeros(batch, f * h * w, cfg.in_channels, device=dev, dtype=tr.dtype)
        text = torch.zeros(batch, max_len, cfg.caption_channels, device=dev, dtype=tr.dtype)
        mask = torch.ones(batch, max_len, device=dev, dtype=tr.dtype)

        def denoise(x, t, m):
            return tr(hidden_states=x, encoder_hidden_states=t,
                      timestep=torch.zeros(x.shape[0], device=x.device),
                      encoder_attention_mask=m, num_frames=f, height=h, width=w,
                      rope_interpolation_scale=(self.temporal / 25.0, self.spatial,
                                                self.spatial), return_dict=False)

        ids = torch.zeros(1, max_len, dtype=torch.long, device=dev)
        latents = torch.zeros(1, int(vae.config.latent_channels), f, h, w, device=dev,
                              dtype=vae.dtype)
        return {
            "text_encode": ([base.text_encoder], lambda i: base.text_encoder(i), (ids,)),
            "denoise": ([tr], denoise, (hidden, text, mask)),
            "decode": ([vae], lambda z: vae.decode(z, _decode_timestep(vae, z),
                                                   return_dict=False), (latents,)),
        }
