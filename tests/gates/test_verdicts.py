"""Each verdict rule on hand-made evaluation results (docs/api.md, Gates)."""

from __future__ import annotations

import pytest

from coevo.evaluations.models import (
    EvaluationState,
)
from coevo.evaluations.stats.paired import MIN_INTERVAL_TASKS
from coevo.gates.models import Gate, GateState
from coevo.gates.policy import GatePolicy
from coevo.gates.services import gate_advance, gate_advance_ready
from coevo.gates.verdict import EvaluationFacts, gate_decide
from tests.gates.conftest import validation_keys
from tests.support.factories import finish_evaluation
from workers.outcomes import RolloutOutcome

pytestmark = pytest.mark.django_db


def decide(gate: Gate) -> Gate:
    gate = gate_advance(gate_id=gate.id)
    assert gate.state == GateState.FINISHED, gate.state_detail
    return gate


def outcome_of(gate: Gate, rule: str) -> str:
    (reason,) = [r for r in gate.reasons if r["rule"] == rule]
    return reason["outcome"]


def test_it_passes_a_candidate_that_meets_every_rule(make_gate, humaneval_suite):
    keys = validation_keys(humaneval_suite)
    half = keys[: len(keys) // 2]
    gate = make_gate(
        min_score=0.4,
        max_regression=0.05,
        critical_tasks=half[:2],
        max_error_rate=0.1,
    )
    finish_evaluation(gate.baseline_evaluation, passed=half)
    finish_evaluation(gate.candidate_evaluation, passed=half + keys[-2:])

    gate = decide(gate)

    assert gate.verdict == "pass"
    assert [r["rule"] for r in gate.reasons] == [
        "min_score",
        "max_regression",
        "critical_tasks",
        "max_error_rate",
    ]
    assert {r["outcome"] for r in gate.reasons} == {"pass"}
    stats = gate.statistics
    assert stats["candidate"]["n_tasks"] == len(keys)
    assert stats["candidate"]["mean"] == pytest.approx((len(half) + 2) / len(keys))
    assert stats["baseline"]["mean"] == pytest.approx(len(half) / len(keys))
    assert stats["comparison"]["delta"] == pytest.approx(2 / len(keys))
    assert stats["comparison"]["flips"] == {"fixed": sorted(keys[-2:]), "broken": []}
    assert 0 < stats["comparison"]["p_value"] <= 1
    assert stats["candidate"]["ci_low"] < stats["candidate"]["mean"] < stats["candidate"]["ci_high"]
    assert gate.finished_at is not None


def test_it_fails_a_candidate_whose_score_is_surely_below_the_minimum(make_gate, humaneval_suite):
    keys = validation_keys(humaneval_suite)
    gate = make_gate(min_score=0.5)
    finish_evaluation(gate.baseline_evaluation, passed=keys)
    finish_evaluation(gate.candidate_evaluation, passed=keys[:2])

    gate = decide(gate)

    assert gate.verdict == "fail"
    assert outcome_of(gate, "min_score") == "fail"
    assert "below the minimum 0.5" in gate.reasons[0]["message"]
    assert gate.statistics["candidate"]["ci_high"] < 0.5


def test_it_fails_a_candidate_that_regresses_beyond_the_allowed_margin(make_gate, humaneval_suite):
    keys = validation_keys(humaneval_suite)
    gate = make_gate(max_regression=0.1)
    finish_evaluation(gate.baseline_evaluation, passed=keys)
    finish_evaluation(gate.candidate_evaluation, passed=keys[: len(keys) // 3])

    gate = decide(gate)

    assert gate.verdict == "fail"
    assert outcome_of(gate, "max_regression") == "fail"
    comparison = gate.statistics["comparison"]
    assert comparison["ci_high"] < -0.1
    assert len(comparison["flips"]["broken"]) == len(keys) - len(keys) // 3


def test_it_is_inconclusive_when_the_interval_straddles_the_threshold(make_gate, humaneval_suite):
    keys = validation_keys(humaneval_suite)
    # A mean a little under the minimum, with an interval (n ≈ 30 tasks) that reaches it.
    passed = keys[: int(len(keys) * 0.45)]
    gate = make_gate(min_score=0.5, max_regression=0.2)
    finish_evaluation(gate.baseline_evaluation, passed=passed)
    finish_evaluation(gate.candidate_evaluation, passed=passed)

    gate = decide(gate)

    assert outcome_of(gate, "min_score") == "inconclusive"
    assert outcome_of(gate, "max_regression") == "pass"  # identical results: delta 0
    assert gate.verdict == "inconclusive"
    stats = gate.statistics["candidate"]
    assert stats["mean"] < 0.5 <= stats["ci_high"]


def test_it_fails_on_a_newly_failing_critical_task_and_names_it(make_gate, humaneval_suite):
    keys = validation_keys(humaneval_suite)
    broken, kept, always_failing = keys[0], keys[1], keys[2]
    gate = make_gate(critical_tasks=[broken, kept, always_failing])
    finish_evaluation(gate.baseline_evaluation, passed=[k for k in keys if k != always_failing])
    # The candidate is better overall, but breaks one critical task.
    finish_evaluation(
        gate.candidate_evaluation,
        passed=[k for k in keys if k not in (broken, always_failing)],
    )

    gate = decide(gate)

    assert gate.verdict == "fail"
    (reason,) = gate.reasons
    assert reason["rule"] == "critical_tasks" and reason["outcome"] == "fail"
    assert broken in reason["message"]
    assert kept not in reason["message"] and always_failing not in reason["message"]


def test_it_does_not_fail_a_critical_task_that_already_failed(make_gate, humaneval_suite):
    keys = validation_keys(humaneval_suite)
    gate = make_gate(critical_tasks=[keys[0]])
    finish_evaluation(gate.baseline_evaluation, passed=keys[1:])
    finish_evaluation(gate.candidate_evaluation, passed=keys[1:])

    gate = decide(gate)

    assert gate.verdict == "pass"
    assert "already failed on the baseline" in gate.reasons[0]["message"]


def test_it_fails_a_candidate_with_too_many_errors(make_gate, humaneval_suite):
    keys = validation_keys(humaneval_suite)
    errors = {key: RolloutOutcome.HARNESS_ERROR for key in keys[:4]}
    gate = make_gate(max_error_rate=0.1)
    finish_evaluation(gate.baseline_evaluation, passed=keys)
    finish_evaluation(gate.candidate_evaluation, passed=keys, outcomes=errors)

    gate = decide(gate)

    assert gate.verdict == "fail"
    assert "4 of" in gate.reasons[0]["message"]
    assert gate.statistics["errors"]["candidate"]["harness_error"] == 4
    assert gate.statistics["errors"]["candidate"]["rate"] == pytest.approx(4 / len(keys))


def test_it_passes_an_error_rate_within_the_maximum(make_gate, humaneval_suite):
    keys = validation_keys(humaneval_suite)
    gate = make_gate(max_error_rate=0.1)
    finish_evaluation(gate.baseline_evaluation, passed=keys)
    finish_evaluation(
        gate.candidate_evaluation, passed=keys, outcomes={keys[0]: RolloutOutcome.HARNESS_ERROR}
    )

    assert decide(gate).verdict == "pass"


@pytest.mark.parametrize("state", [EvaluationState.FAILED, EvaluationState.CANCELLED])
def test_it_errs_when_an_evaluation_did_not_finish(make_gate, humaneval_suite, state):
    keys = validation_keys(humaneval_suite)
    gate = make_gate(min_score=0.1)
    finish_evaluation(gate.baseline_evaluation, passed=keys)
    finish_evaluation(
        gate.candidate_evaluation,
        passed=keys,
        outcomes={keys[0]: RolloutOutcome.INFRA_ERROR},
        state=state,
        detail="1 rollout(s) could not run",
    )

    gate = decide(gate)

    assert gate.verdict == "error"
    (reason,) = gate.reasons
    assert reason["rule"] == "evaluations"
    assert f"candidate's evaluation {state}" in reason["message"]
    assert "could not run" in reason["message"]


def test_it_waits_while_an_evaluation_runs_and_decides_once(make_gate, humaneval_suite):
    keys = validation_keys(humaneval_suite)
    gate = make_gate(min_score=0.1)
    assert gate.state == GateState.PENDING
    finish_evaluation(gate.baseline_evaluation, passed=keys)
    finish_evaluation(gate.candidate_evaluation, passed=keys, state=EvaluationState.RUNNING)

    waiting = gate_advance(gate_id=gate.id)
    waiting.refresh_from_db()
    assert waiting.state == GateState.RUNNING and waiting.verdict == ""

    finish_evaluation(gate.candidate_evaluation, passed=keys)
    first = gate_advance(gate_id=gate.id)
    again = gate_advance(gate_id=gate.id)
    assert first.verdict == again.verdict == "pass"
    assert again.finished_at == first.finished_at


def test_it_finishes_gates_that_missed_their_signal(make_gate, humaneval_suite):
    keys = validation_keys(humaneval_suite)
    ready, waiting = make_gate(min_score=0.1), make_gate(min_score=0.1)
    for gate in (ready, waiting):
        finish_evaluation(gate.baseline_evaluation, passed=keys)
    finish_evaluation(ready.candidate_evaluation, passed=keys)

    assert gate_advance_ready() == 1

    ready.refresh_from_db()
    waiting.refresh_from_db()
    assert ready.verdict == "pass"
    assert not waiting.is_final


def test_beat_runs_the_catch_up_job(settings):
    from coevo.celery import app

    app.loader.import_default_modules()  # what a worker does at start: autodiscovery
    schedule = settings.CELERY_BEAT_SCHEDULE["gates-advance"]
    assert schedule["task"] == "coevo.gates.tasks.gates_advance_ready"
    assert schedule["task"] in app.tasks
    assert "coevo.gates.tasks.gate_advance" in app.tasks


# -- too few tasks for an interval (issue 38) -------------------------------------------------


def facts(label: str, scores: dict[str, list[float]]) -> EvaluationFacts:
    return EvaluationFacts(label=label, state=EvaluationState.FINISHED, scores=scores)


def test_it_judges_no_regression_on_a_bootstrap_interval_over_two_tasks():
    # Both tasks fixed: the bootstrap interval is [+100, +100] pts while the exact McNemar
    # test gives p = 0.5. Two tasks are too few for the interval the rule is judged on.
    decision = gate_decide(
        policy=GatePolicy.build(max_regression=0.1),
        baseline=facts("baseline", {"a": [0.0], "b": [0.0]}),
        candidate=facts("candidate", {"a": [1.0], "b": [1.0]}),
    )
    assert decision.verdict == "inconclusive"
    (reason,) = decision.reasons
    assert reason["outcome"] == "inconclusive"
    assert (
        "over 2 tasks: too few tasks for the interval this rule is judged on" in (reason["message"])
    )
    assert decision.statistics["comparison"]["ci_low"] == 1.0  # stored, not judged on


def test_it_judges_regression_from_ten_tasks_on():
    keys = [f"t{i}" for i in range(MIN_INTERVAL_TASKS)]
    decision = gate_decide(
        policy=GatePolicy.build(max_regression=0.1),
        baseline=facts("baseline", {k: [0.0] for k in keys}),
        candidate=facts("candidate", {k: [1.0] for k in keys}),
    )
    assert decision.verdict == "pass"


def test_a_bootstrap_interval_over_three_graded_tasks_fails_no_minimum():
    # The upper bound of a bootstrap over 3 tasks is about their largest score (0.2 < 0.5):
    # it read as "surely below the minimum"; now the rule says too few tasks.
    decision = gate_decide(
        policy=GatePolicy.build(min_score=0.5),
        baseline=facts("baseline", {"a": [0.1], "b": [0.2], "c": [0.1]}),
        candidate=facts("candidate", {"a": [0.1], "b": [0.2], "c": [0.1]}),
    )
    assert decision.statistics["candidate"]["method"] == "bootstrap"
    assert decision.statistics["candidate"]["ci_high"] < 0.5
    (reason,) = decision.reasons
    assert reason["outcome"] == "inconclusive" and "too few for an interval" in reason["message"]


def test_a_wilson_interval_over_three_tasks_still_fails_a_minimum():
    # Wilson holds its level at any n: 0 of 3 passed is surely below 0.9.
    decision = gate_decide(
        policy=GatePolicy.build(min_score=0.9),
        baseline=facts("baseline", {"a": [0.0], "b": [0.0], "c": [0.0]}),
        candidate=facts("candidate", {"a": [0.0], "b": [0.0], "c": [0.0]}),
    )
    assert decision.verdict == "fail"
