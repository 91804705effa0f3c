"""`python -m bench cpu` end to end on the tiny random Wan model with two peers: every row is
there, each timed run is paired with a baseline run, the work counter sees the cache's
skips, and every timed run reproduces the counted one."""

import json

import pytest

from bench import cpu


def test_quick_run_on_tiny_wan(tmp_path):
    assert cpu.main(["--quick", "--cases", "tiny-wan", "--peers",
                     "fewer-steps,first-block-cache", "--out", str(tmp_path)]) == 0
    [result_file] = tmp_path.glob("*-cpu-quick.json")
    rows = json.loads(result_file.read_text())["rows"]
    base = rows[0]
    assert base["method"] == "baseline" and base["full_denoiser_calls"] == 40.0
    assert len(base["latencies_s"]) == 2  # --quick: 2 timed runs
    # every other configuration's runs sit between baseline runs (B M B M B), each run's
    # ratio the mean of its neighbours over its own time, the speed-up their median
    timed = [r for r in rows[1:] if "latency_s" in r]
    assert timed and all(len(r["baseline_latencies_s"]) == 3 and len(r["latencies_s"]) == 2
                         for r in timed)
    for r in timed:
        b, m = r["baseline_latencies_s"], r["latencies_s"]
        ratios = [(b[0] + b[1]) / 2 / m[0], (b[1] + b[2]) / 2 / m[1]]
        assert r["speedups"] == pytest.approx(ratios, rel=1e-2)
        assert r["speedup"] == pytest.approx(sum(ratios) / 2, rel=1e-2)
    ours = {r["profile"]: r for r in rows if r["kind"] == "ours" and "+" not in r["method"]}
    assert set(ours) == set(cpu.PROFILES)
    assert ours["fast"]["full_denoiser_calls"] < 40.0  # the counter sees the skipped blocks
    assert all(r.get("repeatable", True) for r in rows)
    assert {r.get("peer") for r in rows} >= {"fewer-steps", "first-block-cache"}
    # quality over the case's quality prompts (tiny-wan: its one prompt), worst one too
    measured = [r for r in rows if "latency_s" in r]
    assert all(r["quality_prompts"] == 1 and r["ssim_worst"] <= r["ssim"] + 1e-12
               and r["timed_prompt_calls"] == r["full_denoiser_calls"] for r in measured)
    # peak resident set: the process's highest (torch alone is over 100 MB), not only growth
    assert all(r["peak_rss_mb"] > 100 and 0 <= r["rss_growth_mb"] <= r["peak_rss_mb"]
               for r in measured)
    table = cpu.markdown(rows, "cmd")
    assert "| peak RSS MB |" in table
    assert f"| {measured[0]['peak_rss_mb']:.0f} |" in table


def test_peak_rss_sees_an_allocation_made_and_freed_inside():
    import time

    import numpy as np

    with cpu.PeakRss() as rss:
        block = np.ones(64 * 2**20, dtype=np.uint8)  # 64 MB, touched
        time.sleep(0.1)  # the sampler reads every 5 ms
        del block
    assert rss.peak >= 60 * 2**20 and rss.highest >= rss.start + rss.peak - 2**20


def test_another_schedule_length_and_the_cache_alone(tmp_path):
    """``--steps`` runs every configuration at that length (the baseline's calls follow,
    fewer steps is matched from below it) into its own file; ``--cache-only`` leaves out the
    rows that add guidance or token reuse."""
    assert cpu.main(["--quick", "--cases", "tiny-wan", "--peers", "fewer-steps", "--steps", "8",
                     "--cache-only", "--out", str(tmp_path)]) == 0
    [result_file] = tmp_path.glob("*-cpu-8steps-quick.json")
    result = json.loads(result_file.read_text())
    assert result["steps"] == 8 and result["partial"] is False
    # the weights it was measured on, so a later reader can tell a stale figure
    assert result["weights"]["model"] == "tiny-wan"
    assert isinstance(result["weights"]["training_step"], int)
    assert len(result["weights"]["transformer_sha256"]) == 16
    rows = result["rows"]
    assert rows[0]["method"] == "baseline" and rows[0]["full_denoiser_calls"] == 16.0
    assert not any("+" in r["method"] for r in rows)
    fewer = [r for r in rows if r.get("peer") == "fewer-steps" and "latency_s" in r]
    assert fewer and all(r["full_denoiser_calls"] < 16.0 for r in fewer)


def test_embedded_cases_measure_quality_over_held_out_prompts(tmp_path):
    """The embedded model's cases time one prompt and score work and quality over
    QUALITY_PROMPTS prompts, the first being the timed one."""
    cases = cpu.build_cases(tmp_path, {"embedded-t2i", "embedded-t2v"})
    for case in cases:
        mode = case.eval_mode
        assert len(case.prompts) == 1
        assert len(case.quality_prompts) == cpu.QUALITY_PROMPTS[mode]
        assert case.quality_prompts[0] == case.prompts[0]
        assert len(set(case.quality_prompts)) == len(case.quality_prompts)


def test_quality_prompt_counts_and_their_bad_values(tmp_path):
    """``--quality-prompts IMAGES,CLIPS`` sets how many prompts the embedded model's cases
    measure over; bad values name the option and the allowed range."""
    import pytest

    assert cpu.quality_prompt_counts("5,3") == {"t2i": 5, "t2v": 3}
    for bad, words in (("5", "IMAGES,CLIPS"), ("a,b", "IMAGES,CLIPS"), ("1,3", "2..200"),
                       ("5,0", "1..100")):
        with pytest.raises(ValueError, match="--quality-prompts") as info:
            cpu.quality_prompt_counts(bad)
        assert words in str(info.value)
    cases = cpu.build_cases(tmp_path, {"embedded-t2i", "embedded-t2v"}, {"t2i": 5, "t2v": 3})
    assert {c.eval_mode: len(c.quality_prompts) for c in cases} == {"t2i": 5, "t2v": 3}
    assert all(len(set(c.quality_prompts)) == len(c.quality_prompts) for c in cases)


def test_a_profile_with_an_earlier_profiles_setting_repeats_its_matched_peers(tmp_path):
    """Fast taking balanced's setting makes the same work: its peer rows are balanced's,
    marked as such, not matched and timed a second time."""
    [case] = cpu.build_cases(tmp_path, {"tiny-wan"})
    case.steps = 6
    same = {"signal": "output", "threshold": 0.01, "order": 1, "warmup_steps": 2,
            "max_consecutive_skips": 2}
    case.tuning = {"step_cache": {"quality": {**same, "threshold": 0.001},
                                  "balanced": same, "fast": same}}
    rows = cpu.run_case(case, runs=1, adherence_n=0, peers=("fewer-steps",), combined=False)
    peers = {r["profile"]: r for r in rows if r.get("peer") == "fewer-steps"
             and "latency_s" in r}
    assert set(peers) == set(cpu.PROFILES)
    assert peers["fast"]["same_as_profile"] == "balanced"
    assert peers["fast"]["latencies_s"] == peers["balanced"]["latencies_s"]
    assert "same setting" in peers["fast"]["status"]
    assert "same_as_profile" not in peers["balanced"]
    ours = {r["profile"]: r for r in rows if r["kind"] == "ours"}
    assert ours["fast"]["setting"] == ours["balanced"]["setting"] != ours["quality"]["setting"]
