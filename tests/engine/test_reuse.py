"""Text embeddings are reused across jobs: a variant with only the seed changed skips the
text encoder (visible in the finished timings) and still gives the stock pixels."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from studio.core.request import GenerationRequest
from studio.engine.executor import runner_class
from studio.engine.models.registry import ModelRegistry


def runner_for(folder):
    entry = ModelRegistry(include_hf_cache=False).resolve(str(folder))
    return runner_class(entry.family)(entry, torch.device("cpu"), torch.float32)


@pytest.mark.parametrize("model,fields", [("wan-t2v", dict(mode="t2v", num_frames=5)),
                                          ("flux", dict(mode="t2i"))])
def test_seed_variant_skips_the_text_encoder(tiny_models, model, fields):
    folder = tiny_models[model]
    runner = runner_for(folder)
    encoders = [m for m in (getattr(runner.base, "text_encoder", None),
                            getattr(runner.base, "text_encoder_2", None)) if m is not None]
    calls = [0]
    for enc in encoders:
        enc.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))

    def request(seed, prompt="a red circle on grass"):
        return GenerationRequest(model=str(folder), prompt=prompt, negative_prompt="blurry",
                                 seed=seed, steps=2, guidance_scale=4.0, width=32, height=32,
                                 **fields)

    first = runner.run(request(1), {}, lambda *a: None)
    assert calls[0] > 0 and first.timings["text_encode"] > 0
    calls[0] = 0
    second = runner.run(request(2), {}, lambda *a: None)
    assert calls[0] == 0 and second.timings["text_encode"] == 0.0
    assert any("text embeddings reused" in n for n in second.notes)
    fresh = runner_for(folder).run(request(2), {}, lambda *a: None)
    np.testing.assert_array_equal(second.frames, fresh.frames)
    third = runner.run(request(2, prompt="a blue square"), {}, lambda *a: None)
    assert calls[0] > 0 and third.timings["text_encode"] > 0
    assert not np.array_equal(third.frames, second.frames)
