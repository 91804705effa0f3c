"""Modes beyond stock pipelines: masked image-to-image and reference-to-video."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from studio.core.media import pixels_content_id
from studio.core.request import GenerationRequest, MediaRef
from studio.engine.executor import runner_class
from studio.engine.models.registry import ModelRegistry


@pytest.fixture(scope="module")
def runner():
    entry = ModelRegistry(include_hf_cache=False).resolve("embedded")
    assert {"r2v", "i2i"} <= entry.capabilities.modes and entry.capabilities.supports_mask
    return runner_class(entry.family)(entry, torch.device("cpu"), torch.float32)


def image(seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).random((64, 64, 3)) * 255).astype(np.uint8)


def ref(pixels) -> MediaRef:
    return MediaRef(pixels_content_id(pixels))


def base(**kw) -> GenerationRequest:
    fields = dict(model="embedded", prompt="a small object moves left on grass", seed=3,
                  steps=4, guidance_scale=4.0, width=64, height=64)
    fields.update(kw)
    return GenerationRequest(**fields)


def test_masked_image_to_image_keeps_pixels_outside_the_mask(runner):
    init = image(1)
    mask = np.zeros((64, 64), np.uint8)
    mask[16:48, 16:48] = 255
    req = base(mode="i2i", init_image=ref(init), mask=ref(mask), strength=0.9)
    assert req.validate(runner.entry.capabilities) == []
    out = runner.run(req, {ref(init).content_id: init, ref(mask).content_id: mask},
                     lambda *a: None).frames[0]
    outside = mask < 128
    assert np.abs(out[outside] - init[outside] / 255.0).max() < 1e-6
    assert np.abs(out[~outside] - init[~outside] / 255.0).mean() > 0.02
    unmasked = runner.run(base(mode="i2i", init_image=ref(init), strength=0.9),
                          {ref(init).content_id: init}, lambda *a: None).frames[0]
    assert np.abs(unmasked[outside] - init[outside] / 255.0).mean() > 0.02


def test_reference_to_video_conditions_on_the_reference(runner):
    a, b = image(5), image(6)
    outs = []
    seen = []
    transformer = runner.pipes["t2v"].transformer
    hooks_before = (dict(transformer._forward_pre_hooks), dict(transformer._forward_hooks))
    spy = transformer.register_forward_hook(
        lambda m, args, kwargs, out: seen.append((kwargs["hidden_states"].shape,
                                                  kwargs["timestep"][0, -1].item(),
                                                  out[0].shape)), with_kwargs=True)
    for pixels in (a, b, a):
        req = base(mode="r2v", num_frames=9, references=(ref(pixels),))
        assert req.validate(runner.entry.capabilities) == []
        outs.append(runner.run(req, {ref(pixels).content_id: pixels}, lambda *x: None).frames)
    assert outs[0].shape == (9, 64, 64, 3)  # the reference frame is not part of the output
    assert np.array_equal(outs[0], outs[2])  # deterministic
    assert np.abs(outs[0] - outs[1]).max() > 0  # the reference reaches the pixels
    spy.remove()
    # the denoiser saw the clip's latent frames (3 with 4x temporal compression, 5 with 2x)
    # plus 1 reference frame, at timestep 0
    from studio.tiny.autoencoder import temporal_compression_of

    latent_frames = (9 - 1) // temporal_compression_of(runner.pipes["t2v"].vae) + 1
    assert seen and all(s[0][2] == latent_frames + 1 and s[1] == 0.0 for s in seen)
    # r2v's own hooks are gone (the runner's fit_token_timesteps hook, if any, stays)
    assert (dict(transformer._forward_pre_hooks), dict(transformer._forward_hooks)) == hooks_before


def test_reference_tokens_join_the_prompt_and_only_the_conditional_branch(tmp_path):
    """A model whose studio.json names a reference encoder: its tokens of the reference
    follow the prompt's in cross-attention (zeros in the unconditional branch), computed
    from the reference fitted to the encoder's size whatever the request's size."""
    import json
    import shutil

    from studio.engine.models.registry import EMBEDDED_DIR
    from studio.tiny.train import build_reference_encoder

    folder = tmp_path / "with-tokens"
    shutil.copytree(EMBEDDED_DIR / "tiny-wan", folder)
    vae = json.loads((folder / "vae" / "config.json").read_text())
    torch.manual_seed(0)
    build_reference_encoder(int(vae["scale_factor_spatial"]), int(vae["z_dim"])).to(
        torch.float16).save_pretrained(folder / "refenc")
    meta = json.loads((folder / "studio.json").read_text())
    meta.pop("reference_tokens", None)
    meta.pop("reference_words", None)  # the prompt's own embeddings stay the plain prompt's
    (folder / "studio.json").write_text(json.dumps({**meta, "reference_tokens": "refenc"}))
    entry = ModelRegistry([tmp_path], include_hf_cache=False).resolve(str(folder))
    assert entry.reference_encoder == "refenc"
    runner = runner_class(entry.family)(entry, torch.device("cpu"), torch.float32)
    seen = []
    spy = runner.pipes["t2v"].transformer.register_forward_pre_hook(
        lambda m, args, kwargs: seen.append(kwargs["encoder_hidden_states"].clone()),
        with_kwargs=True)
    a, b = image(5), image(6)
    outs = []
    for pixels in (a, b):
        req = base(mode="r2v", num_frames=5, width=96, height=64, references=(ref(pixels),))
        assert req.validate(entry.capabilities) == []
        outs.append(runner.run(req, {ref(pixels).content_id: pixels}, lambda *x: None).frames)
    spy.remove()
    text_len = entry.call_kwargs["max_sequence_length"]
    tokens = 1 + 4 ** 2  # a class token and 4 x 4 patches, whatever the VAE
    assert all(e.shape == (1, text_len + tokens, 64) for e in seen)
    cond, uncond = seen[0][0], seen[1][0]  # WanPipeline: conditional, then unconditional
    assert cond[text_len:].abs().sum() > 0 and uncond[text_len:].abs().sum() == 0
    # the tokens are the encoder's on the reference fitted to 64 x 64 pixels
    from studio.core.media import fit_image
    from studio.engine.pipelines.wan import reference_tokens

    want = reference_tokens(runner.reference_encoder, runner.encode_image(fit_image(a, 64, 64)))
    torch.testing.assert_close(cond[text_len:], want[0].to(cond))
    assert not torch.equal(seen[-1][0, text_len:], cond[text_len:])  # another reference
    assert np.abs(outs[0] - outs[1]).max() > 0
    with pytest.raises(ValueError, match="reference: expected"):
        reference_tokens(runner.reference_encoder, torch.zeros(1, 8, 1, 8, 8))


def test_a_reference_encoder_that_is_not_a_folder_makes_the_model_unusable(tmp_path):
    import json
    import shutil

    from studio.engine.models.registry import EMBEDDED_DIR

    folder = tmp_path / "bad"
    shutil.copytree(EMBEDDED_DIR / "tiny-wan", folder)
    meta = json.loads((folder / "studio.json").read_text())
    for bad in ("../tiny-wan/vae", "missing"):
        (folder / "studio.json").write_text(json.dumps({**meta, "reference_tokens": bad}))
        entry = ModelRegistry([tmp_path], include_hf_cache=False).list()
        entry = next(e for e in entry if e.path == folder)
        assert "reference_tokens" in entry.error and not entry.usable
