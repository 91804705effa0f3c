"""Parallel configs and CFG parallelism on 2 CPU ranks (gloo): the parallel run gives the
single-process pixels, with and without the step cache, and each rank computes only its
share."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from studio.engine.parallel import ParallelConfig, ParallelConfigError
from studio.engine.parallel.launch import run_ranks


def test_config_validation_names_the_rule():
    ParallelConfig(ulysses_degree=2, cfg_degree=2).validate(devices=4, heads=8,
                                                            sequence_length=64)
    cases = [
        (ParallelConfig(ulysses_degree=0), {}, "ulysses_degree: 0 must be an integer >= 1"),
        (ParallelConfig(cfg_degree=3), {}, "cfg_degree: 3 must be 1 or 2"),
        (ParallelConfig(cfg_degree=2), {"uses_cfg": False}, "needs a job with classifier"),
        (ParallelConfig(ulysses_degree=2, replicas=3), {}, "= 6 ranks, but only 4 device"),
        (ParallelConfig(ulysses_degree=4), {"heads": 6}, "does not divide the model's 6"),
        (ParallelConfig(ring_degree=4), {"sequence_length": 30}, "sequence of 30 tokens"),
    ]
    for config, kwargs, message in cases:
        with pytest.raises(ParallelConfigError, match=message):
            config.validate(devices=4, **kwargs)


def _pipeline(kind, folder):
    import diffusers

    cls = diffusers.WanPipeline if kind == "wan" else diffusers.StableDiffusionPipeline
    extra = {} if kind == "wan" else dict(safety_checker=None, requires_safety_checker=False)
    pipe = cls.from_pretrained(folder, local_files_only=True, **extra)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _generate(pipe, kind):
    kwargs = dict(num_frames=5) if kind == "wan" else {}
    out = pipe("a red circle", num_inference_steps=6, height=32, width=32, guidance_scale=4.0,
               generator=torch.Generator().manual_seed(3), output_type="np", **kwargs)
    return np.asarray(out.frames if kind == "wan" else out.images)


def _rank(rank, world, kind, folder):
    """On each rank: the job without, then with the step cache, under CFG parallel."""
    from studio.engine.caching import StepCacheConfig, apply_step_cache
    from studio.engine.caching.unet_cache import apply_unet_cache
    from studio.engine.parallel.cfg import apply_cfg_parallel, remove_cfg_parallel

    pipe = _pipeline(kind, folder)
    denoiser = pipe.transformer if kind == "wan" else pipe.unet
    out = []
    for cache in (False, True):
        if cache:
            remove_cfg_parallel(denoiser)
            config = StepCacheConfig(threshold=10.0, warmup_steps=2, max_consecutive_skips=1)
            (apply_step_cache if kind == "wan" else apply_unet_cache)(denoiser, config)
        hook = apply_cfg_parallel(denoiser)  # outermost
        with torch.inference_mode():
            out.append((_generate(pipe, kind), hook.computed))
    return out


@pytest.fixture(scope="module")
def sd15(tmp_path_factory):
    from studio.testing.tiny_pipelines import build_tiny_sd

    return build_tiny_sd(tmp_path_factory.mktemp("sd-par") / "sd15", variant="sd15")


@pytest.mark.parametrize("kind", ["wan", "sd"])
def test_cfg_parallel_on_two_ranks_matches_one_process(tiny_models, sd15, kind):
    from studio.engine.caching import StepCacheConfig, apply_step_cache
    from studio.engine.caching.unet_cache import apply_unet_cache

    folder = str(tiny_models["wan-t2v"] if kind == "wan" else sd15)
    pipe = _pipeline(kind, folder)
    with torch.inference_mode():
        single = _generate(pipe, kind)
    denoiser = pipe.transformer if kind == "wan" else pipe.unet
    config = StepCacheConfig(threshold=10.0, warmup_steps=2, max_consecutive_skips=1)
    (apply_step_cache if kind == "wan" else apply_unet_cache)(denoiser, config)
    with torch.inference_mode():
        single_cached = _generate(pipe, kind)
    results = run_ranks(_rank, 2, kind, folder, timeout_s=60)
    for variant, want in enumerate((single, single_cached)):
        for rank_results in results:
            frames, _ = rank_results[variant]
            assert np.abs(frames - want).max() <= 1e-5
        computed = [r[variant][1] for r in results]
        if kind == "wan":  # rank 0 every cond call, rank 1 every uncond call + the first cond
            assert computed == [6, 7]
        else:  # batched CFG: each rank computes its half of every call
            assert computed == [6, 6]


def _generate_any(pipe, kind):
    kwargs = dict(num_frames=5, guidance_scale=4.0) if kind == "wan" else {}
    out = pipe("a red circle", num_inference_steps=3, height=32, width=32,
               generator=torch.Generator().manual_seed(0), output_type="np", **kwargs)
    return np.asarray(out.frames if kind == "wan" else out.images)


CACHE = dict(threshold=0.3, order=1, warmup_steps=1, max_consecutive_skips=2)


def _ulysses_rank(rank, world, folders):
    import diffusers

    from studio.engine.caching import StepCacheConfig, apply_step_cache
    from studio.engine.parallel.sequence import apply_sequence_parallel

    out = {}
    for kind, folder in folders.items():
        cls = diffusers.WanPipeline if kind == "wan" else diffusers.FluxPipeline
        pipe = cls.from_pretrained(folder, local_files_only=True)
        pipe.set_progress_bar_config(disable=True)
        apply_sequence_parallel(pipe.transformer, ParallelConfig(ulysses_degree=2))
        with torch.inference_mode():
            out[kind] = _generate_any(pipe, kind)
            stats = apply_step_cache(pipe.transformer, StepCacheConfig(**CACHE))
            out[kind + "-cached"] = _generate_any(pipe, kind)
            out[kind + "-decisions"] = [d[3] for d in stats.decisions]
    return out


def test_ulysses_on_two_ranks_matches_one_process(tiny_models):
    import diffusers

    from studio.engine.caching import StepCacheConfig, apply_step_cache

    folders = {"wan": str(tiny_models["wan-t2v"]), "flux": str(tiny_models["flux"])}
    want = {}
    for kind, folder in folders.items():
        cls = diffusers.WanPipeline if kind == "wan" else diffusers.FluxPipeline
        pipe = cls.from_pretrained(folder, local_files_only=True)
        pipe.set_progress_bar_config(disable=True)
        with torch.inference_mode():
            want[kind] = _generate_any(pipe, kind)
            stats = apply_step_cache(pipe.transformer, StepCacheConfig(**CACHE))
            want[kind + "-cached"] = _generate_any(pipe, kind)
            want[kind + "-decisions"] = [d[3] for d in stats.decisions]
    results = run_ranks(_ulysses_rank, 2, folders, timeout_s=60)
    for result in results:
        for kind in folders:
            assert np.abs(result[kind] - want[kind]).max() <= 1e-5
            # parallel + cache = cache alone: the same decisions on every rank
            assert result[kind + "-decisions"] == want[kind + "-decisions"]
            assert np.abs(result[kind + "-cached"] - want[kind + "-cached"]).max() <= 1e-5


def test_sequence_parallel_refuses_models_without_a_plan_or_bad_heads():
    from diffusers import UNet2DConditionModel

    from studio.engine.parallel.sequence import apply_sequence_parallel

    unet = UNet2DConditionModel(block_out_channels=(8, 16), layers_per_block=1, sample_size=8,
                                norm_num_groups=4, cross_attention_dim=8,
                                down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                                up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"))
    with pytest.raises(ParallelConfigError, match="has no context-parallel plan"):
        apply_sequence_parallel(unet, ParallelConfig(ulysses_degree=2))


def _tiny_tiling_vae():
    from studio.tiny.train import build_vae

    torch.manual_seed(0)
    vae = build_vae().eval()
    vae.enable_tiling(tile_sample_min_height=32, tile_sample_min_width=32,
                      tile_sample_stride_height=24, tile_sample_stride_width=24)
    return vae


def _vae_rank(rank, world, z):
    from studio.engine.parallel.vae import parallel_tiled_decode

    with torch.inference_mode():
        return parallel_tiled_decode(_tiny_tiling_vae(), z)


def test_patch_parallel_vae_decode_matches_the_tiled_decode():
    z = torch.randn(1, 8, 3, 24, 20, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        want = _tiny_tiling_vae().tiled_decode(z, return_dict=False)[0]
    results = run_ranks(_vae_rank, 2, z, timeout_s=60)
    tiles = [owned for _, owned in results]
    assert sum(tiles) == 16 and tiles == [8, 8]  # a 4 x 4 grid of tiles, half each
    for video, _ in results:
        assert video.shape == want.shape
        torch.testing.assert_close(video, want, atol=1e-5, rtol=1e-5)
