"""Parallel plans on one long-lived group of 2 CPU ranks (gloo): CFG parallel, Ulysses,
ring and the patch-parallel VAE decode give the single-process pixels, with and without the
step cache, and each rank computes and sends only its share."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from studio.engine.parallel import ParallelConfig, ParallelConfigError
from studio.engine.parallel.launch import RankGroup


@pytest.fixture(scope="module")
def ranks():
    """One long-lived group of 2 gloo ranks for the whole module."""
    with RankGroup(2, timeout_s=60) as group:
        yield group


def test_config_validation_names_the_rule():
    ParallelConfig(ulysses_degree=2, cfg_degree=2).validate(devices=4, heads=8,
                                                            sequence_length=64)
    cases = [
        (ParallelConfig(ulysses_degree=0), {}, "ulysses_degree: 0 must be an integer >= 1"),
        (ParallelConfig(cfg_degree=3), {}, "cfg_degree: 3 must be 1 or 2"),
        (ParallelConfig(cfg_degree=2), {"uses_cfg": False}, "needs a job with classifier"),
        (ParallelConfig(ulysses_degree=2, replicas=3), {}, "= 6 ranks, but only 4 device"),
        (ParallelConfig(ulysses_degree=2, ring_degree=2), {"heads": 3},
         "does not divide the model's 3 attention heads .uneven heads are padded under "
         "Ulysses alone"),
        (ParallelConfig(ring_degree=4), {"sequence_length": 30}, "sequence of 30 tokens"),
        (ParallelConfig(ulysses_degree=True), {}, "ulysses_degree: True must be an integer"),
        (ParallelConfig(ring_degree=2), {"heads": 0}, "heads: 0 must be an integer >= 1"),
        (ParallelConfig(ring_degree=2), {"sequence_length": 0}, "sequence_length: 0 must"),
    ]
    for config, kwargs, message in cases:
        with pytest.raises(ParallelConfigError, match=message):
            config.validate(devices=4, **kwargs)
    ParallelConfig(ulysses_degree=4).validate(devices=4, heads=6)  # padded to 8 heads
    ParallelConfig().validate(devices=0)  # one device: nothing to split, always fine
    with pytest.raises(ParallelConfigError, match="devices: -1 must be an integer >= 0"):
        ParallelConfig().validate(devices=-1)


def _pipeline(kind, folder):
    import diffusers

    cls = {"wan": diffusers.WanPipeline, "flux": diffusers.FluxPipeline,
           "sd": diffusers.StableDiffusionPipeline}[kind]
    extra = dict(safety_checker=None, requires_safety_checker=False) if kind == "sd" else {}
    pipe = cls.from_pretrained(folder, local_files_only=True, **extra)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _generate(pipe, kind):
    kwargs = {"wan": dict(num_frames=5, guidance_scale=4.0), "sd": dict(guidance_scale=4.0),
              # FLUX.1's true CFG: a negative prompt and true_cfg_scale, one call per branch
              "flux": dict(negative_prompt="blurry", true_cfg_scale=4.0)}[kind]
    out = pipe("a red circle", num_inference_steps=6, height=32, width=32,
               generator=torch.Generator().manual_seed(3), output_type="np", **kwargs)
    return np.asarray(out.frames if kind == "wan" else out.images)


def _rank(rank, world, kind, folder):
    """On each rank: the job without, then with the step cache, under CFG parallel."""
    from studio.engine.caching import StepCacheConfig, apply_step_cache
    from studio.engine.caching.unet_cache import apply_unet_cache
    from studio.engine.parallel.cfg import apply_cfg_parallel, remove_cfg_parallel

    pipe = _pipeline(kind, folder)
    denoiser = pipe.unet if kind == "sd" else pipe.transformer
    out = []
    for cache in (False, True):
        if cache:
            remove_cfg_parallel(denoiser)
            config = StepCacheConfig(threshold=10.0, warmup_steps=2, max_consecutive_skips=1)
            (apply_unet_cache if kind == "sd" else apply_step_cache)(denoiser, config)
        hook = apply_cfg_parallel(denoiser)  # outermost
        with torch.inference_mode():
            out.append((_generate(pipe, kind), hook.computed))
    return out


@pytest.fixture(scope="module")
def sd15(tmp_path_factory):
    from studio.testing.tiny_pipelines import build_tiny_sd

    return build_tiny_sd(tmp_path_factory.mktemp("sd-par") / "sd15", variant="sd15")


@pytest.mark.parametrize("kind", ["wan", "sd", "flux"])
def test_cfg_parallel_on_two_ranks_matches_one_process(ranks, tiny_models, sd15, kind):
    from studio.engine.caching import StepCacheConfig, apply_step_cache
    from studio.engine.caching.unet_cache import apply_unet_cache

    folder = str({"wan": tiny_models["wan-t2v"], "flux": tiny_models["flux"], "sd": sd15}[kind])
    pipe = _pipeline(kind, folder)
    with torch.inference_mode():
        single = _generate(pipe, kind)
    denoiser = pipe.unet if kind == "sd" else pipe.transformer
    config = StepCacheConfig(threshold=10.0, warmup_steps=2, max_consecutive_skips=1)
    (apply_unet_cache if kind == "sd" else apply_step_cache)(denoiser, config)
    with torch.inference_mode():
        single_cached = _generate(pipe, kind)
    results = ranks.run(_rank, kind, folder)
    for variant, want in enumerate((single, single_cached)):
        for rank_results in results:
            frames, _ = rank_results[variant]
            assert np.abs(frames - want).max() <= 1e-5
        computed = [r[variant][1] for r in results]
        if kind != "sd":  # rank 0 every cond call, rank 1 every uncond call + the first cond
            assert computed == [6, 7]
        else:  # batched CFG: each rank computes its half of every call
            assert computed == [6, 6]


def _generate_any(pipe, kind):
    kwargs = dict(num_frames=5, guidance_scale=4.0) if kind == "wan" else {}
    out = pipe("a red circle", num_inference_steps=3, height=32, width=32,
               generator=torch.Generator().manual_seed(0), output_type="np", **kwargs)
    return np.asarray(out.frames if kind == "wan" else out.images)


CACHE = dict(threshold=0.3, order=1, warmup_steps=1, max_consecutive_skips=2)


def _load(kind, folder):
    import diffusers

    cls = diffusers.WanPipeline if kind == "wan" else diffusers.FluxPipeline
    pipe = cls.from_pretrained(folder, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _recorder(shapes: list):
    """A forward pre-hook recording the shape of the module's first input."""
    def hook(module, args, kwargs):
        shapes.append(tuple((args[0] if args else kwargs["hidden_states"]).shape))
    return hook


def _sequence_rank(rank, world, folders, degrees):
    """On each rank: the job under the sequence plan without, then with, the step cache;
    what the first block saw (the shard) and what the rank sent."""
    from studio.engine.caching import StepCacheConfig, apply_step_cache
    from studio.engine.parallel.comm import CommunicationLog
    from studio.engine.parallel.mesh import ParallelMesh
    from studio.engine.parallel.sequence import apply_sequence_parallel

    config = ParallelConfig(**degrees)
    mesh = ParallelMesh.build(config)
    out = {}
    for kind, folder in folders.items():
        pipe = _load(kind, folder)
        transformer = pipe.transformer
        apply_sequence_parallel(transformer, config, mesh)
        first = (transformer.blocks if kind == "wan" else transformer.transformer_blocks)[0]
        shards, forwards = [], []
        # inside the block: diffusers splits the sequence as the block is entered
        first.norm1.register_forward_pre_hook(_recorder(shards), with_kwargs=True)
        transformer.register_forward_pre_hook(lambda m, a, seen=forwards: seen.append(1))
        with torch.inference_mode():
            with CommunicationLog() as log:
                out[kind] = _generate_any(pipe, kind)
            out[kind + "-sent"] = dict(log.sent)
            out[kind + "-shard"] = shards[0]
            out[kind + "-forwards"] = len(forwards)
            stats = apply_step_cache(transformer, StepCacheConfig(**CACHE))
            with CommunicationLog() as log:
                out[kind + "-cached"] = _generate_any(pipe, kind)
            out[kind + "-cached-sent"] = dict(log.sent)
            out[kind + "-decisions"] = [d[3] for d in stats.decisions]
    return out


@pytest.fixture(scope="module")
def sequence_reference(tiny_models):
    """Single-process outputs (plain and cached) and full sequence lengths."""
    from studio.engine.caching import StepCacheConfig, apply_step_cache

    folders = {"wan": str(tiny_models["wan-t2v"]), "flux": str(tiny_models["flux"])}
    want = {}
    for kind, folder in folders.items():
        pipe = _load(kind, folder)
        first = (pipe.transformer.blocks if kind == "wan"
                 else pipe.transformer.transformer_blocks)[0]
        shapes = []
        first.norm1.register_forward_pre_hook(_recorder(shapes), with_kwargs=True)
        with torch.inference_mode():
            want[kind] = _generate_any(pipe, kind)
            want[kind + "-shape"] = shapes[0]
            stats = apply_step_cache(pipe.transformer, StepCacheConfig(**CACHE))
            want[kind + "-cached"] = _generate_any(pipe, kind)
            want[kind + "-decisions"] = [d[3] for d in stats.decisions]
    return folders, want


@pytest.mark.parametrize("scheme", ["ulysses", "ring"])
def test_sequence_parallel_on_two_ranks_matches_one_process(ranks, sequence_reference,
                                                            tiny_models, scheme):
    """Ulysses (diffusers' all-to-all) and ring (ours: asynchronous exchanges on our
    log-sum-exp attention) on Wan and Flux: the single-process pixels, with and without the
    cache; each rank holds half the tokens and sends only its share."""
    from diffusers import WanTransformer3DModel

    folders, want = sequence_reference
    results = ranks.run(_sequence_rank, folders, {f"{scheme}_degree": 2})
    wan = WanTransformer3DModel.load_config(str(tiny_models["wan-t2v"]), subfolder="transformer")
    inner = wan["num_attention_heads"] * wan["attention_head_dim"]
    for result in results:
        for kind in folders:
            assert np.abs(result[kind] - want[kind]).max() <= 1e-5
            # parallel + cache = cache alone: the same decisions on every rank
            assert result[kind + "-decisions"] == want[kind + "-decisions"]
            assert np.abs(result[kind + "-cached"] - want[kind + "-cached"]).max() <= 1e-5
            batch, tokens, channels = want[kind + "-shape"]
            assert result[kind + "-shard"] == (batch, tokens // 2, channels)
            # the cache skips blocks, and with them their communication
            key = "send" if scheme == "ring" else "all_to_all_single"
            skipped = not all(want[kind + "-decisions"])
            if skipped:
                assert result[kind + "-cached-sent"][key] < result[kind + "-sent"][key]
        assert not all(want["wan-decisions"])  # the cache did skip steps on Wan
        # Wan self-attention over the rank's half: per attention call, ring sends its key
        # and value block once (to the one other rank); Ulysses all-to-alls q, k, v, out
        # (the scaling model in docs/PERFORMANCE.md uses these same formulas)
        from bench.scaling import ring_bytes_per_attention, ulysses_bytes_per_attention

        batch, tokens, _ = want["wan-shape"]
        calls = result["wan-forwards"] * wan["num_layers"]
        if scheme == "ring":
            per_attention = ring_bytes_per_attention(batch, tokens, inner, 2, 4)
            assert per_attention == 2 * batch * (tokens // 2) * inner * 4
            assert result["wan-sent"]["send"] == calls * per_attention
            assert "all_to_all_single" not in result["wan-sent"]
        else:
            per_attention = ulysses_bytes_per_attention(batch, tokens, inner, 2, 4)
            assert per_attention == 4 * batch * (tokens // 2) * inner * 4
            assert result["wan-sent"]["all_to_all_single"] == calls * per_attention
            assert "send" not in result["wan-sent"]
    for key in ("wan-sent", "flux-sent", "wan-cached-sent", "flux-cached-sent"):
        assert results[0][key] == results[1][key]  # every rank does the same share


def test_sequence_parallel_refuses_models_without_a_plan_or_bad_heads():
    from diffusers import UNet2DConditionModel

    from studio.engine.parallel.sequence import apply_sequence_parallel

    unet = UNet2DConditionModel(block_out_channels=(8, 16), layers_per_block=1, sample_size=8,
                                norm_num_groups=4, cross_attention_dim=8,
                                down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                                up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"))
    with pytest.raises(ParallelConfigError, match="has no context-parallel plan"):
        apply_sequence_parallel(unet, ParallelConfig(ulysses_degree=2))


def _uneven_tokens_rank(rank, world):
    """One rank: a small Wan denoiser under Ulysses 2; a 3 x 3 token grid (9 tokens), then a
    4 x 4 one (16)."""
    from diffusers import WanTransformer3DModel

    from studio.engine.parallel.sequence import apply_sequence_parallel

    torch.manual_seed(0)
    model = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=4,
        out_channels=4, text_dim=16, freq_dim=16, ffn_dim=32, num_layers=1,
        rope_max_seq_len=32).eval()
    apply_sequence_parallel(model, ParallelConfig(ulysses_degree=2))
    text = torch.zeros(1, 4, 16)
    out = {}
    with torch.inference_mode():
        try:
            model(hidden_states=torch.randn(1, 4, 1, 6, 6), timestep=torch.tensor([500.0]),
                  encoder_hidden_states=text, return_dict=False)
        except ParallelConfigError as exc:
            out["odd"] = str(exc)
        even = model(hidden_states=torch.randn(1, 4, 1, 8, 8), timestep=torch.tensor([500.0]),
                     encoder_hidden_states=text, return_dict=False)[0]
    out["even"] = tuple(even.shape)
    return out


def test_sequence_parallel_refuses_a_token_count_the_degree_does_not_divide(ranks):
    """Every rank refuses the same job with the rule (not diffusers' internal assertion),
    before any exchange, and the group runs the next job."""
    for result in ranks.run(_uneven_tokens_rank):
        assert "= 2 does not divide this job's 9 latent tokens" in result["odd"]
        assert result["even"] == (1, 4, 1, 8, 8)


def test_the_token_check_reads_what_the_plan_splits():
    """Flux-style plans split the packed latent tokens and the text tokens at the model's
    own call: each is checked, by its name; what the plan does not split is not."""
    from diffusers.models._modeling_parallel import ContextParallelInput

    from studio.engine.parallel.sequence import install_token_check

    class Packed(torch.nn.Module):
        def forward(self, hidden_states, encoder_hidden_states=None, txt_ids=None,
                    pooled=None):
            return hidden_states

    tokens = ContextParallelInput(split_dim=1, expected_dims=3, split_output=False)
    plan = {"": {"hidden_states": tokens, "encoder_hidden_states": tokens,
                 "txt_ids": ContextParallelInput(split_dim=0, expected_dims=2,
                                                 split_output=False)}}
    model = Packed()
    install_token_check(model, 4, plan)
    model(hidden_states=torch.zeros(1, 64, 8), encoder_hidden_states=torch.zeros(1, 512, 8),
          txt_ids=torch.zeros(512, 3), pooled=torch.zeros(1, 7))  # 7: not in the plan
    with pytest.raises(ParallelConfigError, match="does not divide this job's 66 tokens of "
                                                  "hidden_states"):
        model(hidden_states=torch.zeros(1, 66, 8), encoder_hidden_states=torch.zeros(1, 512, 8))
    with pytest.raises(ParallelConfigError, match="77 tokens of encoder_hidden_states"):
        model(hidden_states=torch.zeros(1, 64, 8), encoder_hidden_states=torch.zeros(1, 77, 8))
    with pytest.raises(ParallelConfigError, match="77 tokens of txt_ids"):
        model(hidden_states=torch.zeros(1, 64, 8), txt_ids=torch.zeros(77, 3))
    model(hidden_states=torch.zeros(1, 64, 8), txt_ids=torch.zeros(1, 77, 3))  # 3-D: unsplit


def test_cfg_parallel_refuses_ltx2_with_the_reason(tmp_path):
    """LTX-2's denoiser returns (video, audio) and runs one-item guidance calls: CFG
    parallel would fail mid-job on every rank (a 1-tuple unpacked as two, an odd batch);
    it is refused up front, pointing at ring."""
    from studio.engine.parallel.cfg import apply_cfg_parallel
    from studio.testing.tiny_pipelines import build_tiny_ltx2

    folder = build_tiny_ltx2(tmp_path / "ltx2")
    from diffusers import LTX2VideoTransformer3DModel

    transformer = LTX2VideoTransformer3DModel.from_pretrained(folder / "transformer")
    with pytest.raises(ParallelConfigError, match="use ring"):
        apply_cfg_parallel(transformer)


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


def test_patch_parallel_vae_decode_matches_the_tiled_decode(ranks):
    z = torch.randn(1, 8, 3, 24, 20, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        want = _tiny_tiling_vae().tiled_decode(z, return_dict=False)[0]
    results = ranks.run(_vae_rank, z)
    tiles = [owned for _, owned in results]
    assert sum(tiles) == 16 and tiles == [8, 8]  # a 4 x 4 grid of tiles, half each
    for video, _ in results:
        assert video.shape == want.shape
        torch.testing.assert_close(video, want, atol=1e-5, rtol=1e-5)


def embedded_request(**kw):
    from studio.core.request import GenerationRequest, OptimizationSettings

    base = dict(mode="t2v", model="embedded", prompt="a red circle on a blue background",
                seed=5, steps=4, guidance_scale=4.0, width=32, height=32, num_frames=5)
    profile = kw.pop("profile", "exact")
    base.update(kw)
    return GenerationRequest(**base, optimization=OptimizationSettings(profile=profile))


def run_embedded(executor, request, inputs=None):
    """The model's float frames (F, H, W, 3) in [0, 1] through the studio's own loading
    path (registry, runner, profile levers), and the plan the executor records."""
    from studio.engine.job import Job
    from studio.engine.profiles import levers_for

    inputs = inputs or {}
    request, entry = executor.prepare(Job("job", request, inputs))
    levers = levers_for(request.optimization.profile, executor.device, entry.tuning)
    runner, _ = executor.runner_for(entry, levers.precision)
    with torch.inference_mode():
        out = runner.run(request, inputs, lambda *args: None)
    cache = [n for n in out.notes if n.startswith("step cache:")]
    return np.asarray(out.frames), executor.environment().parallel, cache


def _executor(requests):
    """A CPU executor for ``requests``. The trained embedded model runs in float64 here: in
    float32 its pixels are not reproducible to 1e-5 under any reordering of the attention
    sums (float32 SDPA against float64 SDPA alone differs by 7e-5 after 4 steps and the VAE),
    so a ring's exact merge cannot be told from a wrong one at 1e-5 in float32; in float64 a
    correct plan gives the same float32 frames. The tiny random-weight models compare in
    float32."""
    from studio.engine.executor import JobExecutor
    from studio.engine.models.registry import ModelRegistry

    executor = JobExecutor(ModelRegistry(include_hf_cache=False), torch.device("cpu"))
    if all(r.model == "embedded" for r in requests):
        executor.dtype = torch.float64
    return executor


def plan_rank(rank, world, degrees, requests, inputs=None):
    """On each rank: an executor whose runners get the plan at load (as the rank-group
    worker does), running each request on the embedded model."""
    from studio.engine.parallel.mesh import ParallelMesh
    from studio.engine.parallel.worker import apply_parallel_plan, describe_plan

    config = ParallelConfig(**degrees)
    mesh = ParallelMesh.build(config)
    executor = _executor(requests)
    executor.parallel_plan = describe_plan(config)
    executor.on_runner_loaded = lambda runner: apply_parallel_plan(runner, config, mesh)
    from studio.engine.parallel.comm import CommunicationLog

    runs = []
    for r in requests:
        with CommunicationLog() as log:
            runs.append(run_embedded(executor, r, inputs) + (dict(log.sent),))
    return tuple(mesh.mesh.get_coordinate()), runs


def _cache_counts(notes: list[str]) -> tuple[int, int]:
    """(calls computed in full, calls forecast) from a runner's step-cache note."""
    full, _, forecast = map(int, re.findall(r"\d+", notes[0]))
    return full, forecast


def check_plan_results(results, want, plan_name):
    """Every rank has the single-process frames; the cache made the single process's
    decisions: the same notes on every rank of a sequence group, and, under CFG parallel,
    the two ranks of a guidance pair between them forecast what the single process did
    (each caches the branch it computes; the uncond rank also computed the first cond
    call, to learn the output's shape)."""
    by_coordinate = {}
    for coordinate, runs in results:
        by_coordinate[coordinate] = runs
        for (frames, plan, _, _), (reference, _, _) in zip(runs, want, strict=True):
            assert np.abs(frames - reference).max() <= 1e-5
            assert plan == plan_name
    for index, (_, _, want_cache) in enumerate(want):
        if not want_cache:
            continue
        full, forecast = _cache_counts(want_cache)
        for (cfg, ring, ulysses), runs in by_coordinate.items():
            if cfg == 1:
                continue
            if (1, ring, ulysses) not in by_coordinate:  # no CFG parallel: same as alone
                assert runs[index][2] == want_cache
                continue
            cond = _cache_counts(runs[index][2])
            uncond = _cache_counts(by_coordinate[(1, ring, ulysses)][index][2])
            assert cond[1] + uncond[1] == forecast
            assert cond[0] + uncond[0] == full + 1


def embedded_reference(requests, inputs=None):
    executor = _executor(requests)
    return [run_embedded(executor, r, inputs) for r in requests]


@pytest.mark.parametrize("degrees", [dict(cfg_degree=2), dict(ulysses_degree=2),
                                     dict(ring_degree=2)], ids=["cfg", "ulysses", "ring"])
def test_embedded_model_under_each_two_rank_plan(ranks, degrees):
    """The embedded model through the engine's loading path under each 2-rank plan, with
    the exact and the balanced (step cache) profiles: the single-process frames."""
    requests = [embedded_request(), embedded_request(profile="fast", steps=12)]
    want = embedded_reference(requests)
    assert " 0 forecast" not in want[1][2][0]  # the fast profile's cache does skip here
    name = next(iter(degrees)).removesuffix("_degree")
    check_plan_results(ranks.run(plan_rank, degrees, requests), want, f"{name} 2 (2 ranks)")


def test_plan_catalogue_and_engine_wiring():
    """The plans offered per GPU count, and the engine building a rank group for a plan;
    a CFG plan refuses a job without guidance before any rank starts."""
    from studio.engine import events as ev
    from studio.engine.api import Engine
    from studio.engine.job import Job
    from studio.engine.parallel import available_plans
    from studio.engine.parallel.worker import RankGroupWorker
    from studio.engine.worker import WorkerConfig

    assert [label for label, _ in available_plans(1)] == ["single device"]
    assert [label for label, _ in available_plans(2)] == [
        "single device", "cfg 2 (2 ranks)", "ulysses 2 (2 ranks)", "ring 2 (2 ranks)"]
    eight = available_plans(8)
    assert len(eight) == 13 and all(p.world_size <= 8 for _, p in eight)
    assert "ulysses 4 × ring 2 (8 ranks)" in [label for label, _ in eight]
    engine = Engine(config=WorkerConfig(parallel=ParallelConfig(cfg_degree=2)))
    assert isinstance(engine.worker, RankGroupWorker)
    # bad degrees, and more gloo ranks than a CPU machine runs, before anything starts
    with pytest.raises(ParallelConfigError, match="ulysses_degree: 0 must be an integer"):
        Engine(config=WorkerConfig(parallel=ParallelConfig(ulysses_degree=0)))
    with pytest.raises(ParallelConfigError, match="64 ranks, but only 8 device"):
        Engine(config=WorkerConfig(device="cpu", parallel=ParallelConfig(ring_degree=64)))
    seen = []
    engine.worker.start(seen.append)
    engine.worker.run(Job("j1", embedded_request(guidance_scale=1.0)))
    assert engine.worker.pids == []  # refused before starting any rank
    [failed] = seen
    assert isinstance(failed, ev.Failed) and failed.kind == ev.BAD_INPUT
    assert failed.message.startswith("guidance_scale: 1.0 runs one branch")


@pytest.mark.parametrize("scheme", ["ulysses", "ring"])
def test_wan_vace_reference_to_video_under_our_own_plan(ranks, tmp_path_factory, scheme):
    """diffusers has no context-parallel plan for Wan VACE; ours splits the VACE branch
    too. Reference-to-video gives the single-process frames, with and without the cache."""
    from studio.core.media import pixels_content_id
    from studio.core.request import MediaRef
    from studio.testing.tiny_pipelines import build_tiny_wan_vace

    folder = build_tiny_wan_vace(tmp_path_factory.mktemp("vace-par") / "vace")
    image = (np.random.default_rng(9).random((32, 32, 3)) * 255).astype(np.uint8)
    ref = MediaRef(pixels_content_id(image), "ref.png")
    inputs = {ref.content_id: image}
    requests = [embedded_request(model=str(folder), mode="r2v", references=(ref,)),
                embedded_request(model=str(folder), mode="r2v", references=(ref,),
                                 profile="fast", steps=10)]
    want = embedded_reference(requests, inputs)
    assert " 0 forecast" not in want[1][2][0]
    results = ranks.run(plan_rank, {f"{scheme}_degree": 2}, requests, inputs)
    check_plan_results(results, want, f"{scheme} 2 (2 ranks)")
    for _, [(_, _, _, sent), _] in results:  # the tokens really were split and exchanged
        assert sent["send" if scheme == "ring" else "all_to_all_single"] > 0


@pytest.mark.parametrize("family", ["sd3", "hidream"])
def test_sd3_and_hidream_ring_under_our_own_plans(ranks, tmp_path_factory, family):
    """Our plans for denoisers that call SDPA themselves. SD3's text tokens do not divide
    evenly: its token embeddings are split unevenly and its joint attention rings padded,
    masked blocks. HiDream joins fresh text states into every block: the text stays whole on
    every rank and only the image shards ring; at a non-square size HiDream pads the image
    tokens to a fixed count and masks the padding, and the masks are cut with the shards.
    The single-process image, with and without the cache; Ulysses is refused with the
    reason."""
    from studio.testing import tiny_pipelines as tiny

    if family == "sd3":
        folder = tiny.build_tiny_sd(tmp_path_factory.mktemp(family) / family, variant="sd3")
        size = dict(width=64, height=64)
    else:
        folder = tiny.build_tiny_hidream(tmp_path_factory.mktemp(family) / family)
        size = dict(width=80, height=48)
    requests = [embedded_request(model=str(folder), mode="t2i", num_frames=1, **size),
                embedded_request(model=str(folder), mode="t2i", num_frames=1, profile="fast",
                                 steps=12, **size)]
    want = embedded_reference(requests)
    assert " 0 forecast" not in want[1][2][0]
    results = ranks.run(plan_rank, {"ring_degree": 2}, requests)
    check_plan_results(results, want, "ring 2 (2 ranks)")
    for _, runs in results:
        assert runs[0][3]["send"] > 0
    with pytest.raises(RuntimeError, match="splits its sequence with ring attention only"):
        ranks.run(plan_rank, {"ulysses_degree": 2}, requests[:1])


@pytest.mark.parametrize("family", ["flux2", "qwen-image"])
def test_flux2_and_qwen_under_diffusers_plans_with_ulysses_and_ring(ranks, tmp_path_factory,
                                                                     family):
    """FLUX.2 and Qwen-Image through the engine under Ulysses 2 and ring 2 (diffusers'
    plans; ring on our kernel, with Qwen's text mask): the single-process image. Qwen's plan
    splits the text: prompts of an odd and an even token count, the odd one padded with a
    masked token."""
    from studio.testing import tiny_pipelines as tiny

    build = tiny.build_tiny_flux2 if family == "flux2" else tiny.build_tiny_qwen_image
    folder = build(tmp_path_factory.mktemp(family) / family)
    requests = [embedded_request(model=str(folder), steps=2, mode="t2i", num_frames=1,
                                 prompt=prompt) for prompt in ("a red circle", "a red circle on")]
    want = embedded_reference(requests)
    for scheme in ("ulysses", "ring"):
        results = ranks.run(plan_rank, {f"{scheme}_degree": 2}, requests)
        check_plan_results(results, want, f"{scheme} 2 (2 ranks)")
        for _, runs in results:
            for *_, sent in runs:
                assert sent["send" if scheme == "ring" else "all_to_all_single"] > 0


def test_ltx2_audio_video_ring_under_our_own_plan(ranks, tmp_path_factory):
    """LTX-2 (diffusers' plan is LTX-1's and breaks on it): ours splits the video tokens
    with their coordinates and per-token timestep, keeps audio and text whole, and rings the
    video self-attention and the video-to-audio attention. Text-to-video, and
    image-to-video (a per-token timestep), give the single-process frames, with and without
    the cache (which forecasts both streams); Ulysses is refused with the reason."""
    from studio.core.media import pixels_content_id
    from studio.core.request import MediaRef
    from studio.testing.tiny_pipelines import build_tiny_ltx2

    folder = build_tiny_ltx2(tmp_path_factory.mktemp("ltx2-par") / "ltx2")
    image = (np.random.default_rng(3).random((64, 64, 3)) * 255).astype(np.uint8)
    first = MediaRef(pixels_content_id(image), "first.png")
    inputs = {first.content_id: image}
    video = dict(model=str(folder), width=64, height=64, num_frames=9)
    requests = [embedded_request(mode="t2v", steps=2, **video),
                embedded_request(mode="i2v", steps=2, first_frame=first, **video),
                embedded_request(mode="t2v", steps=10, profile="fast", **video)]
    want = embedded_reference(requests, inputs)
    assert " 0 forecast" not in want[2][2][0]
    results = ranks.run(plan_rank, {"ring_degree": 2}, requests, inputs)
    check_plan_results(results, want, "ring 2 (2 ranks)")
    for _, runs in results:
        for *_, sent in runs:
            assert sent["send"] > 0
    with pytest.raises(RuntimeError, match="splits its sequence with ring attention only"):
        ranks.run(plan_rank, {"ulysses_degree": 2}, requests[:1], inputs)


def test_ltx_video_with_its_text_mask_under_ulysses_and_ring(ranks, tmp_path_factory):
    """LTX-Video's plan splits the text and its (batch, heads, 1, keys) mask. Our ring takes
    the mask (each rank's gathered); under Ulysses its attention runs on our backend, which
    reduces the gathered mask to key padding (diffusers' own Ulysses forward fails on it).
    The single-process video."""
    from studio.testing.tiny_pipelines import build_tiny_ltx

    folder = build_tiny_ltx(tmp_path_factory.mktemp("ltx-par") / "ltx")
    requests = [embedded_request(model=str(folder), steps=2, mode="t2v", width=64, height=64,
                                 num_frames=9)]
    want = embedded_reference(requests)
    for scheme in ("ulysses", "ring"):
        results = ranks.run(plan_rank, {f"{scheme}_degree": 2}, requests)
        check_plan_results(results, want, f"{scheme} 2 (2 ranks)")
        for _, [(*_, sent)] in results:
            assert sent["send" if scheme == "ring" else "all_to_all_single"] > 0


def _listening(rank, world):
    """The local addresses (hex, as /proc/net/tcp{,6} writes them) of this rank's
    listening TCP sockets."""
    import os

    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("tcp", "tcp6"):
        with open(f"/proc/net/{table}") as fh:
            for line in fh.read().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    found.append(fields[1].split(":")[0])
    return found


LOOPBACK = {"0100007F", "00000000000000000000000001000000",  # 127.0.0.1, ::1
            "0000000000000000FFFF00000100007F"}  # ::ffff:127.0.0.1


def test_the_rank_group_listens_on_loopback_only(ranks):
    """Nothing listens beyond this machine: torch's default rendezvous would have rank 0's
    store listen on every interface (*:port) for as long as the group lives."""
    sockets = ranks.run(_listening)
    assert sockets[0], "rank 0 holds the rendezvous store's listening socket"
    assert all(address in LOOPBACK for per_rank in sockets for address in per_rank), sockets


@pytest.mark.parametrize("model", ["flux", "flux2"])
def test_cfg_parallel_is_refused_for_guidance_distilled_families(tiny_models, tmp_path, model):
    """FLUX.1 and FLUX.2 run one branch per step (their guidance scale is an input of it):
    a CFG pair would leave its second GPU idle for the whole job, so the plan is refused at
    load with the way out; a sequence plan is not refused for it."""
    from studio.engine.executor import runner_class
    from studio.engine.models.registry import ModelRegistry
    from studio.engine.parallel.worker import apply_parallel_plan

    if model == "flux2":
        from studio.testing.tiny_pipelines import build_tiny_flux2

        folder = build_tiny_flux2(tmp_path / "flux2")
    else:
        folder = tiny_models["flux"]
    entry = ModelRegistry(include_hf_cache=False).resolve(str(folder))
    runner = runner_class(entry.family)(entry, torch.device("cpu"), torch.float32)
    with pytest.raises(ParallelConfigError, match="guidance-distilled .* choose a ulysses or "
                                                  "ring"):
        apply_parallel_plan(runner, ParallelConfig(cfg_degree=2))
    assert runner_class("wan").classifier_free_guidance
