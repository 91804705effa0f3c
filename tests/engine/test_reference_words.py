"""Reference-to-video's pseudo-words (ReferenceWords): the text encoder reads them in the
sentence as it reads real words, an r2v job puts them in place of the prompt's placeholder,
the map is fitted from the model's own reference tokens, and a bad declaration is refused."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from studio.core.media import fit_image, pixels_content_id
from studio.core.request import GenerationRequest, MediaRef
from studio.engine.executor import runner_class
from studio.engine.models.folders import ModelError
from studio.engine.models.registry import EMBEDDED_DIR, ModelRegistry
from studio.engine.pipelines.wan import ReferenceWords, reference_tokens
from studio.tiny import world
from studio.tiny.denoiser import reference_image
from studio.tiny.reference_words import MAP_FILE, fit_word_map, word_rows, write_word_map

MAX_LEN = 32


@pytest.fixture(scope="module")
def runner():
    entry = ModelRegistry(include_hf_cache=False).resolve("embedded")
    assert entry.reference_words == {"map": MAP_FILE, "placeholder": "object"}
    return runner_class(entry.family)(entry, torch.device("cpu"), torch.float32)


def encode(pipe, text):
    return pipe.encode_prompt(text, None, do_classifier_free_guidance=False,
                              max_sequence_length=MAX_LEN, device="cpu")[0]


def test_pseudo_words_equal_to_word_rows_encode_as_those_words(runner):
    pipe, words = runner.pipes["t2v"], runner.reference_words
    text = words.prompt("On grass, a small Object moves left past another object")
    assert text == "On grass, a small object object moves left past another object"
    assert words.prompt("a red star moves left") is None
    # a placeholder word is what the tokenizer reads as one (NFKC, lower case, \w+ words,
    # punctuation such as "_" split off); without a fast tokenizer, a whole word of the NFKC
    # text not joined to \w or combining marks
    fallback = ReferenceWords(words.weight, words.bias, words.placeholder,
                              words.placeholder_id, words.words)
    tokenizer = pipe.tokenizer
    for joined, read in (("ｏｂｊｅｃｔ", True), ("OBJECT.", True), ("object_1", True),
                         ("objects", False), ("object\u0301", False),
                         ("e\u0301object", False), ("my-object2", False)):
        prompt = f"a small {joined} moves left"
        assert (pipe.tokenizer.convert_tokens_to_ids("object") in
                tokenizer(prompt).input_ids) is read, joined
        assert (words.prompt(prompt) is not None) is read, joined
        assert (fallback.prompt(prompt) is not None) is (read and joined != "object_1"), joined
    assert words.prompt("A small ｏｂｊｅｃｔ moves") == "A small object object moves"
    assert words.prompt("an object\u0301 and an OBJECT_1.") == \
        "an object\u0301 and an object object_1."
    assert fallback.prompt("an object\u0301 and an OBJECT.") == \
        "an object\u0301 and an object object."
    rows = word_rows(runner, ["red", "star"])
    with words.injected(pipe.text_encoder, rows) as placed:
        got = encode(pipe, text)
    assert placed == [(0, 5)]  # after "on", "grass", ",", "a", "small" (a word-level vocabulary)
    want = encode(pipe, "On grass, a small red star moves left past another object")
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # the hook is gone afterwards: the placeholder reads as itself again
    plain = encode(pipe, text)
    assert (plain - want).abs().max() > 0.05


def test_an_r2v_job_puts_the_reference_into_the_prompt(runner):
    pipe = runner.pipes["t2v"]
    rng = np.random.default_rng(0)
    spec = world.sample_scene(rng, video=True, split="eval")
    pixels = reference_image(spec, rng)
    full = "a small object moves left"  # grown to the 32-token limit exactly (EOS included)
    while len(pipe.tokenizer(full + " on grass").input_ids) <= MAX_LEN:
        full += " on grass"
    if len(pipe.tokenizer(full).input_ids) < MAX_LEN:
        full += " now"
    assert len(pipe.tokenizer(full).input_ids) == MAX_LEN
    seen = []
    spy = pipe.transformer.register_forward_pre_hook(
        lambda m, args, kwargs: seen.append(kwargs["encoder_hidden_states"].clone()),
        with_kwargs=True)
    media = MediaRef(pixels_content_id(pixels))
    outs = {}
    try:
        for prompt in ("a small object moves left on grass", "a small thing moves left on grass",
                       "on a grass background " * 8 + "a small object moves left", full):
            req = GenerationRequest(mode="r2v", model="embedded", prompt=prompt, seed=1, steps=2,
                                    guidance_scale=4.0, width=64, height=64, num_frames=5,
                                    references=(media,))
            assert req.validate(runner.entry.capabilities) == []
            seen.clear()
            outs[prompt] = (runner.run(req, {media.content_id: pixels}, lambda *a: None),
                            seen[0][0, :MAX_LEN].clone())
    finally:
        spy.remove()
    words = runner.reference_words
    tokens = reference_tokens(runner.reference_encoder,
                              runner.encode_image(fit_image(pixels, 64, 64)))
    with words.injected(pipe.text_encoder, words.embeds(tokens)[0]):
        want = encode(pipe, "a small object object moves left on grass")[0]
    out, cond = outs["a small object moves left on grass"]
    torch.testing.assert_close(cond, want.to(cond))
    # the pseudo-words read as the object's own colour and shape words
    obj = spec.objects[0]
    named = encode(pipe, f"a small {obj.colour} {obj.shape} moves left on grass")[0]
    anonymous = encode(pipe, "a small object moves left on grass")[0]
    assert (cond - named.to(cond)).pow(2).mean() < 0.1 * (anonymous - named).pow(2).mean()
    assert not any("reference words" in n for n in out.notes)
    # a prompt without the placeholder is encoded as it is, and the job says why
    out, cond = outs["a small thing moves left on grass"]
    torch.testing.assert_close(cond, encode(pipe, "a small thing moves left on grass")[0])
    assert any("does not say 'object'" in n for n in out.notes)
    # a placeholder past the 32-token limit is cut off with the rest: said, not hidden
    long = "on a grass background " * 8 + "a small object moves left"
    out, cond = outs[long]
    torch.testing.assert_close(cond, encode(pipe, long)[0])
    assert any("in the prompt's first 32 tokens" in n for n in out.notes)
    # a prompt at the limit: the extra slot pushes its end off, and the job says so
    out, cond = outs[full]
    assert any("push the prompt's end past its 32-token limit" in n for n in out.notes)


def test_the_fitted_map_names_held_out_objects(runner):
    weight, bias, stats = fit_word_map(runner, images=96, held_out=48, seed=3)
    assert stats["colour_nearest"] >= 0.9 and stats["shape_nearest"] >= 0.9, stats
    assert stats["r2"] > 0.9 and stats["relative_error"] < 0.1, stats
    with pytest.raises(ValueError, match="images"):
        fit_word_map(runner, images=10)
    # the check can fail: an untrained reference encoder's tokens do not name the shape
    from studio.tiny.denoiser import build_reference_encoder

    trained = runner.reference_encoder
    torch.manual_seed(0)
    runner.reference_encoder = build_reference_encoder(
        int(runner.base.vae.config.scale_factor_spatial), int(runner.base.vae.config.z_dim))
    try:
        _, _, untrained = fit_word_map(runner, images=96, held_out=48, seed=3)
    finally:
        runner.reference_encoder = trained
    assert untrained["shape_nearest"] < 0.7, untrained


def load(runner, path, placeholder="object"):
    return ReferenceWords.load(path, placeholder, runner.base.tokenizer,
                               runner.base.text_encoder, 64, "m")


def test_a_written_map_is_loaded_and_a_bad_one_refused(tmp_path, runner):
    folder = tmp_path / "m"
    shutil.copytree(EMBEDDED_DIR / "tiny-wan", folder)
    dim = runner.base.text_encoder.get_input_embeddings().embedding_dim
    weight = torch.randn(2 * dim, 2 * 64)
    write_word_map(folder, weight, torch.zeros(2 * dim), {"note": "random"})
    entry = ModelRegistry([tmp_path], include_hf_cache=False).resolve(str(folder))
    assert entry.usable and entry.reference_words["placeholder"] == "object"
    loaded = load(runner, folder / MAP_FILE)
    torch.testing.assert_close(loaded.weight, weight)
    assert loaded.embeds(torch.ones(1, 17, 64)).shape == (1, 2, dim)
    # the content hash covers the map
    before = ModelRegistry([tmp_path], include_hf_cache=False)
    first = before.content_hash(entry)
    write_word_map(folder, weight * 2, torch.zeros(2 * dim))
    assert ModelRegistry([tmp_path], include_hf_cache=False).content_hash(
        before.resolve(str(folder))) != first
    # placeholders: two tokens, or one the tokenizer does not know (its unknown token)
    for word in ("two words", "widget"):
        with pytest.raises(ModelError, match="not one token the tokenizer knows"):
            load(runner, folder / MAP_FILE, word)
    # shapes that do not map 2 tokens of 64 to 2 words, and values that are not finite
    for w, b in ((torch.randn(3 * dim, 2 * 64), torch.zeros(3 * dim)),
                 (torch.randn(2 * dim, 126), torch.zeros(2 * dim))):
        write_word_map(folder, w, b)
        with pytest.raises(ModelError, match="does not map 2 tokens of 64"):
            load(runner, folder / MAP_FILE)
    write_word_map(folder, weight * float("nan"), torch.zeros(2 * dim))
    with pytest.raises(ModelError, match="not finite"):
        load(runner, folder / MAP_FILE)
    from safetensors.torch import save_file

    for tensors, metadata, why in (({"weight": weight, "bias": torch.zeros(2 * dim)}, None,
                                    "no 'words'"),
                                   ({"weight": weight}, {"words": "2"}, "bias"),
                                   ({"weight": weight, "bias": torch.zeros(2 * dim)},
                                    {"words": "2", "placeholder": "thing"}, "'thing'")):
        save_file(tensors, folder / MAP_FILE, metadata)
        with pytest.raises(ModelError, match=why):
            load(runner, folder / MAP_FILE)
    # a damaged file: refused when the model is listed, and by the loader itself
    (folder / MAP_FILE).write_bytes(b"\xff" * 64)
    with pytest.raises(ModelError, match="reference word map"):
        load(runner, folder / MAP_FILE)
    meta = json.loads((folder / "studio.json").read_text())
    outside = tmp_path / "outside.safetensors"
    save_file({"weight": weight, "bias": torch.zeros(2 * dim)}, outside, {"words": "2"})
    (folder / "link.safetensors").symlink_to(outside)
    for bad, why in ((meta["reference_words"], "not a valid safetensors file"),
                     ({"map": "../outside.safetensors", "placeholder": "object"}, "inside"),
                     ({"map": "link.safetensors", "placeholder": "object"}, "inside"),
                     ({"map": str(outside), "placeholder": "object"}, "inside"),
                     ({"map": "nope.safetensors", "placeholder": "object"}, "no such file"),
                     ({"map": "studio.json", "placeholder": "object"}, ".safetensors file"),
                     ({"map": MAP_FILE, "placeholder": "an object"}, "one word"),
                     ({"map": MAP_FILE}, "must be"), (None, "must be"), ({}, "must be")):
        (folder / "studio.json").write_text(json.dumps({**meta, "reference_words": bad}))
        entry = next(e for e in ModelRegistry([tmp_path], include_hf_cache=False).list()
                     if e.path == folder)
        assert "reference_words" in entry.error and why in entry.error, (bad, entry.error)
        assert not entry.usable
    no_tokens = {k: v for k, v in meta.items() if k != "reference_tokens"}
    (folder / "studio.json").write_text(json.dumps(no_tokens))
    entry = next(e for e in ModelRegistry([tmp_path], include_hf_cache=False).list()
                 if e.path == folder)
    assert "needs reference_tokens" in entry.error
    with pytest.raises(ValueError, match="reference_tokens"):
        write_word_map(folder, weight, torch.zeros(2 * dim))
