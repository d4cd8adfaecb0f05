"""A policy server that was down when a rollout asked is an outage, however short (issue 40,
item 6): the attempt is not counted, the evaluation pauses, and the watchdog resumes it once the
server answers. A server that is up but cannot serve the request (no concurrency slot, busy)
costs the rollout an attempt and pauses nothing. A real Celery worker over the real broker, and
the scripted policy server, restarted for real."""

from __future__ import annotations

import time

import pytest

from coevo.evaluations.models import (
    EVALUATION_FINAL_STATES,
    Evaluation,
    EvaluationState,
    PauseKind,
    Rollout,
    RolloutState,
    TraceStep,
)
from coevo.evaluations.services import evaluations_resume_paused
from coevo.policies.concurrency import EndpointLimiter
from coevo.policies.models import PolicyEndpoint
from coevo.policies.services import policy_endpoints_check
from tests.conftest import wait_until_final
from tests.evaluations.test_worker import CORRECT_BODIES
from tests.support.factories import evaluate_search as evaluate
from workers.outcomes import ErrorKind, RolloutOutcome

pytestmark = pytest.mark.timeout(180)

TASKS = 4


def wait_for(condition, *, timeout_s: float, what: str, watchdog: bool = False) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if watchdog:
            evaluations_resume_paused()  # as beat's watchdog calls it
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def test_a_policy_restart_just_before_an_evaluation_is_an_outage_not_a_failure(
    celery_worker_thread, seed_candidate, humaneval_suite, policy_version, scripted_server, settings
):
    scripted_server.policy.rules.extend(CORRECT_BODIES.items())
    # Paused at its first outage (3 by default: the 8 rollouts of the restart passed it).
    settings.COEVO_INFRA_PAUSE_THRESHOLD = 1
    settings.COEVO_ROLLOUT_RETRY_BASE_S = 0
    endpoint = policy_version.endpoint
    # The restart: beat's health check finds the server gone, and it is back a second later,
    # before the evaluation starts. The endpoint stays marked unhealthy until a probe answers.
    scripted_server.stop()
    assert policy_endpoints_check() == {endpoint.name: False}
    time.sleep(1)
    scripted_server.start()

    evaluation = evaluate(seed_candidate, humaneval_suite, policy_version, tasks=TASKS)
    wait_for(
        lambda: (
            Evaluation.objects.get(id=evaluation.id).state
            in (EvaluationState.PAUSED, *EVALUATION_FINAL_STATES)
        ),
        timeout_s=60,
        what="the evaluation to pause or end",
    )

    # The first rollout found no healthy endpoint. The probe made right after its failure
    # already answered, yet the failure was the server's: an outage, its attempt not counted.
    evaluation.refresh_from_db()
    assert evaluation.state == EvaluationState.PAUSED, evaluation.state_detail
    assert evaluation.pause_kind == PauseKind.POLICY_OUTAGE
    assert evaluation.policy_outages == 1
    assert "resumes by itself" in evaluation.state_detail
    hit = Rollout.objects.get(evaluation=evaluation, forgiven_attempts=1)
    assert (hit.state, hit.attempts) == (RolloutState.PENDING, 1), hit.detail
    assert "marked unhealthy" in hit.detail and "attempt not counted" in hit.detail
    assert PolicyEndpoint.objects.get(id=endpoint.id).healthy  # that probe marked it again

    # The watchdog's next run finds the server answering and resumes; nobody else acts.
    wait_for(
        lambda: Evaluation.objects.get(id=evaluation.id).is_final,
        timeout_s=90,
        what="the evaluation to resume and finish",
        watchdog=True,
    )
    evaluation.refresh_from_db()
    assert evaluation.state == EvaluationState.FINISHED, evaluation.state_detail
    rollouts = list(Rollout.objects.filter(evaluation=evaluation).select_related("task"))
    assert len(rollouts) == TASKS
    for rollout in rollouts:
        assert rollout.state == RolloutState.DONE
        assert rollout.outcome in (RolloutOutcome.PASSED, RolloutOutcome.TASK_FAILURE), (
            rollout.detail
        )
        assert rollout.attempts - rollout.forgiven_attempts == 1, rollout.detail
        verdicts = TraceStep.objects.filter(rollout=rollout, kind="verdict")
        assert list(verdicts.values_list("attempt", flat=True)) == [rollout.attempts]
    hit.refresh_from_db()
    assert (hit.attempts, hit.forgiven_attempts) == (2, 1)
    assert {r.task.key for r in rollouts if r.outcome == RolloutOutcome.PASSED} == {
        "HumanEval/3",
        "HumanEval/7",
    }
    assert len(scripted_server.policy.requests) == TASKS  # the failed attempt asked nothing


def test_a_rollout_that_gets_no_policy_slot_uses_up_its_attempts_and_pauses_nothing(
    celery_worker_thread, seed_candidate, humaneval_suite, policy_version, settings
):
    # The server is up, but its only slot is held elsewhere for as long as the rollout tries:
    # capacity, not an outage. Each attempt waits COEVO_POLICY_SLOT_WAIT_S, then backs off.
    settings.COEVO_POLICY_SLOT_WAIT_S = 1
    settings.COEVO_ROLLOUT_MAX_ATTEMPTS = 2
    settings.COEVO_ROLLOUT_RETRY_BASE_S = 1
    settings.COEVO_INFRA_PAUSE_THRESHOLD = 1
    endpoint_id = policy_version.endpoint_id
    PolicyEndpoint.objects.filter(id=endpoint_id).update(max_concurrency=1)
    other = EndpointLimiter(
        endpoint_id=str(endpoint_id), limit=1, redis_url=settings.COEVO_REDIS_URL, holder="other"
    )
    with other.slot():
        evaluation = evaluate(seed_candidate, humaneval_suite, policy_version, tasks=1)
        wait_until_final(evaluation, timeout_s=60)

    assert evaluation.state == EvaluationState.FAILED, evaluation.state_detail
    assert evaluation.policy_outages == 0 and evaluation.pause_kind == ""
    rollout = Rollout.objects.get(evaluation=evaluation)
    assert (rollout.outcome, rollout.error_kind) == (RolloutOutcome.INFRA_ERROR, ErrorKind.POLICY)
    assert (rollout.attempts, rollout.forgiven_attempts) == (2, 0)
    assert "no concurrency slot" in rollout.detail and "1/1 held" in rollout.detail
    assert PolicyEndpoint.objects.get(id=endpoint_id).healthy
    # The second attempt began only after the first one's backoff (COEVO_ROLLOUT_RETRY_BASE_S).
    first_end = TraceStep.objects.filter(rollout=rollout, attempt=1).latest("index").created_at
    second_start = TraceStep.objects.filter(rollout=rollout, attempt=2).earliest("index")
    assert (second_start.created_at - first_end).total_seconds() >= 1
