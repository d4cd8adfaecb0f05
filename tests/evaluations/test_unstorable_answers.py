"""A harness's answer, and the details that quote it, are stored whatever they hold: NUL, a
lone surrogate, NaN, nesting. PostgreSQL refuses each as it is, and a refused write used to kill
the task, so the watchdog retried it and the rollout ended as an infra_error, never scored: a
harness could turn the tasks it fails into tasks that do not count. Now the rollout ends as the
verifier says, with the answer stored as coevo.evaluations.storable makes it, or as a
harness_error when it cannot be stored; never as an infra_error, never left running."""

from __future__ import annotations

import textwrap

import pytest

from coevo.evaluations.models import (
    EvaluationState,
    Rollout,
    TraceStep,
)
from coevo.evaluations.selectors import evaluation_progress
from coevo.evaluations.services import (
    RolloutRetry,
    rollout_claim,
    rollout_execute,
    rollout_finish,
)
from coevo.evaluations.services import rollouts as rollouts_service
from coevo.evaluations.storable import MAX_DEPTH
from coevo.evaluations.traces import trace_step_payload
from tests.conftest import wait_until_final
from tests.evaluations.test_error_kinds import pending_rollout
from tests.evaluations.test_storable import nested
from tests.support.factories import evaluate_search as evaluate
from tests.support.factories import jsonl_rows, make_agent_candidate, make_jsonl_suite
from workers.outcomes import RolloutOutcome

pytestmark = pytest.mark.django_db(transaction=True)

# The numeric scorer reads the last number in the answer: "4" and "4<NUL>" both answer 2 + 2.
TASKS = [("four", "2 + 2 =", "4"), ("six", "3 + 3 =", "6")]

AGENTS = {
    "nul": r"""
        def run(task, ctx):
            return "4\x00"
        """,
    # The runtime cannot encode a lone surrogate, so the harness writes the message itself: a
    # JSON escape that the worker parses into one.
    "surrogate": r"""
        import os, sys

        def run(task, ctx):
            sys.stdout.buffer.write(b'{"type": "answer", "answer": "4\\ud800"}\n')
            sys.stdout.buffer.flush()
            os._exit(0)
        """,
    "nan": """
        def run(task, ctx):
            return float("nan")
        """,
    "raises": r"""
        def run(task, ctx):
            raise RuntimeError("bad\x00news")
        """,
}


@pytest.fixture
def numeric_suite(project):
    return make_jsonl_suite(
        project, jsonl_rows(TASKS, split="search"), name="sums", scorer="numeric"
    )


def candidate_answering(project, tmp_path, name: str):
    return make_agent_candidate(project, tmp_path, name, textwrap.dedent(AGENTS[name]))


def answer_step(rollout: Rollout):
    return trace_step_payload(TraceStep.objects.get(rollout=rollout, kind="answer"))


@pytest.mark.parametrize(
    ("agent", "outcome", "answer"),
    [
        ("nul", RolloutOutcome.PASSED, "4\ufffd"),
        ("surrogate", RolloutOutcome.PASSED, "4\ufffd"),
        ("nan", RolloutOutcome.TASK_FAILURE, "NaN"),
    ],
)
def test_it_scores_an_answer_postgresql_refuses_and_stores_it_replaced(
    empty_queue,
    settings,
    project,
    tmp_path,
    numeric_suite,
    policy_version,
    agent,
    outcome,
    answer,
):
    settings.COEVO_ROLLOUT_MAX_ATTEMPTS = 1  # an infra error would end the rollout at once
    candidate = candidate_answering(project, tmp_path, agent)
    rollout = Rollout.objects.get(
        evaluation=evaluate(candidate, numeric_suite, policy_version, tasks=1)
    )

    rollout_execute(rollout_id=rollout.id, worker="test")

    rollout.refresh_from_db()
    assert (rollout.state, rollout.outcome) == ("done", outcome), rollout.detail
    assert rollout.answer == answer
    assert rollout.error_kind == ""
    assert answer_step(rollout) == {"answer": answer}


def test_it_stores_the_message_of_a_harness_that_raised_with_a_nul(
    empty_queue, settings, project, tmp_path, numeric_suite, policy_version
):
    settings.COEVO_ROLLOUT_MAX_ATTEMPTS = 1
    candidate = candidate_answering(project, tmp_path, "raises")
    rollout = Rollout.objects.get(
        evaluation=evaluate(candidate, numeric_suite, policy_version, tasks=1)
    )

    rollout_execute(rollout_id=rollout.id, worker="test")

    rollout.refresh_from_db()
    assert (rollout.state, rollout.outcome, rollout.error_kind) == (
        "done",
        RolloutOutcome.HARNESS_ERROR,
        "exception",
    )
    assert rollout.detail == "the harness raised RuntimeError: bad\ufffdnews"


def test_it_finishes_an_evaluation_whose_harness_answers_with_a_nul_on_a_real_worker(
    celery_worker_thread, project, tmp_path, numeric_suite, policy_version
):
    candidate = candidate_answering(project, tmp_path, "nul")

    evaluation = evaluate(candidate, numeric_suite, policy_version, tasks=2)
    wait_until_final(evaluation, timeout_s=60)

    assert evaluation.state == EvaluationState.FINISHED
    outcomes = dict(
        Rollout.objects.filter(evaluation=evaluation).values_list("task__key", "outcome")
    )
    assert outcomes == {"four": RolloutOutcome.PASSED, "six": RolloutOutcome.TASK_FAILURE}
    progress = evaluation_progress(evaluation=evaluation)
    # The failed task counts: 1 of 2, not 1 of the 1 that could be stored.
    assert progress.infra_errors == 0 and progress.score.mean == 0.5


@pytest.mark.parametrize(
    ("outcome", "score"), [(RolloutOutcome.PASSED, 1.0), (RolloutOutcome.TASK_FAILURE, 0.0)]
)
@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 50_000])
def test_it_ends_a_rollout_whose_answer_cannot_be_stored_as_a_harness_error(
    empty_queue, seed_candidate, humaneval_suite, policy_version, outcome, score, depth
):
    rollout = rollout_claim(
        rollout_id=pending_rollout(seed_candidate, humaneval_suite, policy_version).id,
        worker="test",
    )

    assert rollout_finish(
        rollout=rollout, outcome=outcome, score=score, detail="ok", answer=nested(depth)
    )

    stored = Rollout.objects.get(id=rollout.id)
    assert (stored.state, stored.outcome, stored.error_kind) == ("done", "harness_error", "limit")
    assert stored.score == 0.0 and stored.answer is None
    assert stored.detail == (
        f"limit exceeded: the answer cannot be stored: it is nested more than {MAX_DEPTH} "
        "levels deep; return a flatter value"
    )


def test_it_keeps_an_unscored_outcome_when_the_answer_cannot_be_stored(
    empty_queue, seed_candidate, humaneval_suite, policy_version
):
    rollout = rollout_claim(
        rollout_id=pending_rollout(seed_candidate, humaneval_suite, policy_version).id,
        worker="test",
    )

    rollout_finish(
        rollout=rollout,
        outcome=RolloutOutcome.INFRA_ERROR,
        score=None,
        detail="sandbox \x00 gone",
        error_kind="sandbox",
        answer=nested(MAX_DEPTH + 1),
    )

    stored = Rollout.objects.get(id=rollout.id)
    assert (stored.outcome, stored.error_kind, stored.answer) == ("infra_error", "sandbox", None)
    assert stored.detail == "sandbox \ufffd gone"


def test_it_stores_the_detail_of_an_infra_error_it_retries(
    empty_queue, seed_candidate, humaneval_suite, policy_version, settings, monkeypatch
):
    settings.COEVO_ROLLOUT_MAX_ATTEMPTS = 2

    def broken(**kwargs):
        raise OSError(f"the verifier quoted \x00 and {chr(0xD800)}")

    monkeypatch.setattr(rollouts_service, "_rollout_run_in_sandbox", broken)
    rollout = pending_rollout(seed_candidate, humaneval_suite, policy_version)

    with pytest.raises(RolloutRetry):
        rollout_execute(rollout_id=rollout.id, worker="test")

    rollout.refresh_from_db()
    assert rollout.state == "pending"
    assert (
        rollout.detail == "attempt 1: worker error: OSError: the verifier quoted \ufffd and \ufffd"
    )
