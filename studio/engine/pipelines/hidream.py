"""HiDream-I1: text-to-image with ``HiDreamImagePipeline`` (CLIP-L, CLIP-G, T5 and Llama-3
text encoders; a mixture-of-experts MMDiT with double- and single-stream blocks).

The stock pipeline rescales every request to its native pixel count (``default_sample_size``
squared). The runner renders the size the request asks for instead: it sets the pipeline's
``default_sample_size`` so that the native area is the request's own (nudged up by one part
in a billion so the pipeline's rounding down to a multiple of 16 keeps the exact size).
"""

from __future__ import annotations

import math

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

EMBED_NAMES = ("prompt_embeds_t5", "negative_prompt_embeds_t5", "prompt_embeds_llama3",
               "negative_prompt_embeds_llama3", "pooled_prompt_embeds",
               "negative_pooled_prompt_embeds")


def native_sample_size(width: int, height: int, vae_scale_factor: int) -> float:
    """The ``default_sample_size`` under which HiDream's pipeline keeps ``width`` x
    ``height`` (multiples of 16) exactly."""
    return math.sqrt(width * height) / vae_scale_factor * (1 + 1e-9)


class HiDreamRunner(FamilyRunner):
    """Runs HiDream-I1 text-to-image requests on one loaded model."""

    def __init__(self, entry, device, dtype, load_device=None):
        super().__init__(entry, device, dtype, load_device)
        import diffusers

        base = load_pipeline(diffusers.HiDreamImagePipeline, entry, dtype).to(self.load_device)
        base.set_progress_bar_config(disable=True)
        self.base = base
        self.pipes = {"t2i": base}
        self.vae_scale_factor = base.vae_scale_factor
        self.preview = self.kl_latent_preview()

    @torch.no_grad()
    def run(self, request: GenerationRequest, inputs: dict[str, np.ndarray],
            on_step: StepFn) -> RunOutput:
        pipe = self.base
        clock = StageClock([pipe.transformer])
        timings: dict[str, float] = {}
        notes: list[str] = []
        max_len = int(self.entry.call_kwargs.get("max_sequence_length", 128))
        cfg = request.guidance_scale > 1.0
        values = self.encode_text(
            ("hidream", request.prompt, request.negative_prompt if cfg else None, max_len),
            lambda: pipe.encode_prompt(prompt=request.prompt, device=self.device,
                                       do_classifier_free_guidance=cfg,
                                       negative_prompt=request.negative_prompt or None,
                                       max_sequence_length=max_len),
            timings, notes)
        embeds = {n: v for n, v in zip(EMBED_NAMES, values, strict=True) if v is not None}
        pipe.default_sample_size = native_sample_size(request.width, request.height,
                                                      self.vae_scale_factor)
        kwargs = dict(**embeds, height=request.height, width=request.width,
                      num_inference_steps=request.steps, guidance_scale=request.guidance_scale,
                      generator=self.generator(request.seed), output_type="np",
                      max_sequence_length=max_len,
                      callback_on_step_end=make_callback(on_step, clock),
                      callback_on_step_end_tensor_inputs=["latents"])
        notes = self.apply_profile(request) + notes
        images = np.asarray(pipe(**kwargs).images, dtype=np.float32)
        return self.result(images, timings, clock, notes)

    def stage_inputs(self, request: GenerationRequest) -> dict:
        base, dev = self.base, self.weights_device()
        tr, vae = base.transformer, base.vae
        h, w = request.height // self.vae_scale_factor, request.width // self.vae_scale_factor
        latents = torch.zeros(1, int(vae.config.latent_channels), h, w, device=dev,
                              dtype=vae.dtype)
        ids = torch.zeros(1, base.tokenizer.model_max_length, dtype=torch.long, device=dev)

        def denoise(x):  # the text streams are small next to the image tokens
            return tr(hidden_states=x, timesteps=torch.zeros(1, device=x.device),
                      encoder_hidden_states_t5=torch.zeros(
                          1, 128, tr.config.caption_channels[0], device=x.device,
                          dtype=x.dtype),
                      encoder_hidden_states_llama3=torch.zeros(
                          len(tr.config.llama_layers), 1, 128, tr.config.caption_channels[1],
                          device=x.device, dtype=x.dtype),
                      pooled_embeds=torch.zeros(1, tr.config.text_emb_dim, device=x.device,
                                                dtype=x.dtype), return_dict=False)

        return {
            "text_encode": ([base.text_encoder, base.text_encoder_2, base.text_encoder_3,
                             base.text_encoder_4], lambda i: base.text_encoder(i), (ids,)),
            "denoise": ([tr], denoise, (torch.zeros(1, tr.config.in_channels, h, w, device=dev,
                                                    dtype=tr.dtype),)),
            "decode": ([vae], lambda z: vae.decode(z, return_dict=False), (latents,)),
        }
