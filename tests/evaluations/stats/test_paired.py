"""Paired comparison of two evaluations: flips, the exact McNemar / sign test, the paired
bootstrap."""

from __future__ import annotations

import json
import random

import pytest

from coevo.evaluations.stats.paired import (
    MIN_INTERVAL_TASKS,
    PairedComparison,
    paired_comparison,
    sign_test_p_value,
    too_few_tasks_note,
)


@pytest.mark.parametrize(
    ("wins", "losses", "expected"),
    [
        (1, 6, 0.125),  # 2 * (C(7,0) + C(7,1)) / 2^7 = 2 * 8 / 128
        (6, 1, 0.125),
        (0, 5, 0.0625),  # 2 / 2^5
        (10, 0, 0.001953125),  # 2 / 2^10
        (3, 3, 1.0),
        (0, 0, 1.0),
        (2, 8, 0.109375),  # 2 * (1 + 10 + 45) / 1024
    ],
)
def test_it_computes_the_exact_mcnemar_p_value(wins, losses, expected):
    assert sign_test_p_value(wins, losses) == pytest.approx(expected, abs=1e-15)


def test_it_classifies_flips_and_drops_unshared_tasks():
    reference = {"a": [1], "b": [0], "c": [1], "d": [0], "only-ref": [1]}
    candidate = {"a": [1], "b": [1], "c": [0], "d": [0], "only-cand": [0]}

    result = paired_comparison(reference, candidate)

    assert result.kind == "binary"
    assert result.flips == {
        "fixed": ("b",),
        "broken": ("c",),
        "both_pass": ("a",),
        "both_fail": ("d",),
    }
    assert (result.tasks, result.reference_only, result.candidate_only) == (4, 1, 1)
    assert result.difference == 0.0
    assert result.p_value == 1.0
    assert result.verdict == "no significant difference"


def test_it_finds_a_clear_improvement_significant():
    reference = {f"t{i}": [0.0] if i < 10 else [float(i % 2)] for i in range(20)}
    candidate = {f"t{i}": [1.0] if i < 10 else [float(i % 2)] for i in range(20)}

    result = paired_comparison(reference, candidate)

    assert len(result.flips["fixed"]) == 10 and result.flips["broken"] == ()
    assert result.p_value == pytest.approx(0.001953125)
    assert result.difference == pytest.approx(0.5)
    assert result.interval.low > 0
    assert result.significant and result.verdict == "better"
    assert paired_comparison(candidate, reference).verdict == "worse"


def test_it_compares_epochs_by_per_task_pass_rate_with_a_sign_test():
    reference = {"a": [1, 0], "b": [0, 0], "c": [1, 1], "d": [0, 1]}
    candidate = {"a": [1, 1], "b": [0, 1], "c": [1, 0], "d": [1, 0]}

    result = paired_comparison(reference, candidate)

    assert result.kind == "graded"
    assert result.flips == {"improved": ("a", "b"), "regressed": ("c",), "tied": ("d",)}
    assert result.difference == pytest.approx((0.5 + 0.5 - 0.5 + 0) / 4)
    assert result.p_value == sign_test_p_value(2, 1) == 1.0


def test_it_bootstraps_the_paired_difference_deterministically_by_seed():
    rng = random.Random(5)
    reference = {i: [float(rng.random() < 0.5)] for i in range(80)}
    candidate = {i: [float(rng.random() < 0.6)] for i in range(80)}

    first = paired_comparison(reference, candidate, seed=1)

    assert first == paired_comparison(reference, candidate, seed=1)
    assert first.interval != paired_comparison(reference, candidate, seed=2).interval
    assert first.interval.low < first.difference < first.interval.high


def test_it_serialises_a_comparison_to_json():
    result = paired_comparison({"a": [1], "b": [0]}, {"a": [0], "b": [1]})

    data = json.loads(json.dumps(result.as_dict()))

    assert data["flips"]["fixed"] == ["b"] and data["flip_counts"]["broken"] == 1
    assert data["test"] == "exact McNemar" and data["verdict"] == "no significant difference"


def test_it_compares_no_shared_tasks_without_a_difference():
    result = paired_comparison({"a": [1]}, {"b": [1]})

    assert result.tasks == 0 and result.difference is None and not result.significant


def test_it_shows_no_numeric_interval_beside_an_exact_test_on_two_tasks():
    # Issue 38's page: "no significant difference · +62.5 pts [+25.0, +100.0] · p = 0.5".
    result = paired_comparison({"a": [0.25], "b": [0.0]}, {"a": [0.75], "b": [0.75]})
    assert result.tasks == 2 and result.test == "exact sign test"
    assert result.p_value == 0.5 and result.verdict == "no significant difference"
    assert result.difference == pytest.approx(0.625)
    assert result.interval is not None and result.interval.low > 0  # the bootstrap's numbers
    assert result.shown_interval is None
    assert result.interval_note == "too few tasks (n=2) for an interval"
    assert result.score_name == "mean per-task score"


def test_it_withholds_an_interval_that_contradicts_the_exact_test():
    # Six large wins and four small losses: the mean difference is clearly positive, but the
    # sign test (6 vs 4) is not significant; the page shows the test's verdict only.
    reference = {f"t{i}": [0.5] for i in range(MIN_INTERVAL_TASKS)}
    candidate = {f"t{i}": [1.0 if i < 6 else 0.49] for i in range(MIN_INTERVAL_TASKS)}
    result = paired_comparison(reference, candidate)
    assert result.verdict == "no significant difference"
    assert result.interval is not None and result.interval.low > 0
    assert result.shown_interval is None
    assert "the test decides" in result.interval_note


def test_it_shows_the_interval_when_enough_tasks_agree_with_the_test():
    reference = {f"t{i}": [0] for i in range(MIN_INTERVAL_TASKS)}
    candidate = {f"t{i}": [1] for i in range(MIN_INTERVAL_TASKS)}
    result = paired_comparison(reference, candidate)
    assert result.verdict == "better" and result.score_name == "pass rate"
    assert result.shown_interval == result.interval and result.interval_note is None


@pytest.mark.parametrize(
    ("reference", "candidate"),
    [
        ({"a": [0.25], "b": [0.0]}, {"a": [0.75], "b": [0.75]}),  # graded
        ({f"t{i}": [i % 2] for i in range(12)}, {f"t{i}": [1] for i in range(12)}),  # binary
        ({"a": [1]}, {"b": [1]}),  # nothing shared
    ],
)
def test_a_stored_comparison_reads_back_with_the_same_verdict_and_interval_rule(
    reference, candidate
):
    # Promotion evidence stores as_dict() as JSON; the page rebuilds it with from_dict.
    live = paired_comparison(reference, candidate)
    stored = PairedComparison.from_dict(json.loads(json.dumps(live.as_dict())))
    assert stored.as_dict() == json.loads(json.dumps(live.as_dict()))
    assert (stored.verdict, stored.test, stored.score_name) == (
        live.verdict,
        live.test,
        live.score_name,
    )
    assert (stored.shown_interval, stored.interval_note) == (
        live.shown_interval,
        live.interval_note,
    )


@pytest.mark.parametrize(
    ("tasks", "note"),
    [
        (0, None),
        (2, "too few tasks (n=2) for an interval"),
        (9, "too few tasks (n=9) for an interval"),
        (MIN_INTERVAL_TASKS, None),
    ],
)
def test_too_few_tasks_is_below_ten(tasks, note):
    assert too_few_tasks_note(tasks) == note
