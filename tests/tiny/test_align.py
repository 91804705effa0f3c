"""Stage ``align-reference``: the reference encoder alone, toward the object's word embeddings."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_model

from studio.tiny.align import ReferenceAlignTask, write_into_denoiser_checkpoint
from studio.tiny.train import DenoiserTask, build_vae
from studio.train.loop import TrainConfig, train


@pytest.fixture(scope="module")
def denoiser_task():
    torch.manual_seed(0)
    return DenoiserTask(torch.device("cpu"), build_vae(), image_batch=2, clip_batch=2)


def test_alignment_stage_trains_only_the_reference_encoder_and_can_be_scored(denoiser_task,
                                                                            tmp_path):
    for bad in ({"batch": 0}, {"warm": 0}, {"warm": 10, "max_pool": 5}):
        with pytest.raises(ValueError, match="each must be >= 1"):
            ReferenceAlignTask(denoiser_task, **bad)
    task = ReferenceAlignTask(denoiser_task, batch=16, warm=64, fresh=4, max_pool=72)
    assert list(task.modules()) == ["reference_encoder"]
    latents, objects = task.batch(np.random.default_rng(0))
    assert latents.shape == (16, 8, 1, 16, 16) and len(objects) == 16
    assert len(task.pool) == 68
    for i in range(3):
        task.batch(np.random.default_rng(i))
    assert len(task.pool) == 72  # grew to its cap, then replaced entries
    fixed = task.batch(np.random.default_rng(9))
    transformer = {k: v.clone() for k, v in denoiser_task.transformer.state_dict().items()}
    text = {k: v.clone() for k, v in denoiser_task.ema_text.state_dict().items()}

    def loss():
        with torch.no_grad():
            return task.loss(fixed, torch.Generator().manual_seed(0))[0].item()

    start = loss()
    score = task.evaluate(n=64)
    assert set(score) == {"error", "pair", "colour", "shape"}
    assert 0 <= score["pair"] <= min(score["colour"], score["shape"]) <= 1
    config = TrainConfig(lr=2e-3, warmup_steps=2, total_steps=60, seed=0, log_every=10,
                         checkpoint_every_s=1e9, weight_decay=0.0)
    train(task, tmp_path, config, max_steps=40)
    assert loss() < 0.6 * start
    assert task.evaluate(n=64)["error"] < score["error"]
    # the targets' encoder and the denoiser stay as they were
    assert all(torch.equal(v, denoiser_task.transformer.state_dict()[k])
               for k, v in transformer.items())
    assert all(torch.equal(v, denoiser_task.ema_text.state_dict()[k]) for k, v in text.items())


def test_aligned_weights_replace_both_reference_encoders_of_the_denoiser_checkpoint(
        denoiser_task, tmp_path):
    with pytest.raises(FileNotFoundError, match="no denoiser checkpoint"):
        write_into_denoiser_checkpoint(denoiser_task.reference_encoder, tmp_path)
    ckpt = tmp_path / "checkpoint"
    ckpt.mkdir()
    (ckpt / "state.json").write_text('{"step": 1}')
    other = type(denoiser_task.reference_encoder)(denoiser_task.reference_encoder.config)
    for name in ("reference_encoder", "ema_reference_encoder"):
        save_model(other, str(ckpt / f"{name}.safetensors"))
    write_into_denoiser_checkpoint(denoiser_task.reference_encoder, tmp_path)
    want = denoiser_task.reference_encoder.state_dict()
    for name in ("reference_encoder", "ema_reference_encoder"):
        got = load_file(str(ckpt / f"{name}.safetensors"))
        assert all(torch.equal(got[k], want[k]) for k in got)
    assert sorted(p.name for p in ckpt.iterdir()) == [
        "ema_reference_encoder.safetensors", "reference_encoder.safetensors", "state.json"]
