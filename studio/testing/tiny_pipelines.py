"""Tiny random-weight pipelines built from the real diffusers and transformers classes.

Used by the tests, the benchmarks and the placeholder embedded model: each builder shrinks the
real configs (a few layers, a few channels) so a full pipeline runs in well under a second on
a CPU, and saves it in diffusers format with ``save_pretrained`` (safetensors only), so it is
loaded back through the studio's own registry exactly like a real checkpoint.

Nothing here touches the network: the tokenizers are word-level vocabularies built in memory
with the ``tokenizers`` library.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

WORDS = (
    "a an the of on in at to and with across over small large big tiny red orange yellow green "
    "blue purple white black gray grey brown pink circle square triangle star shape shapes "
    "left right top bottom center centre corner middle background sky grass brick night "
    "moves moving slides slide grows growing shrinks shrinking still up down two one "
    "photo cat dog car tree house"
).split()


def make_word_tokenizer(model_max_length: int, words: tuple[str, ...] = WORDS):
    """A word-level fast tokenizer (``PreTrainedTokenizerFast``) over ``words``.

    Ids: 0 ``<pad>``, 1 ``</s>``, 2 ``<unk>``, then the words in order; an end-of-sequence
    token is appended to every text, as T5 and UMT5 expect.
    """
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2}
    for w in words:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Punctuation()])
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A $B </s>",
                                                       special_tokens=[("</s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>",
                                   unk_token="<unk>", model_max_length=model_max_length)


def _umt5(vocab_size: int, d_model: int = 32):
    from transformers import UMT5Config, UMT5EncoderModel

    cfg = UMT5Config(vocab_size=vocab_size, d_model=d_model, d_kv=8, d_ff=64, num_layers=2,
                     num_heads=4, relative_attention_num_buckets=8, dropout_rate=0.0)
    return UMT5EncoderModel(cfg).eval()


def _wan_vae(z_dim: int = 16):
    from diffusers import AutoencoderKLWan

    return AutoencoderKLWan(base_dim=3, z_dim=z_dim, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                            temperal_downsample=[False, True, True],
                            latents_mean=[0.0] * z_dim, latents_std=[1.0] * z_dim).eval()


def build_tiny_wan(folder: str | os.PathLike[str], *, variant: str = "ti2v", seed: int = 0,
                   num_layers: int = 2, head_dim: int = 16, heads: int = 2,
                   text_len: int = 32) -> Path:
    """Builds and saves a tiny Wan pipeline with random weights.

    Args:
        folder: where to save (diffusers layout: model_index.json + component folders).
        variant: ``"t2v"`` (Wan 2.1 text-to-video, ``WanPipeline``), ``"i2v"`` (Wan 2.1
            image-to-video with a CLIP image encoder, ``WanImageToVideoPipeline``) or
            ``"ti2v"`` (Wan 2.2 TI2V-style: one transformer for text and image to video, the
            first frame given as clean latents with a zero timestep: ``expand_timesteps``) or
            ``"a14b"`` (Wan 2.2 A14B text-to-video: two experts, ``transformer`` above the
            boundary timestep and ``transformer_2`` below it).
        seed: torch seed for the random weights.
    Returns:
        The folder, as a Path.
    """
    from diffusers import (
        FlowMatchEulerDiscreteScheduler,
        WanImageToVideoPipeline,
        WanPipeline,
        WanTransformer3DModel,
    )

    if variant not in ("t2v", "i2v", "ti2v", "a14b"):
        raise ValueError(f"variant: {variant!r} is not one of t2v, i2v, ti2v, a14b")
    torch.manual_seed(seed)
    tokenizer = make_word_tokenizer(text_len)
    text_encoder = _umt5(len(tokenizer))
    vae = _wan_vae()
    extra = {}
    if variant == "i2v":
        from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModelWithProjection

        vision = CLIPVisionConfig(hidden_size=4 * head_dim, projection_dim=4 * head_dim,
                                  num_hidden_layers=2, num_attention_heads=2, image_size=32,
                                  intermediate_size=32, patch_size=8)
        extra["image_encoder"] = CLIPVisionModelWithProjection(vision).eval()
        extra["image_processor"] = CLIPImageProcessor(crop_size=32, size=32)
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=heads, attention_head_dim=head_dim,
        in_channels=36 if variant == "i2v" else 16, out_channels=16, text_dim=32,
        freq_dim=32, ffn_dim=32, num_layers=num_layers, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", rope_max_seq_len=32,
        image_dim=4 * head_dim if variant == "i2v" else None).eval()
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    parts = dict(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, scheduler=scheduler,
                 transformer=transformer)
    if variant == "a14b":  # Wan 2.2 A14B: a high-noise and a low-noise expert
        torch.manual_seed(seed + 1)
        expert = WanTransformer3DModel(**transformer.config).eval()
        pipe = WanPipeline(**parts, transformer_2=expert, boundary_ratio=0.875)
    elif variant == "t2v":
        pipe = WanPipeline(**parts)
    else:
        pipe = WanImageToVideoPipeline(**parts, **extra,
                                       expand_timesteps=(variant == "ti2v"))
    out = Path(folder)
    pipe.save_pretrained(out, safe_serialization=True)
    return out


def build_tiny_flux(folder: str | os.PathLike[str], *, seed: int = 0) -> Path:
    """Builds and saves a tiny FLUX.1-architecture pipeline with random weights.

    Two text encoders as in FLUX.1 (CLIP for the pooled vector, T5 for the sequence), a
    16-channel AutoencoderKL with an 8x spatial factor (4 channels here), and a
    FluxTransformer2DModel with one double-stream and one single-stream block.
    """
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        FluxPipeline,
        FluxTransformer2DModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    torch.manual_seed(seed)
    tokenizer = make_word_tokenizer(77)
    tokenizer_2 = make_word_tokenizer(32)
    clip_cfg = CLIPTextConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=37,
                              num_hidden_layers=2, num_attention_heads=4, projection_dim=32,
                              max_position_embeddings=77, eos_token_id=1, pad_token_id=0,
                              bos_token_id=1)
    text_encoder = CLIPTextModel(clip_cfg).eval()
    t5_cfg = T5Config(vocab_size=len(tokenizer_2), d_model=32, d_kv=8, d_ff=37, num_layers=2,
                      num_heads=4, relative_attention_num_buckets=8, dropout_rate=0.0)
    text_encoder_2 = T5EncoderModel(t5_cfg).eval()
    vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4, sample_size=32,
                        block_out_channels=(8, 8, 8, 8),
                        down_block_types=("DownEncoderBlock2D",) * 4,
                        up_block_types=("UpDecoderBlock2D",) * 4, layers_per_block=1,
                        norm_num_groups=4, use_quant_conv=False, use_post_quant_conv=False,
                        shift_factor=0.0609, scaling_factor=1.5035).eval()
    transformer = FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=1,
                                         num_single_layers=1, attention_head_dim=16,
                                         num_attention_heads=2, joint_attention_dim=32,
                                         pooled_projection_dim=32, guidance_embeds=False,
                                         axes_dims_rope=(4, 4, 8)).eval()
    pipe = FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), vae=vae,
                        text_encoder=text_encoder, tokenizer=tokenizer,
                        text_encoder_2=text_encoder_2, tokenizer_2=tokenizer_2,
                        transformer=transformer)
    out = Path(folder)
    pipe.save_pretrained(out, safe_serialization=True)
    return out


def _tiny_kl_vae(latent_channels: int = 4, **extra):
    from diffusers import AutoencoderKL

    return AutoencoderKL(in_channels=3, out_channels=3, latent_channels=latent_channels,
                         sample_size=32, block_out_channels=(8, 8, 8, 8),
                         down_block_types=("DownEncoderBlock2D",) * 4,
                         up_block_types=("UpDecoderBlock2D",) * 4, layers_per_block=1,
                         norm_num_groups=4, **extra).eval()


def _clip_text(tokenizer, hidden: int = 32, projection: bool = False, positions: int = 77):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    cfg = CLIPTextConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=37,
                         num_hidden_layers=2, num_attention_heads=4, projection_dim=hidden,
                         max_position_embeddings=positions, eos_token_id=1, pad_token_id=0,
                         bos_token_id=1)
    cls = CLIPTextModelWithProjection if projection else CLIPTextModel
    return cls(cfg).eval()


def build_tiny_sd(folder: str | os.PathLike[str], *, variant: str = "sd15",
                  seed: int = 0) -> Path:
    """Builds and saves a tiny Stable Diffusion pipeline with random weights.

    Args:
        variant: ``"sd15"`` (``StableDiffusionPipeline``: CLIP text encoder, 4-channel UNet),
            ``"sdxl"`` (``StableDiffusionXLPipeline``: two CLIP encoders, the text-time
            added conditioning), ``"sd15-inpaint"`` (a 9-channel inpainting UNet) or
            ``"sd3"`` (``StableDiffusion3Pipeline``: CLIP-L, CLIP-G and T5, an MMDiT
            ``SD3Transformer2DModel``, 16-channel VAE, flow matching).
    Returns:
        The folder, as a Path.
    """
    import diffusers

    if variant not in ("sd15", "sd15-inpaint", "sdxl", "sd3"):
        raise ValueError(f"variant: {variant!r} is not one of sd15, sd15-inpaint, sdxl, sd3")
    torch.manual_seed(seed)
    tokenizer = make_word_tokenizer(77)
    if variant == "sd3":
        tokenizer_3 = make_word_tokenizer(32)
        from transformers import T5Config, T5EncoderModel

        t5 = T5EncoderModel(T5Config(vocab_size=len(tokenizer_3), d_model=32, d_kv=8,
                                     d_ff=37, num_layers=2, num_heads=4,
                                     relative_attention_num_buckets=8,
                                     dropout_rate=0.0)).eval()
        transformer = diffusers.SD3Transformer2DModel(
            sample_size=32, patch_size=2, in_channels=16, num_layers=2,
            attention_head_dim=16, num_attention_heads=2, caption_projection_dim=32,
            joint_attention_dim=32, pooled_projection_dim=64, out_channels=16,
            pos_embed_max_size=32).eval()
        pipe = diffusers.StableDiffusion3Pipeline(
            transformer=transformer,
            scheduler=diffusers.FlowMatchEulerDiscreteScheduler(shift=3.0),
            vae=_tiny_kl_vae(16, shift_factor=0.0609, scaling_factor=1.5035,
                             use_quant_conv=False, use_post_quant_conv=False),
            text_encoder=_clip_text(tokenizer, projection=True), tokenizer=tokenizer,
            text_encoder_2=_clip_text(tokenizer, projection=True), tokenizer_2=tokenizer,
            text_encoder_3=t5, tokenizer_3=tokenizer_3)
    else:
        xl = variant == "sdxl"
        unet_extra = dict(addition_embed_type="text_time", addition_time_embed_dim=8,
                          projection_class_embeddings_input_dim=32 + 6 * 8,
                          cross_attention_dim=64, use_linear_projection=True,
                          transformer_layers_per_block=(1, 2)) if xl else dict(
                              cross_attention_dim=32)
        unet = diffusers.UNet2DConditionModel(
            block_out_channels=(16, 32), layers_per_block=1, sample_size=32,
            in_channels=9 if variant == "sd15-inpaint" else 4, out_channels=4,
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), attention_head_dim=(2, 4),
            norm_num_groups=8, **unet_extra).eval()
        scheduler = diffusers.EulerDiscreteScheduler(
            beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
            timestep_spacing="leading", steps_offset=1)
        parts = dict(unet=unet, scheduler=scheduler, vae=_tiny_kl_vae(4, scaling_factor=0.18215),
                     text_encoder=_clip_text(tokenizer), tokenizer=tokenizer)
        if xl:
            pipe = diffusers.StableDiffusionXLPipeline(
                **parts, text_encoder_2=_clip_text(tokenizer, projection=True),
                tokenizer_2=tokenizer)
        else:
            cls = (diffusers.StableDiffusionInpaintPipeline if variant == "sd15-inpaint"
                   else diffusers.StableDiffusionPipeline)
            pipe = cls(**parts, safety_checker=None, feature_extractor=None,
                       requires_safety_checker=False)
    out = Path(folder)
    pipe.save_pretrained(out, safe_serialization=True)
    return out


def build_tiny_ltx(folder: str | os.PathLike[str], *, seed: int = 0,
                   timestep_conditioning: bool = False) -> Path:
    """Builds and saves a tiny LTX-Video pipeline (``LTXPipeline``) with random weights:
    a T5 text encoder, an ``AutoencoderKLLTXVideo`` with LTX's own 32x spatial and 8x
    temporal compression (4 scaling stages of a few channels) and an
    ``LTXVideoTransformer3DModel`` of two layers. ``timestep_conditioning``: the VAE's
    decoder takes a decode timestep, as LTX-Video 0.9.1 and later do."""
    from diffusers import (
        AutoencoderKLLTXVideo,
        FlowMatchEulerDiscreteScheduler,
        LTXPipeline,
        LTXVideoTransformer3DModel,
    )
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(seed)
    tokenizer = make_word_tokenizer(32)
    text_encoder = T5EncoderModel(T5Config(
        vocab_size=len(tokenizer), d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, dropout_rate=0.0)).eval()
    vae = AutoencoderKLLTXVideo(
        latent_channels=8, block_out_channels=(8, 8, 8, 8),
        decoder_block_out_channels=(8, 8, 8, 8), layers_per_block=(1, 1, 1, 1, 1),
        decoder_layers_per_block=(1, 1, 1, 1, 1),
        timestep_conditioning=timestep_conditioning).eval()
    transformer = LTXVideoTransformer3DModel(
        in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=16,
        cross_attention_dim=32, num_layers=2, caption_channels=32).eval()
    pipe = LTXPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae,
                       text_encoder=text_encoder, tokenizer=tokenizer, transformer=transformer)
    out = Path(folder)
    pipe.save_pretrained(out, safe_serialization=True)
    return out


def build_tiny_wan_vace(folder: str | os.PathLike[str], *, seed: int = 0) -> Path:
    """Builds and saves a tiny Wan VACE pipeline (``WanVACEPipeline``) with random weights:
    a ``WanVACETransformer3DModel`` of two layers with one VACE control block, the tiny Wan
    VAE (8x spatial, 4x temporal) and UMT5 text encoder."""
    from diffusers import (
        FlowMatchEulerDiscreteScheduler,
        WanVACEPipeline,
        WanVACETransformer3DModel,
    )

    torch.manual_seed(seed)
    tokenizer = make_word_tokenizer(32)
    transformer = WanVACETransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=16,
        out_channels=16, text_dim=32, freq_dim=32, ffn_dim=32, num_layers=2,
        cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=32,
        vace_layers=[0], vace_in_channels=16 * 2 + 8 * 8).eval()
    pipe = WanVACEPipeline(tokenizer=tokenizer, text_encoder=_umt5(len(tokenizer)),
                           vae=_wan_vae(), scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
                           transformer=transformer)
    out = Path(folder)
    pipe.save_pretrained(out, safe_serialization=True)
    return out


def build_tiny_qwen_image(folder: str | os.PathLike[str], *, seed: int = 0) -> Path:
    """Builds and saves a tiny Qwen-Image pipeline (``QwenImagePipeline``) with random
    weights: a two-layer ``Qwen2_5_VLForConditionalGeneration`` text encoder (with a one-block
    vision tower, as the class requires), ``AutoencoderKLQwenImage`` (8x spatial) and a
    two-layer ``QwenImageTransformer2DModel``."""
    import diffusers
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(seed)
    tokenizer = make_word_tokenizer(64)
    config = Qwen2_5_VLConfig(
        text_config=dict(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=37,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]},
                         max_position_embeddings=256),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2,
                           out_hidden_size=32, patch_size=14, spatial_merge_size=2,
                           temporal_patch_size=2, in_chans=3),
        vocab_size=len(tokenizer), hidden_size=32)
    text_encoder = Qwen2_5_VLForConditionalGeneration(config).eval()
    vae = diffusers.AutoencoderKLQwenImage(
        base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
        temperal_downsample=[False, True, True], latents_mean=[0.0] * 4,
        latents_std=[1.0] * 4).eval()
    transformer = diffusers.QwenImageTransformer2DModel(
        patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=32, guidance_embeds=False,
        axes_dims_rope=(4, 6, 6)).eval()
    pipe = diffusers.QwenImagePipeline(scheduler=diffusers.FlowMatchEulerDiscreteScheduler(),
                                       vae=vae, text_encoder=text_encoder, tokenizer=tokenizer,
                                       transformer=transformer)
    out = Path(folder)
    pipe.save_pretrained(out, safe_serialization=True)
    return out


def build_tiny_flux2(folder: str | os.PathLike[str], *, seed: int = 0) -> Path:
    """Builds and saves a tiny FLUX.2 pipeline (``Flux2Pipeline``) with random weights: a
    ``Mistral3ForConditionalGeneration`` text encoder of 30 narrow layers (the pipeline stacks
    layers 10, 20 and 30), a word-level tokenizer with a chat template, an
    ``AutoencoderKLFlux2`` and a ``Flux2Transformer2DModel`` of one double and one single
    block."""
    import diffusers
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration

    torch.manual_seed(seed)
    tokenizer = make_word_tokenizer(64)
    tokenizer.chat_template = (
        "{% for m in messages %}{% for c in m['content'] %}{% if c['type'] == 'text' %}"
        "{{ c['text'] }} {% endif %}{% endfor %}{% endfor %}")
    config = Mistral3Config(
        text_config=dict(model_type="mistral", vocab_size=len(tokenizer), hidden_size=16,
                         intermediate_size=24, num_hidden_layers=30, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=8, max_position_embeddings=128),
        vision_config=dict(model_type="pixtral", hidden_size=16, intermediate_size=16,
                           num_hidden_layers=1, num_attention_heads=2, head_dim=8,
                           image_size=32, patch_size=16),
        image_token_index=2)
    text_encoder = Mistral3ForConditionalGeneration(config).eval()
    vae = diffusers.AutoencoderKLFlux2(block_out_channels=(8, 8, 8, 8), layers_per_block=1,
                                       latent_channels=4, norm_num_groups=4,
                                       sample_size=32).eval()
    transformer = diffusers.Flux2Transformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=48, timestep_guidance_channels=16,
        mlp_ratio=2.0, axes_dims_rope=(4, 4, 4, 4)).eval()
    pipe = diffusers.Flux2Pipeline(scheduler=diffusers.FlowMatchEulerDiscreteScheduler(),
                                   vae=vae, text_encoder=text_encoder, tokenizer=tokenizer,
                                   transformer=transformer)
    out = Path(folder)
    pipe.save_pretrained(out, safe_serialization=True)
    return out


def build_tiny_hidream(folder: str | os.PathLike[str], *, seed: int = 0) -> Path:
    """Builds and saves a tiny HiDream-I1 pipeline (``HiDreamImagePipeline``) with random
    weights: two CLIP encoders with projection, T5, a two-layer Llama (its layers 0 and 1 feed
    the transformer), an ``AutoencoderKL`` and a ``HiDreamImageTransformer2DModel`` of two
    double- and two single-stream blocks with 4 routed experts."""
    import diffusers
    from transformers import LlamaConfig, LlamaForCausalLM, T5Config, T5EncoderModel

    torch.manual_seed(seed)
    tokenizer = make_word_tokenizer(77)
    tokenizer_3, tokenizer_4 = make_word_tokenizer(128), make_word_tokenizer(128)
    t5 = T5EncoderModel(T5Config(vocab_size=len(tokenizer_3), d_model=32, d_kv=8, d_ff=37,
                                 num_layers=2, num_heads=4, relative_attention_num_buckets=8,
                                 dropout_rate=0.0)).eval()
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer_4), hidden_size=32,
                                         intermediate_size=37, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=256)).eval()
    transformer = diffusers.HiDreamImageTransformer2DModel(
        patch_size=2, in_channels=4, out_channels=4, num_layers=2, num_single_layers=2,
        attention_head_dim=8, num_attention_heads=4, caption_channels=[32, 32],
        text_emb_dim=64, num_routed_experts=4, num_activated_experts=2,
        axes_dims_rope=(4, 2, 2), max_resolution=(32, 32), llama_layers=(0, 1, 1, 1)).eval()
    pipe = diffusers.HiDreamImagePipeline(
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(),
        vae=_tiny_kl_vae(4, scaling_factor=0.3611, shift_factor=0.1159),
        # HiDream's CLIP encoders take up to 218 tokens (long-context CLIP)
        text_encoder=_clip_text(tokenizer, projection=True, positions=248),
        tokenizer=tokenizer,
        text_encoder_2=_clip_text(tokenizer, projection=True, positions=248),
        tokenizer_2=tokenizer, text_encoder_3=t5, tokenizer_3=tokenizer_3,
        text_encoder_4=llama,
        tokenizer_4=tokenizer_4, transformer=transformer)
    out = Path(folder)
    pipe.save_pretrained(out, safe_serialization=True)
    return out


def build_tiny_ltx2(folder: str | os.PathLike[str], *, seed: int = 0) -> Path:
    """Builds and saves a tiny LTX-2 audio-video pipeline (``LTX2Pipeline``) with random
    weights, every component the real class with a shrunk config:

    * a two-layer ``Gemma3ForConditionalGeneration`` text encoder (hidden size 16, with the
      one-layer vision tower the class requires) and a word-level tokenizer;
    * ``LTX2TextConnectors`` (one video and one audio connector layer, LTX-2.0 layout: the
      3 stacked Gemma hidden states are normalised and projected, 16 channels);
    * an ``LTX2VideoTransformer3DModel`` of two audio-video blocks (video 2x8, audio 2x4
      heads);
    * ``AutoencoderKLLTX2Video`` with LTX-2's real layout and compression (32x spatial, 8x
      temporal; 8 latent channels), ``AutoencoderKLLTX2Audio`` (8 mel bins, 2 latent
      channels) and an ``LTX2Vocoder`` (stereo, 16 kHz).

    A 96x64, 9-frame clip then has 2x3x2 video latents and 9 audio latent frames; two steps
    run in about 2 s on two CPU cores (the text side pads to the pipeline's 1024 tokens).
    """
    import diffusers
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    torch.manual_seed(seed)
    tokenizer = make_word_tokenizer(64)
    config = Gemma3Config(
        text_config=dict(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=24,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=8, max_position_embeddings=1024, sliding_window=64),
        vision_config=dict(hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                           num_attention_heads=2, image_size=28, patch_size=14),
        mm_tokens_per_image=4, image_token_index=2, boi_token_index=2, eoi_token_index=2)
    text_encoder = Gemma3ForConditionalGeneration(config).eval()
    hidden = config.text_config.hidden_size
    connectors = LTX2TextConnectors(
        caption_channels=hidden, text_proj_in_factor=config.text_config.num_hidden_layers + 1,
        video_connector_num_attention_heads=2, video_connector_attention_head_dim=8,
        video_connector_num_layers=1, video_connector_num_learnable_registers=None,
        audio_connector_num_attention_heads=2, audio_connector_attention_head_dim=8,
        audio_connector_num_layers=1, audio_connector_num_learnable_registers=None,
        connector_rope_base_seq_len=32, rope_double_precision=False, rope_type="split").eval()
    transformer = diffusers.LTX2VideoTransformer3DModel(
        in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=8,
        cross_attention_dim=16, audio_in_channels=4, audio_out_channels=4,
        audio_num_attention_heads=2, audio_attention_head_dim=4, audio_cross_attention_dim=8,
        num_layers=2, caption_channels=hidden, rope_double_precision=False,
        rope_type="split").eval()
    vae = diffusers.AutoencoderKLLTX2Video(
        latent_channels=8, block_out_channels=(8, 8, 8, 8),
        decoder_block_out_channels=(8, 16, 32), layers_per_block=(1, 1, 1, 1, 1),
        decoder_layers_per_block=(1, 1, 1, 1), spatial_compression_ratio=32,
        temporal_compression_ratio=8).eval()
    audio_vae = diffusers.AutoencoderKLLTX2Audio(
        base_channels=4, output_channels=2, ch_mult=(1,), num_res_blocks=1, in_channels=2,
        resolution=32, latent_channels=2, mel_bins=8).eval()
    vocoder = LTX2Vocoder(
        in_channels=audio_vae.config.output_channels * audio_vae.config.mel_bins,
        hidden_channels=8, out_channels=2, upsample_kernel_sizes=[4, 4], upsample_factors=[2, 2],
        resnet_kernel_sizes=[3], resnet_dilations=[[1, 3, 5]], output_sampling_rate=16000).eval()
    pipe = diffusers.LTX2Pipeline(
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), vae=vae, audio_vae=audio_vae,
        text_encoder=text_encoder, tokenizer=tokenizer, connectors=connectors,
        transformer=transformer, vocoder=vocoder)
    out = Path(folder)
    pipe.save_pretrained(out, safe_serialization=True)
    return out
