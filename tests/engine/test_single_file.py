"""Single-file denoiser checkpoints: a fine-tuned tiny Wan transformer saved in the original
Wan layout (as its authors and ComfyUI ship it) is found in a model folder, paired with the
diffusers folder of the same model, and renders what stock diffusers renders with those
weights; a file that fits no installed model is listed with the reason."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from studio.core.request import GenerationRequest
from studio.engine.executor import JobExecutor
from studio.engine.job import Job
from studio.engine.models.folders import ModelError
from studio.engine.models.registry import ModelRegistry


def to_original_wan(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """diffusers' Wan transformer keys -> the original Wan release's (the inverse of
    diffusers' ``convert_wan_transformer_to_diffusers`` for text-to-video models)."""
    renames = [("condition_embedder.time_embedder.linear_1", "time_embedding.0"),
               ("condition_embedder.time_embedder.linear_2", "time_embedding.2"),
               ("condition_embedder.text_embedder.linear_1", "text_embedding.0"),
               ("condition_embedder.text_embedder.linear_2", "text_embedding.2"),
               ("condition_embedder.time_proj", "time_projection.1"),
               (".attn1.", ".self_attn."), (".attn2.", ".cross_attn."),
               (".to_out.0.", ".o."), (".to_q.", ".q."), (".to_k.", ".k."), (".to_v.", ".v."),
               ("ffn.net.0.proj", "ffn.0"), ("ffn.net.2", "ffn.2"),
               (".scale_shift_table", ".modulation"),
               (".norm2.", ".norm__swap."), (".norm3.", ".norm2."), (".norm__swap.", ".norm3.")]
    out = {}
    for key, value in state.items():
        if key == "scale_shift_table":
            key = "head.modulation"
        elif key.startswith("proj_out."):
            key = "head.head." + key[len("proj_out."):]
        for old, new in renames:
            key = key.replace(old, new)
        out["model.diffusion_model." + key] = value.contiguous()
    return out


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_models):
    import shutil

    from diffusers import WanTransformer3DModel
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    root = tmp_path_factory.mktemp("single-file")
    base = shutil.copytree(tiny_models["wan-t2v"], root / "wan-base")
    config = WanTransformer3DModel.load_config(str(base), subfolder="transformer")
    torch.manual_seed(11)
    tuned = WanTransformer3DModel.from_config(config).eval()  # "fine-tuned" weights
    state = tuned.state_dict()
    original = to_original_wan(state)
    # our inverse is exact: diffusers' converter gives back every name and tensor
    back = convert_wan_transformer_to_diffusers(dict(original))
    assert set(back) == set(state)
    assert all(torch.equal(back[k], state[k]) for k in state)
    assert not any(re.search(r"(attn1|to_q|scale_shift_table)", k) for k in original)
    save_file(original, str(root / "wan-finetune.safetensors"))
    save_file({"weight": torch.zeros(3, 3)}, str(root / "stray.safetensors"))
    return root, base, tuned


def test_the_file_is_found_and_paired_with_its_base(setup):
    root, base, _ = setup
    registry = ModelRegistry([root], include_hf_cache=False)
    entries = {e.model_id: e for e in registry.list()}
    entry = entries[str(root / "wan-finetune.safetensors")]
    assert not entry.error and entry.family == "wan" and entry.source == "single-file"
    assert entry.path == base and entry.denoiser_subfolder == "transformer"
    assert entry.description == f"wan-finetune.safetensors on {base}"
    stray = entries[str(root / "stray.safetensors")]
    assert "none of the" in stray.error and "has a denoiser of this file's layout" in stray.error
    assert registry.content_hash(entry) != registry.content_hash(entries[str(base)])
    with pytest.raises(ModelError, match="stray.safetensors: a single-file denoiser runs on"):
        registry.resolve(str(root / "stray.safetensors"))


def test_it_renders_what_stock_diffusers_renders_with_those_weights(setup):
    import diffusers

    root, base, tuned = setup
    request = GenerationRequest(mode="t2v", model=str(root / "wan-finetune.safetensors"),
                                prompt="a red circle", seed=3, steps=3, guidance_scale=4.0,
                                width=32, height=32, num_frames=5)
    executor = JobExecutor(ModelRegistry([root], include_hf_cache=False), torch.device("cpu"))
    req, entry = executor.prepare(Job("j", request))
    runner, _ = executor.runner_for(entry)
    with torch.inference_mode():
        ours = runner.run(req, {}, lambda *a: None).frames
    pipe = diffusers.WanPipeline.from_pretrained(str(base), transformer=tuned,
                                                 local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    with torch.inference_mode():
        stock = pipe("a red circle", num_inference_steps=3, height=32, width=32, num_frames=5,
                     guidance_scale=4.0, generator=torch.Generator().manual_seed(3),
                     output_type="np").frames[0]
    assert np.abs(ours - stock).max() <= 1e-5
    # the base folder is a different model: loaded apart, different pixels
    base_entry = executor.registry.resolve(str(base))
    base_runner, _ = executor.runner_for(base_entry)
    assert base_runner is not runner
    done = executor.execute(Job("k", request), lambda e: None, lambda: False)
    assert done.frames.shape == (5, 32, 32, 3)
