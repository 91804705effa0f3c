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
