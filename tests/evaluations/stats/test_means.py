"""Means with intervals (Wilson, bootstrap) and pass@k."""

from __future__ import annotations

import math
import random
from statistics import NormalDist

import pytest

from coevo.evaluations.stats.base import Interval, InvalidStatisticsInput
from coevo.evaluations.stats.means import (
    ScoreSummary,
    mean_score_summary,
    pass_at_k,
    pass_at_k_summary,
    pass_rate_summary,
    per_task_means,
    per_task_pass_counts,
    wilson_interval,
)

Z_95 = 1.959963984540054


def _textbook_wilson(successes: int, n: int, z: float) -> tuple[float, float]:
    """Wilson (1927): (p + z²/2n ± z·sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n)."""
    p = successes / n
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    denominator = 1 + z * z / n
    return (centre - spread) / denominator, (centre + spread) / denominator


@pytest.mark.parametrize(
    ("successes", "n"), [(0, 10), (10, 10), (5, 10), (1, 1), (3, 164), (81, 164)]
)
def test_it_matches_the_textbook_formula_at_95_percent(successes, n):
    low, high = _textbook_wilson(successes, n, Z_95)

    interval = wilson_interval(successes, n)

    assert interval.low == pytest.approx(max(0.0, low), abs=1e-12)
    assert interval.high == pytest.approx(min(1.0, high), abs=1e-12)


def test_it_matches_published_values_for_five_of_ten():
    # 5/10 at 95%: (0.2366, 0.7634), e.g. Newcombe (1998), Table I.
    interval = wilson_interval(5, 10)

    assert interval.low == pytest.approx(0.236593, abs=1e-6)
    assert interval.high == pytest.approx(0.763407, abs=1e-6)


def test_it_starts_at_zero_for_no_successes():
    interval = wilson_interval(0, 10)

    assert interval.low == pytest.approx(0.0, abs=1e-12)
    assert interval.high == pytest.approx(Z_95**2 / (10 + Z_95**2), abs=1e-12)


def test_it_ends_at_one_for_all_successes():
    interval = wilson_interval(10, 10)

    assert interval.high == pytest.approx(1.0, abs=1e-12)
    assert interval.low == pytest.approx(10 / (10 + Z_95**2), abs=1e-12)


def test_it_is_symmetric_around_one_half():
    for n in (1, 7, 10, 164):
        for successes in range(n + 1):
            interval = wilson_interval(successes, n)
            mirror = wilson_interval(n - successes, n)
            assert interval.low == pytest.approx(1 - mirror.high, abs=1e-12)


@pytest.mark.parametrize("confidence", [0.5, 0.8, 0.9, 0.95, 0.99, 0.999])
def test_it_uses_the_normal_quantile_for_the_confidence(confidence):
    z = NormalDist().inv_cdf((1 + confidence) / 2)
    low, high = _textbook_wilson(7, 20, z)

    interval = wilson_interval(7, 20, confidence=confidence)

    assert (interval.low, interval.high) == pytest.approx((low, high), abs=1e-10)


def test_it_widens_with_the_confidence():
    widths = [
        wilson_interval(7, 20, confidence=c).high - wilson_interval(7, 20, confidence=c).low
        for c in (0.5, 0.8, 0.9, 0.95, 0.99)
    ]

    assert widths == sorted(widths)
    assert len(set(widths)) == len(widths)


def test_it_keeps_every_interval_within_zero_and_one():
    for n in (1, 2, 3, 10, 50, 164):
        for successes in range(n + 1):
            for confidence in (0.5, 0.95, 0.999):
                interval = wilson_interval(successes, n, confidence=confidence)
                assert 0.0 <= interval.low < interval.high <= 1.0


def test_it_contains_the_observed_rate_strictly_inside_away_from_the_extremes():
    for n in (2, 3, 10, 50, 164):
        for successes in range(1, n):
            interval = wilson_interval(successes, n)
            assert interval.low < successes / n < interval.high


def test_it_reaches_exactly_zero_and_one_at_the_extremes():
    # Mathematically the bound is exactly 0 at 0/n and exactly 1 at n/n; an interval that
    # stops at 0.9999999999999999 does not contain an all-pass rate of 1.0.
    off = [
        (successes, n, confidence, wilson_interval(successes, n, confidence=confidence))
        for n in (1, 3, 5, 7, 10, 20, 164)
        for confidence in (0.5, 0.9, 0.95, 0.99)
        for successes in (0, n)
    ]
    off = [
        case
        for case in off
        if (case[0] == 0 and case[3].low != 0.0) or (case[0] == case[1] and case[3].high != 1.0)
    ]

    assert off == []


def test_it_narrows_as_n_grows_at_a_fixed_rate():
    widths = []
    for n in (10, 20, 40, 80, 160, 320, 640):
        interval = wilson_interval(n // 2, n)
        widths.append(interval.high - interval.low)

    assert all(later < earlier for earlier, later in zip(widths, widths[1:], strict=False))
    assert widths[-1] < 0.08


@pytest.mark.parametrize(
    ("successes", "n", "confidence", "message"),
    [
        (0, 0, 0.95, "n must be positive"),
        (1, -3, 0.95, "n must be positive"),
        (-1, 10, 0.95, "successes"),
        (11, 10, 0.95, "successes"),
        (5, 10, 0.0, "confidence"),
        (5, 10, 1.0, "confidence"),
        (5, 10, 1.5, "confidence"),
        (5, 10, -0.95, "confidence"),
    ],
)
def test_it_refuses_bad_inputs(successes, n, confidence, message):
    with pytest.raises(ValueError, match=message):
        wilson_interval(successes, n, confidence=confidence)


def test_it_summarises_a_pass_rate():
    summary = pass_rate_summary(5, 10)

    assert summary == ScoreSummary(mean=0.5, interval=wilson_interval(5, 10), n=10, confidence=0.95)


def test_it_passes_the_confidence_through_to_the_interval():
    summary = pass_rate_summary(5, 10, confidence=0.9)

    assert summary.confidence == 0.9
    assert summary.interval == wilson_interval(5, 10, confidence=0.9)
    assert summary.interval != wilson_interval(5, 10)


def test_it_summarises_no_rollouts_without_a_mean_or_interval():
    summary = pass_rate_summary(0, 0)

    assert summary == ScoreSummary(mean=None, interval=None, n=0, confidence=0.95)


def test_it_refuses_more_passes_than_rollouts_in_a_summary():
    with pytest.raises(ValueError):
        pass_rate_summary(11, 10)


def test_it_exposes_plain_interval_values():
    interval = wilson_interval(3, 4)

    assert isinstance(interval, Interval)
    assert isinstance(interval.low, float) and isinstance(interval.high, float)


# --- pass@k ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 1, 0.4),  # c / n
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (3, 1, 2, 2 / 3),  # 1 - C(2,2)/C(3,2)
        (10, 0, 1, 0.0),
        (10, 0, 10, 0.0),
        (10, 10, 1, 1.0),
        (10, 10, 10, 1.0),
        (10, 8, 3, 1.0),  # fewer than k failures: every draw of 3 holds a pass
        (1000, 1, 1, 0.001),
    ],
)
def test_it_computes_hand_checked_pass_at_k(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-15)


def test_it_matches_the_product_form_of_pass_at_k_for_large_n():
    # Chen et al.'s numerically stable form: 1 - prod_{i=n-c+1}^{n} (1 - k/i).
    for n, c, k in [(200, 7, 50), (2000, 3, 500), (500, 250, 100)]:
        product = 1.0
        for i in range(n - c + 1, n + 1):
            product *= 1 - k / i
        assert pass_at_k(n, c, k) == pytest.approx(1 - product, rel=1e-12)


@pytest.mark.parametrize(("n", "c", "k"), [(5, 2, 6), (5, 2, 0), (5, 6, 1), (5, -1, 1), (0, 0, 1)])
def test_it_refuses_pass_at_k_outside_its_domain(n, c, k):
    with pytest.raises(InvalidStatisticsInput):
        pass_at_k(n, c, k)


def test_it_averages_pass_at_k_over_tasks():
    summary = pass_at_k_summary({"a": (5, 2), "b": (5, 0), "c": (5, 5)}, [1, 2])

    assert summary[1] == pytest.approx((0.4 + 0 + 1) / 3)
    assert summary[2] == pytest.approx((0.7 + 0 + 1) / 3)


def test_it_refuses_pass_at_k_above_the_fewest_samples_of_any_task():
    with pytest.raises(InvalidStatisticsInput, match="at least 4 epochs"):
        pass_at_k_summary([(5, 1), (3, 1)], [1, 4])


def test_it_counts_passes_per_task_for_pass_at_k():
    counts = per_task_pass_counts({"a": [1.0, 0.0, 1.0], "b": [0.0, 0.5]})

    assert counts == {"a": (3, 2), "b": (2, 0)}
    assert pass_at_k_summary(counts, [1])[1] == pytest.approx((2 / 3 + 0) / 2)


# --- means with intervals ---------------------------------------------------------------------


def test_it_uses_wilson_for_zero_one_scores():
    summary = mean_score_summary([1, 0, 1, 1, 0, 0, 0, 1, 0, 1])

    assert summary == pass_rate_summary(5, 10)
    assert summary.method == "wilson"


def test_it_bootstraps_graded_scores_deterministically_by_seed():
    scores = [0.1, 0.4, 0.35, 0.8, 0.5, 0.0, 1.0, 0.25, 0.6, 0.45]

    first = mean_score_summary(scores, seed=7)
    again = mean_score_summary(scores, seed=7)
    other = mean_score_summary(scores, seed=8)

    assert first == again
    assert first.method == "bootstrap"
    assert first.mean == pytest.approx(0.445)
    assert first.interval.low < 0.445 < first.interval.high
    assert other.interval != first.interval


def test_it_covers_the_true_mean_about_as_often_as_promised():
    rng = random.Random(3)
    covered = 0
    trials = 200
    for trial in range(trials):
        scores = [rng.betavariate(2, 3) for _ in range(60)]  # true mean 0.4
        interval = mean_score_summary(scores, seed=trial, resamples=500).interval
        covered += interval.low <= 0.4 <= interval.high

    assert 0.88 <= covered / trials <= 0.99


def test_it_averages_epochs_into_per_task_scores():
    means = per_task_means({"a": [1, 0, 1, 1], "b": [0.5]})

    assert means == {"a": 0.75, "b": 0.5}


@pytest.mark.parametrize("scores", [[0.5, 1.2], [-0.1], [float("nan")]])
def test_it_refuses_scores_outside_zero_and_one(scores):
    with pytest.raises(InvalidStatisticsInput, match=r"\[0, 1\]"):
        mean_score_summary(scores)


def test_it_summarises_no_scores_without_a_mean():
    assert mean_score_summary([]).mean is None
