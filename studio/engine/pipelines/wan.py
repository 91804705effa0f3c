"""Wan 2.1 / 2.2 (and the embedded model, which is a Wan-architecture model).

Modes, all through diffusers' own pipelines sharing one set of weights (``from_pipe``):

* ``t2v`` and ``t2i``: ``WanPipeline`` (an image is a one-frame video);
* ``i2v``: ``WanImageToVideoPipeline`` (Wan 2.1 I2V, or Wan 2.2 TI2V-style models whose first
  frame is given as clean latents with a zero timestep: ``expand_timesteps``);
* ``i2i``: ``WanVideoToVideoPipeline`` on a one-frame video (SDEdit: noise to ``strength``,
  then denoise).
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


class WanRunner(FamilyRunner):
    """Runs Wan-family requests on one loaded model (see the module docstring)."""

    def __init__(self, entry, device, dtype):
        super().__init__(entry, device, dtype)
        from diffusers import (
            DiffusionPipeline,
            WanImageToVideoPipeline,
            WanPipeline,
            WanVideoToVideoPipeline,
        )

        base = load_pipeline(DiffusionPipeline, entry, dtype).to(device)
        base.set_progress_bar_config(disable=True)
        config = {k: base.config.get(k) for k in ("boundary_ratio", "expand_timesteps")
                  if k in base.config}
        wanted = {"t2v": WanPipeline, "i2v": WanImageToVideoPipeline,
                  "i2i": WanVideoToVideoPipeline}
        self.pipes = {mode: derive_pipeline(cls, base, **config)
                      for mode, cls in wanted.items() if mode in entry.capabilities.modes}
        self.base = base
        self.preview = self._fit_preview()

    def _fit_preview(self) -> LatentPreview:
        vae = self.base.vae
        mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
        inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
        spatial = int(vae.config.scale_factor_spatial)

        def decode(z: torch.Tensor) -> torch.Tensor:
            z = z / inv_std.to(z) + mean.to(z)
            return vae.decode(z, return_dict=False)[0]

        return LatentPreview.fit(decode, (int(vae.config.z_dim), 1, 4, 4), spatial,
                                 device=self.device, dtype=vae.dtype)

    @torch.no_grad()
    def run(self, request: GenerationRequest, inputs: dict[str, np.ndarray],
            on_step: StepFn) -> RunOutput:
        mode = request.mode
        key = "t2v" if mode in ("t2i", "t2v") else mode
        pipe = self.pipes[key]
        clock = StageClock([pipe.transformer, getattr(pipe, "transformer_2", None)])
        kwargs = dict(
            prompt=request.prompt, negative_prompt=request.negative_prompt,
            height=request.height, width=request.width,
            num_inference_steps=request.steps, guidance_scale=request.guidance_scale,
            generator=self.generator(request.seed), output_type="np",
            callback_on_step_end=make_callback(on_step, clock),
            callback_on_step_end_tensor_inputs=["latents"])
        if mode == "i2i":
            image = fit_image(inputs[request.init_image.content_id], request.width,
                              request.height)
            kwargs.update(video=[to_pil(image)], strength=request.strength)
        else:
            kwargs["num_frames"] = request.num_frames
        if mode == "i2v":
            image = fit_image(inputs[request.first_frame.content_id], request.width,
                              request.height)
            kwargs["image"] = to_pil(image)
        frames = pipe(**kwargs).frames[0]
        return RunOutput(np.asarray(frames, dtype=np.float32), clock.finish())
