"""Sequential early stopping of a paired evaluation (anytime-valid)."""

from __future__ import annotations

import math
import random

import pytest

from coevo.evaluations.stats.base import InvalidStatisticsInput
from coevo.evaluations.stats.sequential import sequential_paired_decision


def test_it_computes_the_mixture_p_value_by_hand():
    # M = 2^n B(F + 1/2, B + 1/2) / B(1/2, 1/2): 1 after one discordant task, 3/2 after 2-0;
    # 2^7 Gamma(7.5) Gamma(0.5) / (Gamma(8) pi) = 26.81... after 7-0.
    assert sequential_paired_decision(1, 0).p_value == pytest.approx(1.0)
    assert sequential_paired_decision(2, 0).p_value == pytest.approx(2 / 3)
    seven = 2**7 * math.gamma(7.5) * math.gamma(0.5) / (math.gamma(8) * math.pi)
    assert sequential_paired_decision(0, 7).p_value == pytest.approx(1 / seven)


def test_it_stops_a_lopsided_comparison_with_a_reason():
    decision = sequential_paired_decision(0, 7, tasks=23)

    assert decision.stop and decision.direction == "worse"
    assert decision.reason == (
        "stopped after 23 tasks: clearly worse than the reference "
        "(7 broken, 0 fixed; anytime-valid p = 0.0373 < 0.05)"
    )
    assert sequential_paired_decision(7, 0).direction == "better"
    assert not sequential_paired_decision(0, 6).stop  # exact McNemar would say 0.03 here


def test_it_never_stops_on_perfectly_balanced_data():
    for t in range(0, 2000, 2):
        assert not sequential_paired_decision(t // 2, t // 2, tasks=t).stop


def test_it_rarely_stops_on_balanced_data_although_checked_after_every_task():
    rng = random.Random(11)
    stopped = 0
    for _ in range(300):
        fixed = broken = 0
        for _ in range(100):  # discordant tasks, each way with probability 1/2
            if rng.random() < 0.5:
                fixed += 1
            else:
                broken += 1
            if sequential_paired_decision(fixed, broken).stop:
                stopped += 1
                break

    assert stopped / 300 <= 0.05


def test_it_stops_early_on_lopsided_data():
    rng = random.Random(12)
    lengths = []
    for _ in range(100):
        fixed = broken = 0
        while not sequential_paired_decision(fixed, broken).stop:
            if rng.random() < 0.9:
                broken += 1
            else:
                fixed += 1
        lengths.append(fixed + broken)
        assert sequential_paired_decision(fixed, broken).direction == "worse"

    assert max(lengths) < 40


def test_it_refuses_inconsistent_counts():
    with pytest.raises(InvalidStatisticsInput, match="cannot be fewer"):
        sequential_paired_decision(3, 4, tasks=5)
