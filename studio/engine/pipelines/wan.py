"""Wan 2.1 / 2.2 (and the embedded model, which is a Wan-architecture model).

Modes, all through diffusers' own pipelines sharing one set of weights (``from_pipe``):

* ``t2v`` and ``t2i``: ``WanPipeline`` (an image is a one-frame video);
* ``i2v``: ``WanImageToVideoPipeline`` (Wan 2.1 I2V, or Wan 2.2 TI2V-style models whose first
  frame is given as clean latents with a zero timestep: ``expand_timesteps``);
* ``i2i``: ``WanVideoToVideoPipeline`` on a one-frame video (SDEdit: noise to ``strength``,
  then denoise). With a mask (white = repaint), each step's latents outside the mask are
  replaced by the init image's latents noised to the current sigma (the latent blending of
  "Blended Latent Diffusion", Avrahami et al. 2023), and the final pixels outside the mask are
  the init image's.
* ``r2v`` (models that declare ``"reference_frames": "append"`` in ``studio.json``, such as the
  embedded model): ``WanPipeline`` with the reference image's clean latents appended as one
  extra frame after the video, at timestep 0, by a forward hook on the denoiser; the extra
  frame is dropped from the denoiser's output, so the scheduler never sees it. Models that
  also declare ``"reference_tokens": "<subfolder>"`` (the embedded model does) give the reference
  a second way in, as Wan 2.1 I2V gives its first frame both as latents and as CLIP image
  tokens in cross-attention: a small image encoder (a ``transformers`` ``CLIPVisionModel``
  over the reference's latents) turns it into tokens appended to the prompt embeddings
  (:func:`reference_tokens`); the unconditional branch gets zeros in their place, so
  classifier-free guidance pushes toward the reference as it does toward the prompt.
  Models that further declare ``"reference_words": {"map": ..., "placeholder": ...}`` put the
  reference's object into the prompt itself (:class:`ReferenceWords`): the first placeholder
  word of the prompt (``"object"`` for the embedded model: "a small object slides to the
  left") is replaced by pseudo-words whose input embeddings a linear map computes from the
  reference tokens, and the text encoder reads them in the sentence, as ELITE's global
  mapping does (Wei et al., ICCV 2023).
"""

from __future__ import annotations

import contextlib
import re
import unicodedata

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

    def __init__(self, entry, device, dtype, load_device=None):
        super().__init__(entry, device, dtype, load_device)
        from diffusers import (
            DiffusionPipeline,
            WanImageToVideoPipeline,
            WanPipeline,
            WanVideoToVideoPipeline,
        )

        base = load_pipeline(DiffusionPipeline, entry, dtype).to(self.load_device)
        base.set_progress_bar_config(disable=True)
        config = {k: base.config.get(k) for k in ("boundary_ratio", "expand_timesteps")
                  if k in base.config}
        wanted = {"t2v": WanPipeline, "i2v": WanImageToVideoPipeline,
                  "i2i": WanVideoToVideoPipeline}
        self.pipes = {mode: derive_pipeline(cls, base, **config)
                      for mode, cls in wanted.items() if mode in entry.capabilities.modes}
        self.base = base
        fit_token_timesteps(base.transformer)  # the pipes share it
        self.reference_encoder = None
        if entry.reference_encoder and "r2v" in entry.capabilities.modes:
            self.reference_encoder = load_reference_encoder(
                entry.path / entry.reference_encoder, dtype, entry.model_id).to(self.load_device)
        self.reference_words = None
        if self.reference_encoder is not None and entry.reference_words:
            self.reference_words = ReferenceWords.load(
                entry.path / entry.reference_words["map"], entry.reference_words["placeholder"],
                base.tokenizer, base.text_encoder,
                int(self.reference_encoder.config.hidden_size), entry.model_id)
        self.preview = self._fit_preview()

    def extra_modules(self) -> list[torch.nn.Module]:
        """The reference-image encoder, outside the diffusers pipeline."""
        encoder = getattr(self, "reference_encoder", None)  # WanVaceRunner has none
        return [encoder] if encoder is not None else []

    def _fit_preview(self) -> LatentPreview:
        vae = self.base.vae
        mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
        inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
        spatial = int(vae.config.scale_factor_spatial)

        def decode(z: torch.Tensor) -> torch.Tensor:
            z = z / inv_std.to(z) + mean.to(z)
            return vae.decode(z, return_dict=False)[0]

        return LatentPreview.fit(decode, (int(vae.config.z_dim), 1, 4, 4), spatial,
                                 device=vae.device, dtype=vae.dtype)

    def stage_inputs(self, request: GenerationRequest) -> dict:
        base, dev = self.base, self.weights_device()
        vae, tr = base.vae, base.transformer
        sf, tf = int(vae.config.scale_factor_spatial), int(vae.config.scale_factor_temporal)
        frames = 1 if request.mode in ("t2i", "i2i") else request.num_frames
        f = (frames - 1) // tf + 1
        h, w = request.height // sf, request.width // sf
        max_len = int(self.entry.call_kwargs.get("max_sequence_length", 512))
        cfg = tr.config
        extra = 1 if request.mode == "r2v" else 0
        hidden = torch.zeros(1, cfg.in_channels, f + extra, h, w, device=dev, dtype=tr.dtype)
        patch = cfg.patch_size
        seq = (f + extra) * (h // patch[1]) * (w // patch[2])
        timestep = torch.zeros((1, seq) if base.config.get("expand_timesteps") else (1,),
                               device=dev)
        text = torch.zeros(1, max_len, cfg.text_dim, device=dev, dtype=tr.dtype)
        image_kw = {}
        encoders = [base.text_encoder]
        if cfg.image_dim and getattr(base, "image_encoder", None) is not None:
            enc = base.image_encoder.config
            tokens = (enc.image_size // enc.patch_size) ** 2 + 1
            image_kw["encoder_hidden_states_image"] = torch.zeros(
                1, tokens, cfg.image_dim, device=dev, dtype=tr.dtype)
            encoders.append(base.image_encoder)
        denoisers = [m for m in (tr, getattr(base, "transformer_2", None)) if m is not None]

        def denoise(hs, ts, eh, *rest):
            return tr(hs, ts, eh, return_dict=False,
                      **({"encoder_hidden_states_image": rest[0]} if rest else {}))

        ids = torch.zeros(1, max_len, dtype=torch.long, device=dev)
        latents = torch.zeros(1, int(vae.config.z_dim), f, h, w, device=dev, dtype=vae.dtype)
        return {
            "text_encode": (encoders, lambda i: base.text_encoder(i, attention_mask=i),
                            (ids,)),
            "denoise": (denoisers, denoise, (hidden, timestep, text,
                                             *image_kw.values())),
            "decode": ([vae], lambda z: vae.decode(z, return_dict=False), (latents,)),
        }

    @torch.no_grad()
    def encode_image(self, pixels: np.ndarray, *, cache: bool = True) -> torch.Tensor:
        """uint8 (H, W, 3) -> normalised latents (1, C, 1, h, w), as Wan's pipelines normalise
        them (posterior mode; ``(z - latents_mean) / latents_std``). Cached by the pixels'
        content id: a reference or init image used again is not re-encoded; ``cache=False``
        (e.g. a fit over a thousand images) neither reads nor fills the cache."""
        from studio.core.media import pixels_content_id

        if not cache:
            return self._encode_image(pixels)
        key = ("vae", pixels_content_id(pixels), pixels.shape)
        return self.embeddings.get(key, lambda: (self._encode_image(pixels),))[0][0]

    def _encode_image(self, pixels: np.ndarray) -> torch.Tensor:
        vae = self.base.vae
        x = torch.from_numpy(np.ascontiguousarray(pixels)).to(self.device, vae.dtype)
        x = x.permute(2, 0, 1)[None, :, None] / 127.5 - 1.0
        z = vae.encode(x).latent_dist.mode()
        mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1).to(z)
        std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1).to(z)
        return (z - mean) / std

    @torch.no_grad()
    def run(self, request: GenerationRequest, inputs: dict[str, np.ndarray],
            on_step: StepFn) -> RunOutput:
        mode = request.mode
        key = "t2v" if mode in ("t2i", "t2v", "r2v") else mode
        pipe = self.pipes[key]
        clock = StageClock([pipe.transformer, getattr(pipe, "transformer_2", None)])
        mask = blend = None
        if mode == "i2i" and request.mask is not None:
            mask = fit_image(inputs[request.mask.content_id], request.width, request.height)
            blend = LatentBlend(self, fit_image(inputs[request.init_image.content_id],
                                                request.width, request.height), mask,
                                request.seed)
        timings: dict[str, float] = {}
        notes: list[str] = []
        max_len = int(self.entry.call_kwargs.get("max_sequence_length", 512))
        cfg = request.guidance_scale > 1.0
        prompt_embeds, negative_embeds = self.encode_text(
            (request.prompt, request.negative_prompt if cfg else None, max_len),
            lambda: pipe.encode_prompt(request.prompt, request.negative_prompt or None,
                                       do_classifier_free_guidance=cfg,
                                       max_sequence_length=max_len, device=self.device),
            timings, notes)
        kwargs = dict(**self.entry.call_kwargs,
            prompt_embeds=prompt_embeds, negative_prompt_embeds=negative_embeds,
            height=request.height, width=request.width,
            num_inference_steps=request.steps, guidance_scale=request.guidance_scale,
            generator=self.generator(request.seed), output_type="np",
            callback_on_step_end=make_callback(on_step, clock, after=blend),
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
        notes = self.apply_profile(request) + notes
        hooks = []
        if mode == "r2v":
            ref_pixels = inputs[request.references[0].content_id]
            ref = fit_image(ref_pixels, request.width, request.height)
            hooks = append_reference_frame(pipe.transformer, self.encode_image(ref))
            if self.reference_encoder is not None:
                side = self.reference_encoder.config.image_size * int(
                    self.base.vae.config.get("scale_factor_spatial", 8))
                tokens = reference_tokens(self.reference_encoder,
                                          self.encode_image(fit_image(ref_pixels, side, side)))
                tokens = tokens.to(kwargs["prompt_embeds"])
                if self.reference_words is not None:
                    kwargs["prompt_embeds"] = self._prompt_with_reference_words(
                        pipe, request, tokens, max_len, kwargs["prompt_embeds"], notes)
                kwargs["prompt_embeds"] = torch.cat([kwargs["prompt_embeds"], tokens], dim=1)
                if kwargs["negative_prompt_embeds"] is not None:
                    kwargs["negative_prompt_embeds"] = torch.cat(
                        [kwargs["negative_prompt_embeds"], torch.zeros_like(tokens)], dim=1)
        try:
            kwargs["output_type"] = "latent"  # kept: a failed decode is retried tiled
            latents = pipe(**kwargs).frames
            frames = self.decode_with_retry(lambda: self.decode(pipe, latents), notes)
        finally:
            for h in hooks:
                h.remove()
        if mask is not None:
            keep = (mask < 128)[None, :, :, None]
            init = fit_image(inputs[request.init_image.content_id], request.width,
                             request.height).astype(np.float32) / 255.0
            frames = np.where(keep, init[None], frames)
        return self.result(frames, timings, clock, notes)


    def _prompt_with_reference_words(self, pipe, request: GenerationRequest,
                                     tokens: torch.Tensor, max_len: int,
                                     prompt_embeds: torch.Tensor, notes: list[str]):
        """The prompt's embeddings (1, max_len, D) with the reference's pseudo-words in place
        of its first placeholder word; ``prompt_embeds`` unchanged (and a note) when the
        prompt has none."""
        words = self.reference_words
        text = words.prompt(request.prompt)
        if text is None:
            notes.append(f"reference words: the prompt does not say {words.placeholder!r}, so "
                         f"the reference's object is not put into its words")
            return prompt_embeds
        embeds = words.embeds(tokens)[0]
        with words.injected(pipe.text_encoder, embeds) as placed:
            cond, _ = pipe.encode_prompt(text, None, do_classifier_free_guidance=False,
                                         max_sequence_length=max_len, device=self.device)
        if not placed:
            notes.append(f"reference words: the tokenizer did not read {words.placeholder!r} "
                         f"with room for the {words.words} pseudo-words in the prompt's first "
                         f"{max_len} tokens (cut off there, or joined to other characters), "
                         f"so the reference's object is not put into its words")
            return prompt_embeds
        tokenizer = pipe.tokenizer
        before = len(tokenizer(request.prompt).input_ids)
        if len(tokenizer(text).input_ids) > max_len >= before:
            notes.append(f"reference words: the {words.words} pseudo-words push the prompt's "
                         f"end past its {max_len}-token limit, and the last of it is cut off")
        return cond.to(prompt_embeds)

    @torch.no_grad()
    def decode(self, pipe, latents: torch.Tensor) -> np.ndarray:
        """Normalised latents (1, C, f, h, w) -> float32 frames (F, H, W, 3) in [0, 1], as
        the Wan pipelines' own tail does it (same ops, same order: the same pixels)."""
        vae = self.base.vae
        latents = latents.to(vae.dtype)
        z = vae.config.z_dim
        mean = torch.tensor(vae.config.latents_mean).view(1, z, 1, 1, 1).to(latents.device,
                                                                          latents.dtype)
        inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, z, 1, 1, 1).to(
            latents.device, latents.dtype)
        video = vae.decode(latents / inv_std + mean, return_dict=False)[0]
        video = pipe.video_processor.postprocess_video(video, output_type="np")
        return np.asarray(video[0], dtype=np.float32)


class LatentBlend:
    """Step callback part of masked image-to-image: outside the mask, the latents are the init
    image's latents noised to the sigma the scheduler is at (``(1 - s) x0 + s e``, a fixed
    noise ``e`` drawn from the job's seed)."""

    def __init__(self, runner: WanRunner, image: np.ndarray, mask: np.ndarray, seed: int):
        self.x0 = runner.encode_image(image)
        h, w = self.x0.shape[-2:]
        m = torch.from_numpy((mask >= 128).astype(np.float32))[None, None]
        # a latent cell is repainted if any of its pixels is: max-pool to latent resolution
        m = torch.nn.functional.adaptive_max_pool2d(m, (h, w))
        self.repaint = m[:, :, None].to(self.x0)
        gen = torch.Generator().manual_seed(int(seed) + 1)
        self.noise = torch.randn(self.x0.shape, generator=gen).to(self.x0)

    def __call__(self, pipe, latents: torch.Tensor) -> torch.Tensor:
        sched = pipe.scheduler
        sigma = sched.sigmas[min(sched.step_index, len(sched.sigmas) - 1)].to(latents)
        known = (1 - sigma) * self.x0 + sigma * self.noise
        return self.repaint * latents + (1 - self.repaint) * known.to(latents.dtype)


def load_reference_encoder(folder, dtype: torch.dtype, model_id: str) -> torch.nn.Module:
    """The ``transformers.CLIPVisionModel`` in ``folder`` (a model's ``reference_tokens``
    subfolder; safetensors only, never the network), in eval mode.

    Raises:
        ModelError: it could not be loaded (names ``model_id``, the folder and the reason).
    """
    from transformers import CLIPVisionModel

    from studio.engine.models.folders import ModelError

    try:
        encoder = CLIPVisionModel.from_pretrained(folder, dtype=dtype, local_files_only=True,
                                                  use_safetensors=True)
    except (OSError, ValueError, KeyError, RuntimeError, TypeError) as exc:
        raise ModelError(f"model {model_id}: cannot load the reference encoder "
                         f"{folder} ({type(exc).__name__}: {str(exc)[:300]})") from exc
    return encoder.eval().requires_grad_(False)


def reference_tokens(encoder: torch.nn.Module, reference: torch.Tensor) -> torch.Tensor:
    """Tokens of a reference image for cross-attention, appended after the prompt's.

    Args:
        encoder: a ``transformers.CLIPVisionModel`` whose ``num_channels`` is the VAE's
            latent channels and ``image_size`` the reference latents' side.
        reference: normalised latents (B, C, 1, h, w) of the reference image (as
            :meth:`WanRunner.encode_image` gives them), h == w == ``image_size``.

    Returns:
        (B, 1 + (h / patch) * (w / patch), hidden_size) float tokens: the encoder's last
        hidden state (its class token first).

    Raises:
        ValueError: ``reference`` is not (B, C, 1, h, w) with the encoder's channels and size.
    """
    cfg = encoder.config
    if reference.ndim != 5 or reference.shape[1] != cfg.num_channels or \
            reference.shape[2] != 1 or tuple(reference.shape[-2:]) != (cfg.image_size,) * 2:
        raise ValueError(f"reference: expected (B, {cfg.num_channels}, 1, {cfg.image_size}, "
                         f"{cfg.image_size}) latents, got {tuple(reference.shape)}")
    param = next(encoder.parameters())
    return encoder(pixel_values=reference[:, :, 0].to(param)).last_hidden_state


class ReferenceWords:
    """Pseudo-words for a reference image's object, read by the text encoder in the prompt.

    A linear map turns the first ``words`` reference tokens (:func:`reference_tokens`) into
    ``words`` input word embeddings (the space of the text encoder's embedding table). In a
    prompt, the first ``placeholder`` word (:meth:`prompt`) is replaced by ``words`` copies of it, and a
    forward hook on the text encoder's input embedding puts the pseudo-words in their place,
    so the encoder reads "a small <w0> <w1> slides to the left" in context, as it reads the
    object's own words. The technique is ELITE's global mapping (Wei et al., ICCV 2023: image
    features mapped into the word-embedding space as a pseudo-word S*), after textual
    inversion (Gal et al., ICLR 2023); the map here is fitted in closed form
    (:func:`studio.tiny.reference_words.fit_word_map`).

    Attributes:
        weight: (words * D_word, words * D_token) float32.
        bias: (words * D_word,) float32.
        placeholder: the prompt word the pseudo-words replace (lower case).
        placeholder_id: its single token id.
        words: pseudo-words per reference.

    ``tokenizer`` (optional): the text encoder's tokenizer, whose normalizer and
    pre-tokenizer decide what a placeholder word is in :meth:`prompt`.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, placeholder: str,
                 placeholder_id: int, words: int, tokenizer=None):
        if weight.ndim != 2 or bias.shape != (weight.shape[0],) or words < 1 or \
                weight.shape[0] % words or weight.shape[1] % words:
            raise ValueError(f"reference word map: weight {tuple(weight.shape)} and bias "
                             f"{tuple(bias.shape)} do not make {words} words")
        self.weight, self.bias = weight.float(), bias.float()
        self.placeholder, self.placeholder_id, self.words = placeholder, placeholder_id, words
        self._pattern = re.compile(rf"(?<!\w){re.escape(placeholder)}(?!\w)", re.IGNORECASE)
        self._split, self._placeholder_word = None, placeholder
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None and backend.pre_tokenizer is not None:
            from tokenizers import PreTokenizedString

            def split(text: str) -> list[tuple[str, tuple[int, int]]]:
                """(normalised word, (start, end) character span in ``text``) per word."""
                words = PreTokenizedString(text)
                if backend.normalizer is not None:
                    words.normalize(backend.normalizer.normalize)
                backend.pre_tokenizer.pre_tokenize(words)
                return [(w, span) for w, span, _ in
                        words.get_splits(offset_referential="original", offset_type="char")]

            self._split = split
            self._placeholder_word = "".join(w for w, _ in split(placeholder))

    @classmethod
    def load(cls, path, placeholder: str, tokenizer, text_encoder, token_dim: int,
             model_id: str) -> ReferenceWords:
        """Reads the map from a safetensors file (``weight``, ``bias``; metadata ``words``
        and, if present, ``placeholder``, which must agree with ``placeholder``).

        Args:
            token_dim: the reference encoder's token width (``hidden_size``).
        Raises:
            ModelError: the file is missing, damaged or malformed (shapes that do not map
                ``words`` tokens of ``token_dim`` to ``words`` embeddings of the text
                encoder's width, values that are not finite), or ``placeholder`` is not one
                token the tokenizer knows.
        """
        from safetensors import SafetensorError, safe_open

        from studio.engine.models.folders import ModelError

        try:
            ids = tokenizer(placeholder, add_special_tokens=False).input_ids
            unknown = getattr(tokenizer, "unk_token_id", None)
            if len(ids) != 1 or ids[0] == unknown:
                raise ValueError(f"placeholder {placeholder!r} is not one token the tokenizer "
                                 f"knows ({len(ids)} tokens: {ids})")
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
                if "words" not in meta:
                    raise ValueError("no 'words' in its metadata")
                words = int(meta["words"])
                if meta.get("placeholder", placeholder) != placeholder:
                    raise ValueError(f"it was fitted for the placeholder "
                                     f"{meta['placeholder']!r}, not {placeholder!r}")
                weight, bias = f.get_tensor("weight"), f.get_tensor("bias")
            dim = text_encoder.get_input_embeddings().embedding_dim
            if words < 1 or weight.ndim != 2 or \
                    tuple(weight.shape) != (words * dim, words * token_dim):
                raise ValueError(f"weight {tuple(weight.shape)} does not map {words} tokens of "
                                 f"{token_dim} to {words} words of {dim}: not "
                                 f"({words} x {dim}, {words} x {token_dim})")
            if not (torch.isfinite(weight).all() and torch.isfinite(bias).all()):
                raise ValueError("it holds values that are not finite")
            return cls(weight, bias, placeholder.lower(), int(ids[0]), words, tokenizer)
        except (OSError, ValueError, KeyError, RuntimeError, SafetensorError) as exc:
            raise ModelError(f"model {model_id}: cannot use the reference word map {path} "
                             f"({type(exc).__name__}: {str(exc)[:300]})") from exc

    def embeds(self, tokens: torch.Tensor) -> torch.Tensor:
        """Reference tokens (B, N, D_token), N >= ``words`` -> pseudo-word embeddings
        (B, words, D_word) in the tokens' dtype."""
        b = tokens.shape[0]
        x = tokens[:, :self.words].reshape(b, -1).float()
        out = x @ self.weight.to(x.device).T + self.bias.to(x.device)
        return out.view(b, self.words, -1).to(tokens.dtype)

    def prompt(self, prompt: str) -> str | None:
        """``prompt`` with its first placeholder word repeated ``words`` times (the slots
        the pseudo-words fill); None when the prompt has no placeholder word.

        A placeholder word is one the tokenizer reads as the placeholder: the prompt is
        split by the tokenizer's own normalizer and pre-tokenizer when it has them (a fast
        Hugging Face tokenizer; the rest of the prompt is kept as written), so the fullwidth
        "ｏｂｊｅｃｔ" (NFKC) and the "object" of "object_1" count, while "objects", "object2"
        and "object\u0301" do not. Without them: a case-insensitive whole word of the NFKC
        text, not joined to letters, digits, ``_`` or combining marks."""
        slots = " ".join([self.placeholder] * self.words)
        if self._split is not None:
            for word, (start, end) in self._split(prompt):
                if word == self._placeholder_word:
                    return prompt[:start] + slots + prompt[end:]
            return None
        text = unicodedata.normalize("NFKC", prompt)
        for hit in self._pattern.finditer(text):
            before = text[hit.start() - 1] if hit.start() else " "
            after = text[hit.end()] if hit.end() < len(text) else " "
            if unicodedata.category(before)[0] == "M" or unicodedata.category(after)[0] == "M":
                continue  # a combining mark joins it to a longer word
            return text[:hit.start()] + slots + text[hit.end():]
        return None

    @contextlib.contextmanager
    def injected(self, text_encoder: torch.nn.Module, embeds: torch.Tensor):
        """While open, the text encoder's input embedding writes ``embeds`` (words, D_word)
        over the first run of ``words`` placeholder tokens of each prompt it encodes.

        Yields:
            A list that gets one (row, first position) per prompt row written (empty when
            the placeholders were cut off by the tokenizer's length limit)."""
        k, pid = self.words, self.placeholder_id
        placed: list[tuple[int, int]] = []

        def hook(_module, args, output):
            ids = args[0]
            out = output.clone()
            for row in range(ids.shape[0]):
                hits = (ids[row] == pid).nonzero().flatten().tolist()
                for start in hits:
                    if ids[row, start:start + k].eq(pid).all() and start + k <= ids.shape[1]:
                        out[row, start:start + k] = embeds.to(out)
                        placed.append((row, start))
                        break
            return out

        # the encoder may call a copy of the table that shares its weight (UMT5's
        # encoder.embed_tokens beside the model's shared), so every such module is hooked
        table = text_encoder.get_input_embeddings().weight
        handles = [m.register_forward_hook(hook) for m in text_encoder.modules()
                   if isinstance(m, torch.nn.Embedding) and m.weight is table]
        try:
            yield placed
        finally:
            for handle in handles:
                handle.remove()


def fit_token_timesteps(transformer: torch.nn.Module):
    """Makes the per-token timesteps of diffusers' Wan pipelines fit a denoiser whose spatial
    patch is not 2.

    With ``expand_timesteps`` (Wan 2.2 TI2V's image-to-video: the clean first frame at
    timestep 0) ``WanPipeline`` and ``WanImageToVideoPipeline`` build one timestep per token
    by taking every second latent cell of the first-frame mask (``mask[:, ::2, ::2]``), which
    is right for patch (1, 2, 2) only. For a patch (1, p, p) with p a multiple of 2 (the
    embedded model on its 2x VAE: p = 4), a forward pre-hook keeps every (p/2)-th of those
    entries along each side, so the timesteps (B, f * h/p * w/p) match the tokens. Timesteps
    already per token of this patch (or one per sample) pass unchanged. Registering twice is a
    no-op.

    Returns:
        The hook handle, or None when the patch is (1, 2, 2) and nothing needs fitting.
    Raises:
        ValueError: a spatial patch that is not a multiple of 2.
    """
    _, patch_h, patch_w = transformer.config.patch_size
    if (patch_h, patch_w) == (2, 2):
        return None
    if patch_h % 2 or patch_w % 2:
        raise ValueError(f"patch_size={tuple(transformer.config.patch_size)}: the spatial "
                         "patch must be a multiple of 2 to fit per-token timesteps")
    handle = getattr(transformer, "_studio_token_timesteps", None)
    if handle is not None:
        return handle

    def before(_module, args, kwargs):
        t, x = kwargs.get("timestep"), kwargs.get("hidden_states")
        if t is None or x is None or t.ndim != 2:
            return None
        b, _, f, h, w = x.shape
        if t.shape[1] != f * (h // 2) * (w // 2):
            return None
        t = t.reshape(b, f, h // 2, w // 2)[:, :, ::patch_h // 2, ::patch_w // 2]
        kwargs["timestep"] = t.reshape(b, -1)
        return args, kwargs

    handle = transformer.register_forward_pre_hook(before, with_kwargs=True)
    transformer._studio_token_timesteps = handle
    return handle


def append_reference_frame(transformer: torch.nn.Module, reference: torch.Tensor) -> list:
    """Hooks that make ``transformer`` see ``reference`` (clean latents (1, C, 1, h, w)) as an
    extra last frame at timestep 0, and drop that frame from its output.

    Returns:
        The hook handles (remove them after the run).
    """
    patch_t, patch_h, patch_w = transformer.config.patch_size

    def before(_module, args, kwargs):
        x = kwargs["hidden_states"]
        b, _, f, h, w = x.shape
        ref = reference.to(x).expand(b, -1, -1, -1, -1)
        kwargs["hidden_states"] = torch.cat([x, ref], dim=2)
        t = kwargs["timestep"]
        per_frame = (h // patch_h) * (w // patch_w)
        if t.ndim == 1:
            t = t[:, None].expand(b, (f // patch_t) * per_frame)
        kwargs["timestep"] = torch.cat([t, t.new_zeros(b, per_frame)], dim=1)
        return args, kwargs

    def after(_module, _args, kwargs, output):
        f = kwargs["hidden_states"].shape[2] - 1
        if isinstance(output, tuple):
            return (output[0][:, :, :f], *output[1:])
        output.sample = output.sample[:, :, :f]
        return output

    return [transformer.register_forward_pre_hook(before, with_kwargs=True),
            transformer.register_forward_hook(after, with_kwargs=True)]


class WanVaceRunner(WanRunner):
    """Wan VACE (``WanVACEPipeline``): text-to-video and -image, reference-to-video (the
    references as VACE reference images) and image-to-video (the first frame given as a
    VACE control frame with a mask that keeps it, the rest generated)."""

    def __init__(self, entry, device, dtype, load_device=None):
        FamilyRunner.__init__(self, entry, device, dtype, load_device)
        from diffusers import DiffusionPipeline

        base = load_pipeline(DiffusionPipeline, entry, dtype).to(self.load_device)
        base.set_progress_bar_config(disable=True)
        self.base = base
        self.pipes = {"vace": base}
        self.preview = self._fit_preview()

    @torch.no_grad()
    def run(self, request: GenerationRequest, inputs: dict[str, np.ndarray],
            on_step: StepFn) -> RunOutput:
        from PIL import Image

        pipe, mode = self.base, request.mode
        frames = 1 if mode == "t2i" else request.num_frames
        clock = StageClock([pipe.transformer, getattr(pipe, "transformer_2", None)])
        timings: dict[str, float] = {}
        notes: list[str] = []
        max_len = int(self.entry.call_kwargs.get("max_sequence_length", 512))
        cfg = request.guidance_scale > 1.0
        prompt_embeds, negative_embeds = self.encode_text(
            (request.prompt, request.negative_prompt if cfg else None, max_len),
            lambda: pipe.encode_prompt(request.prompt, request.negative_prompt or None,
                                       do_classifier_free_guidance=cfg,
                                       max_sequence_length=max_len, device=self.device),
            timings, notes)
        kwargs = dict(prompt_embeds=prompt_embeds, negative_prompt_embeds=negative_embeds,
                      height=request.height, width=request.width, num_frames=frames,
                      num_inference_steps=request.steps, guidance_scale=request.guidance_scale,
                      generator=self.generator(request.seed), output_type="np",
                      max_sequence_length=max_len,
                      callback_on_step_end=make_callback(on_step, clock),
                      callback_on_step_end_tensor_inputs=["latents"])
        size = (request.width, request.height)
        if mode == "r2v":
            kwargs["reference_images"] = [
                to_pil(fit_image(inputs[r.content_id], request.width, request.height))
                for r in request.references]
        if mode == "i2v":
            first = to_pil(fit_image(inputs[request.first_frame.content_id], request.width,
                                     request.height))
            kwargs["video"] = [first] + [Image.new("RGB", size, (128, 128, 128))] * (frames - 1)
            kwargs["mask"] = [Image.new("L", size, 0)] + [Image.new("L", size, 255)] * (frames - 1)
        notes = self.apply_profile(request) + notes
        out = np.asarray(pipe(**kwargs).frames[0], dtype=np.float32)
        return self.result(out, timings, clock, notes)
