"""bench adherence: the paired flip counts and the exact McNemar p-value."""

from __future__ import annotations

import math

import pytest

from bench.adherence import main, mcnemar_exact, paired_flips


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


@pytest.mark.parametrize("argv, message", [
    (["--profiles", "turbo"], "--profiles"),
    (["--steps", "0"], "--steps must be in [1, 200]"),
    (["--prompts", "3"], "--prompts must be in [8, 2000]"),
])
def test_bad_arguments_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
