"""The calibration's choice: per profile, the least work whose worst SSIM meets its floor."""

from bench.calibrate import FLOORS, choose


def row(calls, ssim, threshold):
    return {"worst_calls": calls, "worst_ssim": ssim, "threshold": threshold}


def test_each_profile_gets_the_least_work_meeting_its_floor():
    rows = [row(30.0, 0.99, 0.1), row(25.0, 0.96, 0.3), row(20.0, 0.91, 0.6),
            row(15.0, 0.80, 1.0), row(25.0, 0.97, 0.25)]
    chosen = choose(rows)
    assert set(chosen) == set(FLOORS)
    assert chosen["quality"]["threshold"] == 0.1
    assert chosen["balanced"]["threshold"] == 0.25  # equal work: the better SSIM wins
    assert chosen["fast"]["threshold"] == 0.6
    assert choose([row(15.0, 0.5, 2.0)]) == {p: None for p in FLOORS}


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
