"""LTX-2: text-to-video (``LTX2Pipeline``; an image is a one-frame video) and image-to-video
(``LTX2ImageToVideoPipeline``) on one set of weights.

LTX-2 is an audio-video model: one transformer denoises video and audio latents together (the
two streams attend to each other every block), and the pipeline decodes both. The studio
keeps the video frames; the audio (``LTX2PipelineOutput.audio``, a stereo waveform from the
vocoder) is generated, since it shapes the video, and then dropped: the engine's results are
frames only.

Like LTX-Video, the latents are a token sequence (B, frames·h·w, C) while denoising; the step
preview unpacks and denormalises them with the pipeline's own helpers. Frame counts are 8k+1,
sizes multiples of 32. The request's fps is LTX-2's ``frame_rate`` (the RoPE time scale and the
audio length). Everything else (the spatio-temporal and modality guidance, the audio guidance,
the guidance rescale) stays at the pipeline's defaults, or at the values of the folder's
``studio.json`` ``call_kwargs`` (e.g. ``"spatio_temporal_guidance_blocks": [29]`` for LTX-2.0).
"""

from __future__ import annotations

import inspect

import numpy as np
import torch

from studio.core.media import fit_image
from studio.core.request import GenerationRequest
from studio.engine.pipelines.base import (
    RunOutput,
    StageClock,
    StepFn,
    make_callback,
    to_pil,
)
from studio.engine.pipelines.ltx import LTXRunner

DEFAULT_MAX_SEQUENCE_LENGTH = 1024  # LTX2Pipeline's own default


class LTX2Runner(LTXRunner):
    """Runs LTX-2 requests (t2v, t2i as one frame, i2v) on one loaded model.

    Args:
        entry: the registry entry of a folder whose ``model_index.json`` names
            ``LTX2Pipeline`` or ``LTX2ImageToVideoPipeline``.
        device: where the modules run; dtype: the dtype they are loaded in.

    Raises:
        ModelError: the folder cannot be loaded.
    """

    PIPELINES = {"t2v": "LTX2Pipeline", "i2v": "LTX2ImageToVideoPipeline"}

    def _call_extras(self) -> dict:
        """The folder's ``studio.json`` ``call_kwargs`` other than the text length."""
        return {k: v for k, v in self.entry.call_kwargs.items() if k != "max_sequence_length"}

    def _uses_cfg(self, pipe, guidance_scale: float) -> bool:
        """Whether the pipeline will run the negative prompt: LTX-2 guides video and audio
        separately and runs the unconditional batch when either scale is above 1 (the audio
        scale defaults to 7, so usually even at video guidance 1)."""
        audio = self._call_extras().get("audio_guidance_scale")
        if audio is None:
            param = inspect.signature(type(pipe).__call__).parameters.get("audio_guidance_scale")
            audio = param.default if param is not None else None
        audio = audio or guidance_scale  # as the pipeline reads it (None or 0: the video scale)
        return guidance_scale > 1.0 or audio > 1.0

    @torch.no_grad()
    def run(self, request: GenerationRequest, inputs: dict[str, np.ndarray],
            on_step: StepFn) -> RunOutput:
        """Generates the request's video.

        Args:
            request: mode ``t2v``, ``t2i`` (one frame) or ``i2v`` (``first_frame`` set).
            inputs: content id -> uint8 (H, W, 3) pixels of the request's media.
            on_step: called after every denoising step with the unpacked latents
                (B, C, f, h, w); may raise :class:`JobCancelled`.

        Returns:
            float32 frames (F, H, W, 3) in [0, 1], F = 1 for t2i; the audio is dropped.
        """
        mode = request.mode
        pipe = self.pipes["i2v" if mode == "i2v" else "t2v"]
        frames = 1 if mode == "t2i" else request.num_frames
        clock = StageClock([pipe.transformer])
        timings: dict[str, float] = {}
        notes: list[str] = []
        max_len = int(self.entry.call_kwargs.get("max_sequence_length",
                                                 DEFAULT_MAX_SEQUENCE_LENGTH))
        cfg = self._uses_cfg(pipe, request.guidance_scale)
        pe, pm, ne, nm = self.encode_text(
            (request.prompt, request.negative_prompt if cfg else None, max_len),
            lambda: pipe.encode_prompt(request.prompt, request.negative_prompt or None,
                                       do_classifier_free_guidance=cfg,
                                       max_sequence_length=max_len, device=self.device),
            timings, notes)
        kwargs = {**self._call_extras(),
                  "prompt_embeds": pe, "prompt_attention_mask": pm,
                  "negative_prompt_embeds": ne, "negative_prompt_attention_mask": nm,
                  "height": request.height, "width": request.width, "num_frames": frames,
                  "frame_rate": float(request.fps), "num_inference_steps": request.steps,
                  "guidance_scale": request.guidance_scale,
                  "generator": self.generator(request.seed), "output_type": "np",
                  "max_sequence_length": max_len,
                  "callback_on_step_end": make_callback(
                      on_step, clock, self._latents_view(request, frames)),
                  "callback_on_step_end_tensor_inputs": ["latents"]}
        if mode == "i2v":
            kwargs["image"] = to_pil(fit_image(inputs[request.first_frame.content_id],
                                               request.width, request.height))
        notes = self.apply_profile(request) + notes
        frames_out = np.asarray(pipe(**kwargs).frames[0], dtype=np.float32)
        return self.result(frames_out, timings, clock, notes)

    def stage_inputs(self, request: GenerationRequest) -> dict:
        """Per stage, the modules and one call with the request's shapes: ``text_encode``
        (Gemma's stacked hidden states through the text connectors), ``denoise`` (one
        audio-video transformer call on the CFG batch) and ``decode`` (the video VAE; the
        audio VAE and vocoder are small and counted with it)."""
        base, dev = self.base, self.weights_device()
        tr, vae, conn = base.transformer, base.vae, base.connectors
        cfg = tr.config
        frames = 1 if request.mode == "t2i" else request.num_frames
        f = (frames - 1) // self.temporal + 1
        h, w = request.height // self.spatial, request.width // self.spatial
        max_len = int(self.entry.call_kwargs.get("max_sequence_length",
                                                 DEFAULT_MAX_SEQUENCE_LENGTH))
        batch = 2 if self._uses_cfg(self.pipes["t2v"], request.guidance_scale) else 1
        audio_f = round(frames / request.fps * base.audio_sampling_rate / base.audio_hop_length
                        / base.audio_vae_temporal_compression_ratio)
        if conn.config.per_modality_projections:
            text_dims = (conn.config.video_hidden_dim, conn.config.audio_hidden_dim)
        else:
            text_dims = (conn.config.caption_channels,) * 2
        hidden = torch.zeros(batch, f * h * w, cfg.in_channels, device=dev, dtype=tr.dtype)
        audio = torch.zeros(batch, audio_f, cfg.audio_in_channels, device=dev, dtype=tr.dtype)
        text = torch.zeros(batch, max_len, text_dims[0], device=dev, dtype=tr.dtype)
        audio_text = torch.zeros(batch, max_len, text_dims[1], device=dev, dtype=tr.dtype)
        mask = torch.ones(batch, max_len, device=dev, dtype=torch.long)
        fps = float(request.fps)

        def encode(ids, attention):
            out = base.text_encoder(input_ids=ids, attention_mask=attention,
                                    output_hidden_states=True)
            states = torch.stack(out.hidden_states, dim=-1).flatten(2, 3)
            return conn(states, attention, padding_side="left")

        def denoise(x, a, t, ta, m):
            step = torch.zeros(x.shape[0], device=x.device)
            return tr(hidden_states=x, audio_hidden_states=a, encoder_hidden_states=t,
                      audio_encoder_hidden_states=ta, timestep=step, sigma=step,
                      encoder_attention_mask=m, audio_encoder_attention_mask=m, num_frames=f,
                      height=h, width=w, fps=fps, audio_num_frames=audio_f, return_dict=False)

        audio_vae, vocoder = base.audio_vae, base.vocoder
        mel_bins = int(audio_vae.config.mel_bins) // base.audio_vae_mel_compression_ratio

        def decode(z, za):
            video = vae.decode(z, return_dict=False)[0]
            return video, vocoder(audio_vae.decode(za, return_dict=False)[0])

        ids = torch.zeros(1, max_len, dtype=torch.long, device=dev)
        latents = torch.zeros(1, int(vae.config.latent_channels), f, h, w, device=dev,
                              dtype=vae.dtype)
        audio_latents = torch.zeros(1, int(audio_vae.config.latent_channels), audio_f, mel_bins,
                                    device=dev, dtype=audio_vae.dtype)
        return {
            "text_encode": ([base.text_encoder, conn], encode, (ids, mask[:1])),
            "denoise": ([tr], denoise, (hidden, audio, text, audio_text, mask)),
            "decode": ([vae, audio_vae, vocoder], decode, (latents, audio_latents)),
        }
