"""bench adherence: the paired flip counts and the exact McNemar p-value."""

from __future__ import annotations

import math

import pytest

from bench.adherence import main, mcnemar_exact, paired_flips, paired_report
from bench.cpu import markdown


def test_paired_flips_count_each_object_both_ways():
    base = [{"correct": {"motion": [True, True], "colour": [True]}},
            {"correct": {"motion": [False], "colour": [False]}}]
    other = [{"correct": {"motion": [False, True], "colour": [True]}},
             {"correct": {"motion": [True], "colour": [False]}}]
    flips = paired_flips(base, other)
    assert flips["motion"] == {"lost": 1, "gained": 1, "items": 3}
    assert flips["colour"] == {"lost": 0, "gained": 0, "items": 2}
    with pytest.raises(ValueError, match="samples"):
        paired_flips(base, other[:1])


def test_mcnemar_exact_against_the_binomial():
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(3, 3) == 1.0
    # 8 lost, 1 gained: 2 * P(X <= 1), X ~ Binomial(9, 1/2)
    assert mcnemar_exact(8, 1) == pytest.approx(2 * (1 + 9) / 2 ** 9)
    assert mcnemar_exact(1, 8) == mcnemar_exact(8, 1)
    assert mcnemar_exact(20, 0) == pytest.approx(2 / 2 ** 20)
    assert mcnemar_exact(5, 4) > 0.5 and math.isfinite(mcnemar_exact(100, 90))
    with pytest.raises(ValueError, match="lost"):
        mcnemar_exact(-1, 2)


def test_paired_report_and_the_benchmark_table_show_the_change_and_the_split():
    base = [{"correct": {"motion": [True]}} for _ in range(9)] + [
        {"correct": {"motion": [False]}}]
    other = [{"correct": {"motion": [False]}} for _ in range(8)] + [
        {"correct": {"motion": [True]}}, {"correct": {"motion": [True]}}]
    flips = paired_report(base, other)["motion"]
    assert (flips["lost"], flips["gained"], flips["items"]) == (8, 1, 10)
    assert flips["points"] == -70.0
    assert flips["p_value"] == pytest.approx(mcnemar_exact(8, 1), abs=1e-4)
    stock = {"case": "embedded-t2v", "method": "baseline", "adherence": {"motion": 90.0}}
    mine = {"case": "embedded-t2v", "method": "ours", "adherence": {"motion": 20.0},
            "adherence_paired": {"motion": flips}}
    table = markdown([stock, mine], "cmd")
    assert "| embedded-t2v | baseline | 90.0 |" in table
    assert "| embedded-t2v | ours | 20.0 (-70.0; 8:1*) |" in table


@pytest.mark.parametrize("argv, message", [
    (["--profiles", "turbo"], "--profiles"),
    (["--steps", "0"], "--steps must be in [1, 200]"),
    (["--prompts", "3"], "--prompts must be in [8, 2000]"),
    (["--quality-prompts", "65"], "--quality-prompts must be in [0, 64]"),
])
def test_bad_arguments_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
