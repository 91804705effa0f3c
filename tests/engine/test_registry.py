"""The model registry: embedded, folders, HF cache layout; clear errors for bad folders."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from studio.engine.models.folders import ModelError
from studio.engine.models.registry import EMBEDDED_ID, ModelRegistry


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_embedded_model_is_listed_and_resolves():
    reg = ModelRegistry(include_hf_cache=False)
    entry = reg.resolve(EMBEDDED_ID)
    assert entry.usable and entry.family == "wan" and entry.source == "embedded"
    assert {"t2i", "t2v"} <= entry.capabilities.modes
    assert entry.size_bytes > 0 and entry.dtype
    assert EMBEDDED_ID in [e.model_id for e in reg.list()]
    h = reg.content_hash(entry)
    assert len(h) == 32 and h == ModelRegistry(include_hf_cache=False).content_hash(entry)


def test_families_and_modes(tiny_models):
    reg = ModelRegistry(include_hf_cache=False)
    modes = {name: reg.resolve(str(p)).capabilities.modes for name, p in tiny_models.items()}
    assert modes["wan-t2v"] == {"t2i", "t2v", "i2i"}
    assert modes["wan-ti2v"] == {"t2i", "t2v", "i2i", "i2v"}
    assert modes["wan-i2v"] == {"i2v"}
    assert modes["flux"] == {"t2i", "i2i"}
    wan = reg.resolve(str(tiny_models["wan-t2v"])).capabilities
    assert wan.spatial_multiple == 16 and wan.frame_multiple == 4


def test_wan22_ti2v_as_published_offers_image_to_video(tiny_models, tmp_path):
    """Wan-AI/Wan2.2-TI2V-5B-Diffusers names WanPipeline with expand_timesteps (not the
    image-to-video class): it does image-to-video all the same, at 24 fps, 121 frames and
    1280 x 704 by default when full size."""
    folder = copy(tiny_models["wan-ti2v"], tmp_path / "ti2v")
    index = json.loads((folder / "model_index.json").read_text())
    index["_class_name"] = "WanPipeline"
    (folder / "model_index.json").write_text(json.dumps(index))
    caps = ModelRegistry(include_hf_cache=False).resolve(str(folder)).capabilities
    assert caps.modes == {"t2i", "t2v", "i2i", "i2v"}
    config = json.loads((folder / "transformer" / "config.json").read_text())
    (folder / "transformer" / "config.json").write_text(json.dumps(config | {"num_layers": 30}))
    big = ModelRegistry(include_hf_cache=False).resolve(str(folder)).capabilities
    assert (big.default_fps, big.default_frames, big.default_width, big.default_height) == \
        (24.0, 121, 1280, 704)


def test_a_model_folder_given_itself_lists_no_single_files(tiny_models, tmp_path):
    """A model folder named directly in the settings: its top-level .safetensors (FLUX.1-dev
    ships flux1-dev.safetensors and ae.safetensors there) are the model's own copies, not
    single-file models to list beside it."""
    folder = copy(tiny_models["flux"], tmp_path / "FLUX.1-dev")
    weights = folder / "transformer" / "diffusion_pytorch_model.safetensors"
    shutil.copy(weights, folder / "flux1-dev.safetensors")
    ids = [e.model_id for e in ModelRegistry([folder], include_hf_cache=False).list()]
    assert str(folder) in ids
    assert not any("flux1-dev" in i for i in ids), ids


def test_model_folders_and_hf_cache_layout(tiny_models, tmp_path, monkeypatch):
    folder = tmp_path / "models"
    copy(tiny_models["flux"], folder / "my-flux")
    hub = tmp_path / "hub"
    repo = hub / "models--acme--tiny-wan"
    copy(tiny_models["wan-t2v"], repo / "snapshots" / "abc123")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    reg = ModelRegistry([folder])
    ids = {e.model_id: e for e in reg.list()}
    assert ids["acme/tiny-wan"].usable and ids["acme/tiny-wan"].source == "hf-cache"
    assert ids[str(folder / "my-flux")].family == "flux"
    assert reg.resolve("acme/tiny-wan").family == "wan"
    assert reg.resolve("my-flux").family == "flux"


def break_file(folder: Path, how: str) -> str:
    weights = folder / "transformer" / "diffusion_pytorch_model.safetensors"
    if how == "missing-index":
        (folder / "model_index.json").unlink()
        return "model_index.json"
    if how == "bad-index":
        (folder / "model_index.json").write_text("{not json")
        return "model_index.json"
    if how == "missing-component":
        shutil.rmtree(folder / "vae")
        return "vae"
    if how == "missing-config":
        (folder / "transformer" / "config.json").unlink()
        return "config.json"
    if how == "missing-weights":
        weights.unlink()
        return "transformer"
    if how == "truncated-weights":
        data = weights.read_bytes()
        weights.write_bytes(data[: len(data) // 2])
        return "diffusion_pytorch_model.safetensors"
    if how == "garbage-weights":
        weights.write_bytes(b"\x00" * 100)
        return "diffusion_pytorch_model.safetensors"
    if how in ("shard-outside", "shard-fifo"):  # a crafted or damaged shard index
        import json
        import os

        name = "../../../outside.safetensors" if how == "shard-outside" else "pipe.safetensors"
        if how == "shard-fifo":
            os.mkfifo(weights.parent / name)  # read by the scan, it would hang forever
        index = {"metadata": {}, "weight_map": {"x": name}}
        (weights.parent / "diffusion_pytorch_model.safetensors.index.json").write_text(
            json.dumps(index))
        return "outside.safetensors" if how == "shard-outside" else "pipe.safetensors"
    if how == "component-outside":
        import json

        index = json.loads((folder / "model_index.json").read_text())
        index["../vae"] = index.pop("vae")
        (folder / "model_index.json").write_text(json.dumps(index))
        return "'../vae' is not a plain name"
    if how == "pickle-weights":
        weights.unlink()
        (weights.parent / "diffusion_pytorch_model.bin").write_bytes(b"x")
        return "pickle"
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["missing-index", "bad-index", "missing-component",
                                 "missing-config", "missing-weights", "truncated-weights",
                                 "garbage-weights", "pickle-weights", "shard-outside",
                                 "shard-fifo", "component-outside"])
def test_broken_folders_give_clear_errors(tiny_models, tmp_path, how):
    folder = copy(tiny_models["wan-t2v"], tmp_path / "broken")
    needle = break_file(folder, how)
    reg = ModelRegistry([tmp_path], include_hf_cache=False)
    with pytest.raises(ModelError) as info:
        reg.resolve(str(folder))
    assert needle in str(info.value) and isinstance(info.value, ValueError)
    # listing never stops at a bad folder
    copy(tiny_models["flux"], tmp_path / "good")
    listed = {e.path.name: e for e in reg.list()}
    assert listed["broken"].error and listed["good"].usable


def test_unknown_model_and_unsupported_family(tiny_models, tmp_path):
    reg = ModelRegistry(include_hf_cache=False)
    with pytest.raises(ModelError, match="nothing is downloaded"):
        reg.resolve("nobody/nothing")
    folder = copy(tiny_models["flux"], tmp_path / "other")
    index = json.loads((folder / "model_index.json").read_text())
    index["_class_name"] = "StableCascadePipeline"
    (folder / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(ModelError, match="not supported"):
        reg.resolve(str(folder))


def test_studio_json_overrides_defaults(tiny_models, tmp_path):
    folder = copy(tiny_models["wan-t2v"], tmp_path / "m")
    (folder / "studio.json").write_text(json.dumps(
        {"capabilities": {"default_width": 96, "modes": ["t2v", "t2i", "r2v"]}}))
    caps = ModelRegistry(include_hf_cache=False).resolve(str(folder)).capabilities
    assert caps.default_width == 96 and caps.modes == {"t2v", "t2i"}  # cannot add modes


def test_a_bad_studio_json_lists_its_model_as_unusable_and_the_scan_goes_on(tiny_models,
                                                                           tmp_path):
    """A studio.json that is not JSON (or not an object) made `studio models` fail whole
    with an internal error; now that one model is listed with the reason."""
    copy(tiny_models["flux"], tmp_path / "good")
    for name, text in (("notjson", "not json"), ("list", "[1, 2]")):
        bad = copy(tiny_models["wan-t2v"], tmp_path / name)
        (bad / "studio.json").write_text(text)
    reg = ModelRegistry([tmp_path], include_hf_cache=False)
    listed = {e.path.name: e for e in reg.list()}
    assert listed["good"].usable
    assert "studio.json is not readable JSON" in listed["notjson"].error
    assert "studio.json is not a JSON object" in listed["list"].error
    with pytest.raises(ModelError, match="not readable JSON"):
        reg.resolve(str(tmp_path / "notjson"))


def test_a_studio_json_attention_tuning_is_checked_when_the_model_is_listed(tiny_models,
                                                                            tmp_path):
    """A bad ``attention`` tuning would fail each job of the profile on a GPU; the model is
    listed unusable with the reason instead."""
    cases = {"kernel": ({"fast": "xformers"}, "attention: fast: kernel: 'xformers'"),
             "profile": ({"turbo": "sage"}, "attention: 'turbo' is not quality"),
             "option": ({"fast": "sparse,below=2000"}, "attention: fast: below: 2000.0"),
             "shape": (["sage"], "attention: must be an object")}
    for name, (value, _) in cases.items():
        folder = copy(tiny_models["wan-t2v"], tmp_path / name)
        (folder / "studio.json").write_text(json.dumps({"attention": value}))
    good = copy(tiny_models["wan-t2v"], tmp_path / "good")
    (good / "studio.json").write_text(json.dumps({"attention": {"fast": "sparse,below=450"}}))
    listed = {e.path.name: e for e in ModelRegistry([tmp_path], include_hf_cache=False).list()}
    for name, (_, words) in cases.items():
        assert words in listed[name].error, (name, listed[name].error)
    assert listed["good"].usable and listed["good"].tuning["attention"]["fast"] == \
        "sparse,below=450"


def test_a_config_asking_for_weights_the_files_lack_is_named_at_load(tiny_models, tmp_path):
    """One more layer in config.json than in the weights: diffusers leaves it on the meta
    device and the first .to() fails deep in torch; we name the part and the missing keys."""
    import torch
    from diffusers import DiffusionPipeline

    from studio.engine.pipelines.base import load_pipeline

    folder = copy(tiny_models["wan-t2v"], tmp_path / "mismatch")
    config_path = folder / "transformer" / "config.json"
    config = json.loads(config_path.read_text())
    config["num_layers"] += 1
    config_path.write_text(json.dumps(config))
    entry = ModelRegistry([tmp_path], include_hf_cache=False).resolve(str(folder))
    with pytest.raises(ModelError, match="transformer in .* does not match its config") as info:
        load_pipeline(DiffusionPipeline, entry, torch.float32)
    assert f"blocks.{config['num_layers'] - 1}." in str(info.value)


def test_a_lora_file_in_a_model_folder_is_named_as_one(tmp_path):
    """A LoRA's .safetensors (PEFT's lora_A/lora_B or kohya's lora_down/lora_up keys) is not
    a denoiser: its entry says it is a LoRA and that LoRAs are not supported yet, instead of
    finding no model of its layout."""
    import torch
    from safetensors.torch import save_file

    folder = tmp_path / "models"
    folder.mkdir()
    save_file({"transformer.blocks.0.attn1.to_q.lora_A.weight": torch.zeros(4, 16),
               "transformer.blocks.0.attn1.to_q.lora_B.weight": torch.zeros(16, 4)},
              str(folder / "style.safetensors"))
    save_file({"lora_unet_down_blocks_0_attn1_to_q.lora_down.weight": torch.zeros(4, 16),
               "lora_unet_down_blocks_0_attn1_to_q.lora_up.weight": torch.zeros(16, 4),
               "lora_unet_down_blocks_0_attn1_to_q.alpha": torch.tensor(4.0)},
              str(folder / "kohya.safetensors"))
    entries = {Path(e.model_id).name: e for e in
               ModelRegistry([folder], include_hf_cache=False).list()}
    for name in ("style.safetensors", "kohya.safetensors"):
        assert not entries[name].usable
        assert entries[name].error.startswith("a LoRA (2 adapter weights), not a model: "
                                              "LoRAs are not supported yet"), entries[name].error


def test_a_folder_saved_as_the_fp16_variant_loads_it(tiny_models, tmp_path):
    """A folder downloaded with variant="fp16" holds only *.fp16.safetensors: it is listed,
    loaded with that variant, and renders; beside plain files, the variant copy counts in
    neither the size nor the hash (diffusers loads the plain ones)."""
    import torch

    from studio.engine.executor import runner_class

    reg = ModelRegistry(include_hf_cache=False)
    folder = copy(tiny_models["flux"], tmp_path / "flux-fp16")
    plain = reg.resolve(str(folder))
    weights = folder / "transformer" / "diffusion_pytorch_model.safetensors"
    shutil.copy(weights, weights.with_name("diffusion_pytorch_model.fp16.safetensors"))
    both = ModelRegistry(include_hf_cache=False).resolve(str(folder))
    assert both.variant is None and both.size_bytes == plain.size_bytes
    assert reg.content_hash(both) == reg.content_hash(plain)
    weights.unlink()  # only the variant left
    entry = ModelRegistry(include_hf_cache=False).resolve(str(folder))
    assert entry.usable and entry.variant == "fp16", entry.error
    runner = runner_class(entry.family)(entry, torch.device("cpu"), torch.float32)
    assert runner.base.transformer is not None


def test_folders_without_any_model_file_are_not_listed_as_models(tiny_models, tmp_path):
    """A model folder in Settings may sit beside pictures: a sub-folder holding no index,
    config or weights is not a model (before, each was listed as an unusable one in the
    model picker); a model that lost its index still is, with the reason."""
    (tmp_path / "holiday photos").mkdir()
    (tmp_path / "holiday photos" / "beach.jpg").write_bytes(b"\xff\xd8\xff")
    (tmp_path / "holiday photos" / "2025").mkdir()
    (tmp_path / "empty").mkdir()
    copy(tiny_models["flux"], tmp_path / "good")
    broken = copy(tiny_models["wan-t2v"], tmp_path / "broken")
    (broken / "model_index.json").unlink()
    listed = {e.path.name: e for e in ModelRegistry([tmp_path], include_hf_cache=False).list()
              if e.source == "folder"}
    assert sorted(listed) == ["broken", "good"]
    assert listed["good"].usable and "model_index.json" in listed["broken"].error


def test_a_link_loop_in_a_broken_model_folder_does_not_hang_the_scan(tiny_models, tmp_path):
    """Sizing a folder that fails its check walked linked folders: a link to ``/`` or ``..``
    inside it kept the scan (and the studio's exit) going for ever."""
    import os

    broken = copy(tiny_models["flux"], tmp_path / "m")
    for weights in (broken / "transformer").glob("*.safetensors"):
        weights.unlink()
    os.symlink("/", broken / "rootlink")
    for i in range(3):
        os.symlink("..", broken / "vae" / f"up{i}")
    [entry] = [e for e in ModelRegistry([tmp_path], include_hf_cache=False).list()
               if e.source == "folder"]
    assert entry.error and entry.size_bytes < 10 * 2**20


@pytest.mark.parametrize("capabilities,needle", [
    ({"modes": ["t2v"]}, "modes: none of the modes given"),
    ({"modes": "t2i"}, "must be a list of mode names"),
    ({"max_steps": "ten"}, "max_steps='ten' must be a whole number"),
    ({"spatial_multiple": 0}, "spatial_multiple=0 must be at least 1"),
    ({"guidance_range": [5, 1]}, "guidance_range=[5, 1] must be [low, high]"),
    ({"min_size": 128, "max_size": 64}, "min_size=128 is above max_size=64"),
    ({"default_steps": 500}, "default_steps=500 must be in [1, 200]"),
    ({"foo": 1}, "unexpected keyword argument 'foo'"),
])
def test_bad_capabilities_in_studio_json_make_the_model_unusable(tiny_models, tmp_path,
                                                                  capabilities, needle):
    """Values the settings panel and the CLI cannot work with are refused when the model is
    listed, naming the field (before, the model was listed usable: picking it failed the
    panel's handler half-way and left the panel stuck for every model, and the CLI said
    "internal error")."""
    folder = copy(tiny_models["flux"], tmp_path / "m")
    (folder / "studio.json").write_text(json.dumps({"capabilities": capabilities}))
    [entry] = [e for e in ModelRegistry([tmp_path], include_hf_cache=False).list()
               if e.source == "folder"]
    assert not entry.usable and needle in entry.error and "studio.json" in entry.error
