"""The calibration's choice: per profile, the least work whose worst SSIM meets its floor."""

import numpy as np
import pytest

from bench.calibrate import FLOORS, MEAN_FLOORS, choose, mean_ssim


def row(calls, ssim, threshold, mean=None):
    """A calibration row with worst SSIM ``ssim``; with ``mean``, two prompts per mode whose
    mean is ``mean`` (the image mode; clips hold 0.999)."""
    r = {"worst_calls": calls, "worst_ssim": ssim, "threshold": threshold}
    if mean is not None:
        r["embedded-t2i"] = {"ssim_per_prompt": [ssim, 2 * mean - ssim]}
        r["embedded-t2v"] = {"ssim_per_prompt": [0.999, 0.999]}
    return r


def test_each_profile_gets_the_least_work_meeting_its_floor():
    rows = [row(30.0, 0.99, 0.1), row(25.0, 0.96, 0.3), row(20.0, 0.91, 0.6, mean=0.97),
            row(15.0, 0.80, 1.0), row(25.0, 0.97, 0.25)]
    chosen = choose(rows)
    assert set(chosen) == set(FLOORS)
    assert chosen["quality"]["threshold"] == 0.1
    assert chosen["balanced"]["threshold"] == 0.25  # equal work: the better SSIM wins
    assert chosen["fast"]["threshold"] == 0.6
    assert choose([row(15.0, 0.5, 2.0)]) == {p: None for p in FLOORS}


def test_a_looser_floor_needs_a_real_saving_to_take_a_worse_setting():
    rows = [row(40.0, 0.99, 0.1), row(29.3, 0.976, 0.2), row(28.3, 0.908, 0.7)]
    chosen = choose(rows)
    assert chosen["balanced"]["threshold"] == 0.2
    assert chosen["fast"]["threshold"] == 0.2  # 3 % less work is not worth SSIM 0.908
    chosen = choose([*rows, row(25.0, 0.91, 0.9, mean=0.96)])  # 15 % less: taken
    assert chosen["fast"]["threshold"] == 0.9
    # no stricter setting meets its floor: the looser one stands alone
    assert choose([row(20.0, 0.93, 0.5, mean=0.96)])["fast"]["threshold"] == 0.5


def test_fast_takes_one_changed_prompt_only_with_a_high_mean():
    """Fast's worst prompt may fall to FLOORS["fast"] only while the mean over prompts (the
    worse mode's) keeps MEAN_FLOORS["fast"]."""
    assert FLOORS["fast"] < 0.90 < MEAN_FLOORS["fast"]
    good = row(24.0, 0.89, 0.4, mean=0.97)
    assert abs(mean_ssim(good) - 0.97) < 1e-9
    assert choose([good])["fast"] is good
    assert choose([row(24.0, 0.89, 0.4, mean=0.93)])["fast"] is None  # mean too low
    assert choose([row(24.0, 0.84, 0.4, mean=0.99)])["fast"] is None  # one prompt lost


def test_resume_reuses_only_rows_measured_on_the_same_weights_and_prompts(tmp_path, monkeypatch):
    import json

    import bench.calibrate as calibrate

    monkeypatch.setattr(calibrate, "ROOT", tmp_path)
    monkeypatch.setattr(calibrate, "EMBEDDED", tmp_path / "model")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "studio.json").write_text(json.dumps({"training_step": 7}))
    assert calibrate._earlier_rows(["a red star"]) == {}  # no file yet
    setting = {"signal": "output", "threshold": 0.001, "max_consecutive_skips": 2, "order": 1,
               "warmup_steps": 3, "guidance_reuse": None}
    runners = {"embedded-t2i": [type("R", (), {"baseline": {"full_denoiser_calls": 40}})()]}
    path = calibrate._write_result([], ["a red star"], runners,
                                   [{**setting, "worst_calls": 20.0, "worst_ssim": 0.96}],
                                   partial=True)
    assert json.loads(path.read_text())["partial"] is True
    earlier = calibrate._earlier_rows(["a red star"])
    assert list(earlier) == [calibrate._row_key(setting)]
    assert calibrate._row_key({**setting, "threshold": 0.002}) not in earlier
    assert calibrate._earlier_rows(["another prompt"]) == {}
    (tmp_path / "model" / "studio.json").write_text(json.dumps({"training_step": 8}))
    assert calibrate._earlier_rows(["a red star"]) == {}  # other weights


def test_a_setting_of_another_schedule_length_joins_the_profile_list():
    from bench.calibrate import merge_tuning

    old = {"signal": "output", "threshold": 0.002, "max_consecutive_skips": 2}
    new = {"signal": "output", "threshold": 0.007, "max_consecutive_skips": 4}
    merged = merge_tuning(old, new, 50)  # a setting written before lists was for 20 steps
    assert merged == [{"steps": 20, **old}, {"steps": 50, **new}]
    again = merge_tuning(merged, {**new, "threshold": 0.004}, 50)  # same length: replaced
    assert [it["steps"] for it in again] == [20, 50] and again[1]["threshold"] == 0.004
    assert merge_tuning(None, new, 20) == [{"steps": 20, **new}]
    # a 50-step calibration leaves the result file of the 20-step one alone
    import bench.calibrate as calibrate

    assert calibrate._result_path(50).name.endswith("-calibrate-50steps.json")
    assert calibrate._result_path().name.endswith("-calibrate.json")


def test_a_profile_that_meets_no_floor_at_a_length_loses_its_old_setting_there():
    from bench.calibrate import merged_step_cache

    a, b = {"threshold": 0.001}, {"threshold": 0.002}
    current = {"quality": [{"steps": 20, **a}, {"steps": 50, **b}], "fast": {"threshold": 0.3}}
    merged = merged_step_cache(current, {"balanced": b}, 50)
    assert merged["quality"] == [{"steps": 20, **a}]  # the stale 50-step setting is gone
    assert merged["balanced"] == [{"steps": 50, **b}]
    assert merged["fast"] == [{"steps": 20, "threshold": 0.3}]
    assert "quality" not in merged_step_cache({"quality": [{"steps": 50, **b}]}, {}, 50)


def test_schedule_family_is_dense_at_both_ends_and_has_the_asked_size():
    from bench.calibrate import schedule_family

    for steps in (20, 50, 100):
        for full in (4, 8, 12):
            for share in (0.0, 0.5, 1.0):
                s = schedule_family(steps, full, share)
                assert s == sorted(set(s)) and s[:3] == [0, 1, 2]
                assert s[-1] == steps - 2 and len(s) == full
    # cosine spacing puts the middle gap above the first and last gaps
    s = schedule_family(50, 12, 1.0)
    gaps = np.diff(s)
    assert gaps[len(gaps) // 2] > gaps[2] and gaps[len(gaps) // 2] > gaps[-1]
    assert schedule_family(10, 9, 1.0) == list(range(9))  # every step but the last
    for bad in (3, 50):
        with pytest.raises(ValueError, match="full steps"):
            schedule_family(50, bad, 0.5)


def test_a_schedule_row_has_its_own_key_and_goes_into_the_tuning():
    from bench.calibrate import _row_key

    base = {"signal": "output", "threshold": 10.0, "max_consecutive_skips": 50, "order": 1,
            "warmup_steps": 3, "guidance_reuse": None}
    a = {**base, "schedule": [0, 1, 2, 9, 30], "linear_below": 0.7}
    b = {**a, "linear_below": 0.5}
    c = {**a, "schedule": [0, 1, 2, 10, 30]}
    assert len({_row_key(base), _row_key(a), _row_key(b), _row_key(c)}) == 4
    # the defaults (no schedule, linear forecast throughout) key like a row without them
    assert _row_key({**base, "schedule": [], "linear_below": 1.0}) == _row_key(base)


def test_adherence_rules_out_a_cheaper_setting_that_loses_an_attribute():
    """With an adherence check, each profile takes the cheapest setting meeting its SSIM
    floors whose attributes stay within its bar (balanced 2 points, fast 5), scoring only
    as many settings as it takes; when every candidate fails, the stricter profile's setting
    stands."""
    rows = [row(22.0, 0.99, 0.01), row(25.0, 0.99, 0.02), row(28.0, 0.99, 0.03),
            row(30.0, 0.99, 0.04)]
    drops = {0.01: 9.0, 0.02: 3.0, 0.03: 1.5, 0.04: 0.0}
    scored = []

    def drop(r, bar):
        scored.append(r["threshold"])
        return drops[r["threshold"]]

    chosen = choose(rows, drop)
    assert chosen["quality"]["threshold"] == 0.03  # 22 and 25 lose > 2 points
    assert chosen["balanced"]["threshold"] == 0.03
    # 25 calls lose 3 points (within fast's 5) and save over 5 % of balanced's 28
    assert chosen["fast"]["threshold"] == 0.02
    assert 0.04 not in scored  # nothing past the first setting that passes is scored


def test_fast_falls_back_to_the_stricter_setting_when_every_cheaper_one_loses():
    rows = [row(20.0, 0.99, 0.01), row(30.0, 0.99, 0.04)]
    chosen = choose(rows, lambda r, bar: 9.0 if r["threshold"] == 0.01 else 0.0)
    assert chosen["balanced"]["threshold"] == 0.04
    assert chosen["fast"]["threshold"] == 0.04
    # without the check the SSIM floors alone take the cheap one
    assert choose(rows)["fast"]["threshold"] == 0.01


def _mode(calls, *ssims):
    return {"full_denoiser_calls": calls, "ssim_per_prompt": list(ssims)}


def test_a_setting_must_beat_fewer_steps_at_matched_work():
    """A setting whose mean SSIM (in either mode) is below that of the fewer-steps run with
    the most work within 5 % above its own is not chosen, however cheap; a setting making
    less work than every fewer-steps run has nothing to beat."""
    from bench.calibrate import beats_fewer_steps
    refs = {"embedded-t2i": [_mode(2.0 * n, 0.90 + 0.005 * n) for n in range(10, 16)],
            "embedded-t2v": [_mode(2.0 * n, 0.95 + 0.002 * n) for n in range(10, 16)]}
    # 27.1 calls: 14 steps (28 calls) is within 5 % above; mean 0.963 < 0.970
    fragile = {"worst_calls": 27.1, "worst_ssim": 0.90, "threshold": 0.002,
               "embedded-t2i": _mode(27.1, 0.99, 0.936),
               "embedded-t2v": _mode(26.4, 0.99, 0.99)}
    steady = {"worst_calls": 29.3, "worst_ssim": 0.96, "threshold": 0.004,
              "embedded-t2i": _mode(27.5, 0.99, 0.98), "embedded-t2v": _mode(29.3, 0.996)}
    assert not beats_fewer_steps(fragile, refs)
    assert beats_fewer_steps(steady, refs)
    assert beats_fewer_steps(fragile, None)
    # the clip mode alone can fail a row
    clip_loses = {**steady, "embedded-t2v": _mode(29.3, 0.97)}
    assert not beats_fewer_steps(clip_loses, refs)
    cheap = {**fragile, "embedded-t2i": _mode(15.0, 0.5), "embedded-t2v": _mode(15.0, 0.5)}
    assert beats_fewer_steps(cheap, refs)  # below every reference's work
    chosen = choose([fragile, steady], fewer_steps=refs)
    assert chosen["fast"] is steady and chosen["balanced"] is steady
    assert choose([fragile, steady])["fast"] is fragile  # without references


def _report(accuracy: dict[str, float], flags: dict[str, list[bool]]):
    """An evaluator report with these accuracies (in points) and per-sample correctness."""
    from studio.tiny.evaluate import EvalReport

    n = len(next(iter(flags.values())))
    details = [{"correct": {a: [f[i]] for a, f in flags.items()}} for i in range(n)]
    return EvalReport({k: v / 100 for k, v in accuracy.items()}, {}, {}, details)


def test_adherence_drop_scores_clips_on_prompts_the_benchmark_does_not(monkeypatch):
    """``_adherence_drop`` scores images then clips on ADHERENCE_SEED's prompts (not seed 0,
    which ``bench cpu`` reports), each mode on its own number of prompts, keeps both in the
    row with the paired split, and stops at the first mode past the bar."""
    import bench.calibrate as calibrate
    from bench.cpu import Case

    assert calibrate.ADHERENCE_SEED != 0
    calls = []
    same = [True] * 10

    def fake_report(self, method, seed=0):
        calls.append((self.case.eval_mode, method.kind, seed, self.adherence_n))
        if method.kind == "baseline":
            return _report({"colour": 80.0, "shape": 50.0}, {"colour": same, "shape": same})
        if self.case.eval_mode == "t2i":
            return _report({"colour": 77.0, "shape": 50.0}, {"colour": same, "shape": same})
        return _report({"colour": 80.0, "shape": 44.0}, {"colour": same, "shape": same})

    monkeypatch.setattr(calibrate.Runner, "adherence_report", fake_report)
    cases = [Case("embedded-t2i", None, None, ["a"], 50, "t2i"),
             Case("embedded-t2v", None, None, ["a"], 50, "t2v")]
    drop = calibrate._adherence_drop(cases, 50, {"t2i": 64, "t2v": 200})
    row = {"signal": "output", "threshold": 0.004, "order": 1, "warmup_steps": 3,
           "max_consecutive_skips": 8, "guidance_reuse": None}
    assert drop(row, 2.0) == pytest.approx(3.0)  # images lose 3 points: clips not scored
    assert "adherence_t2v" not in row
    assert drop(row, 5.0) == pytest.approx(6.0)  # clips lose 6 points of shape
    assert row["adherence_t2v"]["seed"] == calibrate.ADHERENCE_SEED
    assert row["adherence_t2v"]["prompts"] == 200
    assert row["adherence_t2v"]["paired"]["shape"]["lost"] == 0
    assert {seed for *_, seed, _ in calls} == {calibrate.ADHERENCE_SEED}
    assert {(mode, n) for mode, _, _, n in calls} == {("t2i", 64), ("t2v", 200)}
    n = len(calls)
    assert drop(row, 5.0) == pytest.approx(6.0) and len(calls) == n  # kept in the row


def test_a_significant_paired_loss_fails_however_few_points_it_reads(monkeypatch):
    """9 of 200 moving objects lost and 1 gained is 4 points in accuracy here but would be
    read as 1 point against another stock draw: the paired test fails it at any bar."""
    import bench.calibrate as calibrate
    from bench.cpu import Case

    stock_flags = [True] * 100 + [False] * 100
    mine_flags = [False] * 9 + [True] * 91 + [True] + [False] * 99

    def fake_report(self, method, seed=0):
        if method.kind == "baseline":
            return _report({"motion": 50.0}, {"motion": stock_flags})
        return _report({"motion": 46.0}, {"motion": mine_flags})

    monkeypatch.setattr(calibrate.Runner, "adherence_report", fake_report)
    drop = calibrate._adherence_drop([Case("embedded-t2v", None, None, ["a"], 50, "t2v")],
                                     50, 200)
    row = {"signal": "output", "threshold": 0.001, "order": 1, "warmup_steps": 5,
           "max_consecutive_skips": 8, "guidance_reuse": None}
    assert drop(row, 5.0) == float("inf")
    paired = row["adherence_t2v"]["paired"]["motion"]
    assert (paired["lost"], paired["gained"]) == (9, 1) and paired["p_value"] < 0.05
    # the same accuracies from an even split (5 lost, 1 gained: p = 0.22) pass at 5 points
    mine_flags[:] = [False] * 5 + [True] * 95 + [True] + [False] * 99
    row.pop("adherence_t2v")
    assert drop(row, 5.0) == pytest.approx(4.0)


def test_fewer_steps_runs_are_made_only_for_the_candidates_checked(monkeypatch):
    """The calibration's fewer-steps reference runs a step count only when a candidate asks
    for it (the most steps whose work fits 5 % above the candidate's), once, and keeps it in
    the result's rows."""
    import bench.calibrate as calibrate

    ran = []

    class FakeRunner:
        baseline = {"full_denoiser_calls": 100.0}
        baseline_out = np.zeros((4, 4, 3), np.uint8)

        def units(self, method):
            ran.append(method.steps)
            return 2.0 * method.steps, np.zeros((4, 4, 3), np.uint8)

    monkeypatch.setattr(calibrate, "psnr_ssim", lambda a, b: (99.0, 0.9 + 0.004 * len(ran)))
    rows = {}
    reference = calibrate._fewer_steps_reference({"embedded-t2i": [FakeRunner()]}, 50, rows)
    assert reference("embedded-t2i", 27.1 * 1.05)["steps"] == 14
    assert reference("embedded-t2i", 28.0)["steps"] == 14 and ran == [14]  # kept
    assert reference("embedded-t2i", 3.0) is None and ran == [14]  # fewer than 2 steps
    assert [r["steps"] for r in rows["embedded-t2i"]] == [14]
    # choose asks only for the candidates it checks, cheapest first
    cheap = {"worst_calls": 20.0, "worst_ssim": 0.99, "threshold": 0.01,
             "embedded-t2i": _mode(20.0, 0.5)}
    ok = {"worst_calls": 24.0, "worst_ssim": 0.99, "threshold": 0.004,
          "embedded-t2i": _mode(24.0, 0.999)}
    dear = {"worst_calls": 40.0, "worst_ssim": 0.999, "threshold": 0.0005,
            "embedded-t2i": _mode(40.0, 0.999)}
    chosen = choose([cheap, ok, dear], fewer_steps=reference)
    assert chosen["quality"] is ok and chosen["fast"] is ok
    assert ran == [14, 10, 12]  # 20 and 24 calls checked (+5 %); 40 never


def test_within_matched_work_the_better_mean_ssim_wins():
    """Among passing settings within 5 % of the cheapest passing one's work, the best mean
    SSIM is taken (``bench cpu`` compares against peers in that band); a better one outside
    the band, or one that fails adherence, is not."""
    cheapest = row(40.1, 0.977, 0.002, mean=0.9955)
    better = row(40.8, 0.953, 0.0005, mean=0.9957)
    failing = row(41.0, 0.99, 0.001, mean=0.999)
    outside = row(42.5, 0.99, 0.0003, mean=0.9999)
    drops = {0.002: 1.6, 0.0005: 1.6, 0.001: 3.1, 0.0003: 0.0}
    chosen = choose([cheapest, better, failing, outside], lambda r, bar: drops[r["threshold"]])
    assert chosen["balanced"] is better
    assert chosen["quality"] is outside  # the only one at its floor within 2 points
    assert choose([cheapest, outside])["balanced"] is cheapest


def test_clips_take_their_own_cheaper_setting_where_it_passes_on_clips():
    """``choose_per_mode``: a setting that fails on images but passes every rule on clips,
    with at least LEAST_SAVING less clip work than the joint choice, becomes a clip-only
    setting; its adherence is scored on clips only; the joint choice stays for images."""
    import bench.calibrate as calibrate
    from bench.calibrate import choose_per_mode, merged_step_cache

    def setting(threshold, **modes):
        worst = min(min(m["ssim_per_prompt"]) for m in modes.values())
        calls = max(m["full_denoiser_calls"] for m in modes.values())
        return {"signal": "output", "threshold": threshold, "max_consecutive_skips": 8,
                "order": 1, "warmup_steps": 3, "guidance_reuse": None,
                "worst_calls": calls, "worst_ssim": worst,
                **{f"embedded-{k}": v for k, v in modes.items()}}

    joint = setting(0.002, t2i=_mode(30.0, 0.97, 0.98), t2v=_mode(30.0, 0.99, 0.995))
    cheap = setting(0.01, t2i=_mode(24.0, 0.70, 0.99), t2v=_mode(24.5, 0.97, 0.99))
    barely = setting(0.004, t2i=_mode(29.0, 0.60, 0.99), t2v=_mode(29.0, 0.99, 0.99))
    rows = [joint, cheap, barely]
    chosen = choose(rows)
    assert chosen["fast"] is joint and chosen["balanced"] is joint
    scored = []

    def drop(row, bar, modes=None):
        scored.append((row["threshold"], frozenset(modes or ())))
        return 0.0

    gains = choose_per_mode(rows, chosen, drop)
    assert gains["fast"] == {"embedded-t2v": cheap}  # 24.5 calls against 30 on clips
    assert gains["balanced"] == {"embedded-t2v": cheap}
    assert "embedded-t2i" not in gains.get("fast", {})  # images fail the cheaper rows
    assert all(modes == {"t2v"} for t, modes in scored if t == 0.01)
    # a clip-only setting that loses adherence on clips is not taken
    gains = choose_per_mode(rows, chosen, lambda row, bar, modes=None: 9.0
                            if row["threshold"] == 0.01 else 0.0)
    assert gains == {}  # the next one on clips (29 calls) saves under LEAST_SAVING
    # into studio.json: the joint setting for both kinds, the clip one marked "video": true
    merged = merged_step_cache({}, {"fast": {"threshold": 0.002}}, 50,
                               {"fast": {True: {"threshold": 0.01}}})
    assert merged["fast"] == [{"steps": 50, "threshold": 0.002},
                              {"steps": 50, "video": True, "threshold": 0.01}]
    again = merged_step_cache(merged, {"fast": {"threshold": 0.003}}, 50)
    assert again["fast"] == [{"steps": 50, "threshold": 0.003}]  # a new run replaces both
    assert calibrate.MODE_VIDEO == {"embedded-t2i": False, "embedded-t2v": True}


def test_a_job_takes_the_setting_of_its_kind_of_output():
    from studio.engine.profiles import levers_for, tuning_for_steps

    entry = [{"steps": 20, "threshold": 0.1}, {"steps": 50, "threshold": 0.2},
             {"steps": 50, "video": True, "threshold": 0.3},
             {"steps": 20, "video": False, "threshold": 0.4}]
    assert tuning_for_steps(entry, 50, "x", video=True) == {"threshold": 0.3}
    assert tuning_for_steps(entry, 50, "x", video=False) == {"threshold": 0.2}
    assert tuning_for_steps(entry, 50, "x") == {"threshold": 0.2}  # unknown: both kinds'
    assert tuning_for_steps(entry, 20, "x", video=False) == {"threshold": 0.4}
    assert tuning_for_steps(entry, 20, "x", video=True) == {"threshold": 0.1}
    # nearest length first: a 40-step clip takes the 50-step clip setting
    assert tuning_for_steps(entry, 40, "x", video=True) == {"threshold": 0.3}
    assert tuning_for_steps([{"steps": 50, "video": True, "a": 1}], 50, "x", False) is None
    with pytest.raises(ValueError, match=r"x\[0\]\.video"):
        tuning_for_steps([{"steps": 50, "video": "yes"}], 50, "x", True)
    tuning = {"step_cache": {"fast": [{"steps": 50, "signal": "output", "threshold": 0.004},
                                      {"steps": 50, "video": True, "signal": "output",
                                       "threshold": 0.01}]}}
    assert levers_for("fast", "cpu", tuning, 50, video=True).step_cache.threshold == 0.01
    assert levers_for("fast", "cpu", tuning, 50, video=False).step_cache.threshold == 0.004


def test_a_pick_must_hold_its_floors_on_validation_prompts(monkeypatch):
    """``_validator``: a setting that passes on the calibration prompts but drops one
    validation prompt below the profile's floor is not chosen for that profile; the stock
    outputs are made once, each row's validation scores are kept and not made again."""
    import bench.calibrate as calibrate
    from bench.cpu import Case, Method

    made = []

    def fake_once(self, method, count=True, prompts=None, seed=0):
        made.append(("stock", prompts[0]))
        return ("stock", prompts[0]), 400.0, 0.0, 0

    def fake_units(self, method):
        made.append((method.setting, self.case.prompts[0]))
        return 20.0, (method.setting, self.case.prompts[0])

    # the setting 0.001 loses validation prompt "b" (0.93); 0.0005 keeps every prompt
    ssim = {("0.001", "b"): 0.93}
    monkeypatch.setattr(calibrate.Runner, "once", fake_once)
    monkeypatch.setattr(calibrate.Runner, "units", fake_units)
    monkeypatch.setattr(calibrate, "with_reuse", lambda config, reuse: Method(
        "sweep", "ours", f"{config.threshold:g}"))
    monkeypatch.setattr(calibrate, "psnr_ssim",
                        lambda out, base: (30.0, ssim.get(out, 0.995)))
    case = Case("embedded-t2i", None, None, ["x"], 50, "t2i")
    validate = calibrate._validator({"embedded-t2i": case}, {"embedded-t2i": ["a", "b"]},
                                    50, 26)

    def setting(threshold, calls):
        return {"signal": "output", "threshold": threshold, "max_consecutive_skips": 2,
                "order": 1, "warmup_steps": 5, "guidance_reuse": None, "worst_calls": calls,
                "worst_ssim": 0.99, "embedded-t2i": _mode(calls, 0.99, 0.995)}

    fragile, steady = setting(0.001, 30.0), setting(0.0005, 40.0)
    chosen = choose([fragile, steady], validate=validate)
    assert chosen["quality"] is steady and chosen["balanced"] is steady  # 0.93 < 0.95
    assert chosen["fast"] is fragile  # fast's floors: worst 0.85, mean 0.95
    assert fragile["validation_t2i"] == {"from": 26, "prompts": 2,
                                         "full_denoiser_calls": 20.0,
                                         "ssim_per_prompt": [0.995, 0.93]}
    assert sorted(p for who, p in made if who == "stock") == ["a", "b"]  # once each
    n = len(made)
    assert choose([fragile, steady], validate=validate) == chosen and len(made) == n
    assert choose([fragile, steady])["quality"] is fragile  # without validation
    # the kept scores are not a mode: the mean and the fewer-steps rule ignore them
    from bench.calibrate import beats_fewer_steps

    assert mean_ssim(fragile) == pytest.approx(0.9925)
    assert beats_fewer_steps(fragile, {"embedded-t2i": [_mode(30.0, 0.98)]})
