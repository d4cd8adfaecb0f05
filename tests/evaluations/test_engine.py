"""The evaluation engine's state machine: stages, early stopping, cache, budget, cancel, pause,
resume and the watchdog. Rollouts are driven through the real claim/finish services (no
sandbox), so each test is about the engine's decisions."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from coevo.errors import BudgetExceeded, InvalidInput, InvalidState
from coevo.evaluations.ledger import BudgetLimits
from coevo.evaluations.lifecycle import evaluation_cancel, evaluation_pause, evaluation_resume
from coevo.evaluations.models import (
    Budget,
    Evaluation,
    EvaluationState,
    LedgerEntry,
    PauseKind,
    Rollout,
    RolloutState,
    StageKind,
    StageState,
)
from coevo.evaluations.plans import EvaluationPlan
from coevo.evaluations.selectors import evaluation_compare, evaluation_statistics
from coevo.evaluations.services import (
    evaluation_create,
    rollout_claim,
    rollout_finish,
    rollout_requeue_stale,
    rollout_resend_lost,
)
from coevo.evaluations.services.heartbeats import RolloutHeartbeats
from coevo.suites.models import Split
from workers.outcomes import RolloutOutcome

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _empty_queue(empty_queue, settings):
    yield


def create(candidate, suite, policy, **kwargs) -> Evaluation:
    kwargs.setdefault("split", Split.SEARCH)
    return evaluation_create(candidate=candidate, suite=suite, policy_version=policy, **kwargs)


def run(rollout: Rollout, outcome: str, *, tokens: int = 10, latency_ms: int = 1500) -> None:
    claimed = rollout_claim(rollout_id=rollout.id, worker="test")
    assert claimed is not None, f"rollout {rollout.id} could not be claimed"
    score = (
        None if outcome == RolloutOutcome.INFRA_ERROR else float(outcome == RolloutOutcome.PASSED)
    )
    assert rollout_finish(
        rollout=claimed,
        outcome=outcome,
        score=score,
        detail="the harness raised RuntimeError"
        if outcome == RolloutOutcome.HARNESS_ERROR
        else outcome,
        prompt_tokens=tokens,
        latency_ms=latency_ms,
    )


def stage_rollouts(evaluation: Evaluation, index: int) -> list[Rollout]:
    return list(Rollout.objects.filter(evaluation=evaluation, stage=index).order_by("id"))


def test_it_runs_a_staged_plan_one_stage_at_a_time(seed_candidate, humaneval_suite, policy_version):
    evaluation = create(
        seed_candidate,
        humaneval_suite,
        policy_version,
        task_limit=10,
        plan=EvaluationPlan(smoke_tasks=2, minibatch_tasks=3),
    )
    stages = list(evaluation.stages.order_by("index"))
    assert [(s.kind, s.tasks) for s in stages] == [
        (StageKind.SMOKE, 2),
        (StageKind.MINIBATCH, 3),
        (StageKind.FULL, 5),
    ]
    assert stages[0].state == StageState.RUNNING
    # Only the smoke stage was sent to the broker.
    sent = Rollout.objects.filter(evaluation=evaluation, enqueued_at__isnull=False)
    assert set(sent.values_list("stage", flat=True)) == {0}

    for rollout in stage_rollouts(evaluation, 0):
        run(rollout, RolloutOutcome.PASSED)
    evaluation.refresh_from_db()
    assert evaluation.stage == 1
    assert evaluation.stages.get(index=0).state == StageState.PASSED
    assert evaluation.stages.get(index=1).state == StageState.RUNNING
    assert all(r.enqueued_at for r in stage_rollouts(evaluation, 1))

    for index in (1, 2):
        for rollout in stage_rollouts(evaluation, index):
            run(rollout, RolloutOutcome.TASK_FAILURE)
    evaluation.refresh_from_db()
    assert evaluation.state == EvaluationState.FINISHED
    assert evaluation.stop_reason == ""
    assert [s.state for s in evaluation.stages.order_by("index")] == [StageState.PASSED] * 3


def test_a_rollout_ending_before_the_rest_of_its_stage_takes_no_lock(
    seed_candidate, humaneval_suite, policy_version
):
    # Workers end rollouts by the thousand: only an ending that can move the evaluation (the
    # stage's last open rollout) locks its row; the others look once and leave it alone.
    evaluation = create(
        seed_candidate,
        humaneval_suite,
        policy_version,
        task_limit=6,
        plan=EvaluationPlan(smoke_tasks=2),
    )
    first, second = (
        rollout_claim(rollout_id=r.id, worker="test") for r in stage_rollouts(evaluation, 0)
    )

    def finish(rollout: Rollout) -> list[str]:
        with CaptureQueriesContext(connection) as captured:
            rollout_finish(rollout=rollout, outcome=RolloutOutcome.PASSED, score=1.0, detail="ok")
        return [q["sql"] for q in captured.captured_queries]

    assert not any("FOR UPDATE" in sql for sql in finish(first))
    evaluation.refresh_from_db()
    assert evaluation.stage == 0
    assert any("FOR UPDATE" in sql for sql in finish(second))
    evaluation.refresh_from_db()
    assert evaluation.stage == 1
    assert evaluation.stages.get(index=0).state == StageState.PASSED
    assert first.state == second.state == RolloutState.DONE  # the instances as written
    assert Rollout.objects.get(id=first.id).finished_at == first.finished_at


def test_it_stops_after_a_harness_error_in_the_smoke_stage(
    seed_candidate, humaneval_suite, policy_version
):
    evaluation = create(
        seed_candidate,
        humaneval_suite,
        policy_version,
        task_limit=8,
        plan=EvaluationPlan(smoke_tasks=2),
    )
    first, second = stage_rollouts(evaluation, 0)
    run(first, RolloutOutcome.HARNESS_ERROR)
    run(second, RolloutOutcome.PASSED)

    evaluation.refresh_from_db()
    assert evaluation.state == EvaluationState.FINISHED
    assert "smoke stage: 1 harness error" in evaluation.stop_reason
    smoke, full = evaluation.stages.order_by("index")
    assert smoke.state == StageState.FAILED and full.state == StageState.SKIPPED
    rest = Rollout.objects.filter(evaluation=evaluation, stage=1)
    assert rest.count() == 6
    assert set(rest.values_list("state", flat=True)) == {RolloutState.CANCELLED}
    budget = Budget.objects.get(evaluation=evaluation)
    assert budget.reserved_rollouts == 0
    assert budget.spent_rollouts == 2


def test_it_stops_early_once_clearly_worse_than_the_reference(
    seed_candidate, humaneval_suite, policy_version
):
    reference = create(seed_candidate, humaneval_suite, policy_version, task_limit=40, seed=1)
    for rollout in Rollout.objects.filter(evaluation=reference):
        run(rollout, RolloutOutcome.PASSED)
    reference.refresh_from_db()
    assert reference.state == EvaluationState.FINISHED
    tasks = reference.rollouts.count()

    candidate = create(
        seed_candidate,
        humaneval_suite,
        policy_version,
        task_limit=40,
        seed=2,
        reference=reference,
        plan=EvaluationPlan(minibatch_tasks=10, early_stop=True),
    )
    ran = 0
    while True:
        candidate.refresh_from_db()
        if candidate.is_final:
            break
        rollout = (
            Rollout.objects.filter(evaluation=candidate, state=RolloutState.PENDING)
            .order_by("stage", "id")
            .first()
        )
        run(rollout, RolloutOutcome.TASK_FAILURE)
        ran += 1
    assert candidate.state == EvaluationState.FINISHED
    assert "clearly worse than the reference" in candidate.stop_reason
    # Every task broken: the anytime-valid test needs only a handful, far from the whole split.
    assert ran < 12
    assert Rollout.objects.filter(evaluation=candidate, state=RolloutState.CANCELLED).count() == (
        tasks - ran
    )
    stopped = candidate.stages.get(state=StageState.STOPPED)
    assert stopped.reason == candidate.stop_reason


def test_it_does_not_stop_early_when_the_candidates_are_alike(
    seed_candidate, humaneval_suite, policy_version
):
    reference = create(seed_candidate, humaneval_suite, policy_version, task_limit=30, seed=1)
    outcomes = [RolloutOutcome.PASSED, RolloutOutcome.TASK_FAILURE] * 15
    for rollout, outcome in zip(
        Rollout.objects.filter(evaluation=reference).order_by("task__position"),
        outcomes,
        strict=True,
    ):
        run(rollout, outcome)
    candidate = create(
        seed_candidate,
        humaneval_suite,
        policy_version,
        task_limit=30,
        seed=2,
        reference=reference,
        plan=EvaluationPlan(early_stop=True),
    )
    # Half the tasks swap, alternately broken and fixed: as many fixed as broken.
    swapped = {
        RolloutOutcome.PASSED: RolloutOutcome.TASK_FAILURE,
        RolloutOutcome.TASK_FAILURE: RolloutOutcome.PASSED,
    }
    for i, (rollout, outcome) in enumerate(
        zip(
            Rollout.objects.filter(evaluation=candidate).order_by("task__position"),
            outcomes,
            strict=True,
        )
    ):
        run(rollout, swapped[outcome] if i % 4 in (0, 1) else outcome)
    candidate.refresh_from_db()
    assert candidate.state == EvaluationState.FINISHED
    assert candidate.stop_reason == ""


def test_it_reuses_identical_rollouts_from_the_cache(
    seed_candidate, humaneval_suite, policy_version
):
    first = create(seed_candidate, humaneval_suite, policy_version, task_limit=4)
    outcomes = [
        RolloutOutcome.PASSED,
        RolloutOutcome.TASK_FAILURE,
        RolloutOutcome.HARNESS_ERROR,
        RolloutOutcome.PASSED,
    ]
    for rollout, outcome in zip(first.rollouts.order_by("task__position"), outcomes, strict=True):
        run(rollout, outcome)

    again = create(seed_candidate, humaneval_suite, policy_version, task_limit=4)
    rollouts = list(again.rollouts.order_by("task__position"))
    reused = [r for r in rollouts if r.reused_from_id]
    # Scored results are reused; the harness error runs again.
    assert len(reused) == 3
    assert [r.outcome for r in reused] == [
        RolloutOutcome.PASSED,
        RolloutOutcome.TASK_FAILURE,
        RolloutOutcome.PASSED,
    ]
    assert rollouts[2].state == RolloutState.PENDING and rollouts[2].reused_from_id is None
    assert Budget.objects.get(evaluation=again).reserved_rollouts == 1

    other_seed = create(seed_candidate, humaneval_suite, policy_version, task_limit=4, seed=9)
    assert not other_seed.rollouts.filter(reused_from__isnull=False).exists()
    other_knobs = create(
        seed_candidate, humaneval_suite, policy_version, task_limit=4, knobs={"temperature": 0.5}
    )
    assert not other_knobs.rollouts.filter(reused_from__isnull=False).exists()
    no_cache = create(
        seed_candidate, humaneval_suite, policy_version, task_limit=4, use_cache=False
    )
    assert not no_cache.rollouts.filter(reused_from__isnull=False).exists()


def test_it_finishes_an_evaluation_served_entirely_from_the_cache(
    seed_candidate, humaneval_suite, policy_version
):
    first = create(seed_candidate, humaneval_suite, policy_version, task_limit=3)
    for rollout in first.rollouts.all():
        run(rollout, RolloutOutcome.PASSED)
    again = create(seed_candidate, humaneval_suite, policy_version, task_limit=3)
    again.refresh_from_db()
    assert again.state == EvaluationState.FINISHED
    assert again.rollouts.filter(reused_from__isnull=False).count() == 3


def test_it_refuses_an_evaluation_over_its_budget_before_it_starts(
    seed_candidate, humaneval_suite, policy_version
):
    before = Evaluation.objects.count()
    with pytest.raises(BudgetExceeded, match="tokens"):
        create(
            seed_candidate,
            humaneval_suite,
            policy_version,
            task_limit=5,
            budget_limits=BudgetLimits(tokens=100),
        )
    with pytest.raises(BudgetExceeded, match="rollouts"):
        create(
            seed_candidate,
            humaneval_suite,
            policy_version,
            task_limit=5,
            epochs=2,
            budget_limits=BudgetLimits(rollouts=9),
        )
    assert Evaluation.objects.count() == before
    assert not Rollout.objects.exists()


def test_it_reserves_the_worst_case_and_settles_the_actual_spend(
    seed_candidate, humaneval_suite, policy_version
):
    evaluation = create(
        seed_candidate,
        humaneval_suite,
        policy_version,
        task_limit=3,
        budget_limits=BudgetLimits(rollouts=3),
    )
    budget = Budget.objects.get(evaluation=evaluation)
    assert budget.reserved_rollouts == 3
    assert budget.reserved_tokens == 3 * budget.unit_tokens > 0
    first, second, third = evaluation.rollouts.all()
    run(first, RolloutOutcome.PASSED, tokens=120, latency_ms=2100)
    budget.refresh_from_db()
    assert (budget.reserved_rollouts, budget.spent_rollouts) == (2, 1)
    assert budget.spent_tokens == 120
    assert budget.spent_wall_s == 3
    evaluation_cancel(evaluation=evaluation)
    budget.refresh_from_db()
    assert budget.reserved_rollouts == 0 and budget.reserved_tokens == 0
    kinds = list(LedgerEntry.objects.filter(budget=budget).values_list("kind", flat=True))
    assert kinds == ["reserve", "settle", "refund"]


def test_a_parent_budget_bounds_its_evaluations_together(
    seed_candidate, humaneval_suite, policy_version, project
):
    from coevo.evaluations.ledger import budget_create

    campaign = budget_create(project=project, name="campaign", limits=BudgetLimits(rollouts=5))
    create(seed_candidate, humaneval_suite, policy_version, task_limit=3, parent_budget=campaign)
    with pytest.raises(BudgetExceeded, match="campaign"):
        create(
            seed_candidate,
            humaneval_suite,
            policy_version,
            task_limit=3,
            seed=1,
            parent_budget=campaign,
        )
    campaign.refresh_from_db()
    assert campaign.reserved_rollouts == 3


def test_it_cancels_pending_and_running_rollouts(seed_candidate, humaneval_suite, policy_version):
    evaluation = create(seed_candidate, humaneval_suite, policy_version, task_limit=3)
    running = rollout_claim(rollout_id=evaluation.rollouts.first().id, worker="test")
    heartbeats = RolloutHeartbeats(thread=False)
    cancelled = heartbeats.register(rollout_id=running.id, attempt=running.attempts)
    assert heartbeats.beat() == 1
    assert not cancelled.is_set()

    assert evaluation_cancel(evaluation=evaluation) == 3
    evaluation.refresh_from_db()
    assert evaluation.state == EvaluationState.CANCELLED
    assert set(evaluation.rollouts.values_list("state", flat=True)) == {RolloutState.CANCELLED}
    # The worker running one finds out at its next heartbeat, and its result is not recorded.
    assert heartbeats.beat() == 0
    assert cancelled.is_set()
    assert not rollout_finish(
        rollout=running, outcome=RolloutOutcome.PASSED, score=1.0, detail="late"
    )
    with pytest.raises(InvalidState):
        evaluation_cancel(evaluation=evaluation)


def test_it_resumes_only_what_did_not_finish(seed_candidate, humaneval_suite, policy_version):
    evaluation = create(seed_candidate, humaneval_suite, policy_version, task_limit=4)
    a, b, c, d = evaluation.rollouts.order_by("task__position")
    run(a, RolloutOutcome.PASSED)
    run(b, RolloutOutcome.TASK_FAILURE)
    run(c, RolloutOutcome.INFRA_ERROR)
    run(d, RolloutOutcome.INFRA_ERROR)
    evaluation.refresh_from_db()
    assert evaluation.state == EvaluationState.FAILED
    assert "2 rollout(s) could not run" in evaluation.state_detail

    assert evaluation_resume(evaluation=evaluation) == 2
    evaluation.refresh_from_db()
    assert evaluation.state == EvaluationState.RUNNING
    c.refresh_from_db()
    assert c.state == RolloutState.PENDING and c.counted_attempts == 0 and c.attempts == 1
    run(c, RolloutOutcome.PASSED)
    run(d, RolloutOutcome.PASSED)
    evaluation.refresh_from_db()
    assert evaluation.state == EvaluationState.FINISHED
    a.refresh_from_db()
    assert a.attempts == 1  # kept, not run again
    with pytest.raises(InvalidState):
        evaluation_resume(evaluation=evaluation)


def test_a_paused_evaluation_is_not_claimed_until_it_resumes(
    seed_candidate, humaneval_suite, policy_version
):
    evaluation = create(seed_candidate, humaneval_suite, policy_version, task_limit=2)
    rollout = evaluation.rollouts.first()
    rollout_claim(rollout_id=rollout.id, worker="test")  # starts it
    assert evaluation_pause(
        evaluation_id=evaluation.id, reason="policy down", kind=PauseKind.POLICY_OUTAGE
    )
    other = evaluation.rollouts.exclude(id=rollout.id).get()
    assert rollout_claim(rollout_id=other.id, worker="test") is None
    evaluation.refresh_from_db()
    evaluation_resume(evaluation=evaluation)
    assert rollout_claim(rollout_id=other.id, worker="test") is not None


def test_the_watchdog_requeues_dead_workers_rollouts_and_resends_lost_messages(
    seed_candidate, humaneval_suite, policy_version, settings
):
    from coevo.celery import app

    evaluation = create(seed_candidate, humaneval_suite, policy_version, task_limit=3)
    stale, lost, fresh = evaluation.rollouts.order_by("task__position")
    rollout_claim(rollout_id=stale.id, worker="dead")
    long_ago = timezone.now() - timedelta(hours=1)
    Rollout.objects.filter(id=stale.id).update(heartbeat_at=long_ago)
    Rollout.objects.filter(id=lost.id).update(enqueued_at=long_ago)
    Rollout.objects.filter(id=fresh.id).update(enqueued_at=timezone.now())
    assert rollout_requeue_stale(stale_after_s=60) == (1, 0)
    stale.refresh_from_db()
    assert stale.state == RolloutState.PENDING and stale.enqueued_at is not None
    app.control.purge()  # the broker lost its messages
    assert rollout_resend_lost(unsent_after_s=60) == 1  # only the one sent long ago
    lost.refresh_from_db()
    assert lost.enqueued_at > long_ago
    # With messages waiting in the queue, nothing is sent again.
    Rollout.objects.filter(evaluation=evaluation).update(enqueued_at=long_ago)
    assert rollout_resend_lost(unsent_after_s=60) == 0


def test_it_refuses_bad_plans(seed_candidate, humaneval_suite, policy_version):
    with pytest.raises(InvalidInput, match="reference"):
        create(
            seed_candidate, humaneval_suite, policy_version, plan=EvaluationPlan(early_stop=True)
        )
    with pytest.raises(InvalidInput, match="smoke_tasks"):
        EvaluationPlan(smoke_tasks=50)
    with pytest.raises(InvalidInput, match="knob"):
        create(seed_candidate, humaneval_suite, policy_version, knobs={"no_such_knob": 1})


def test_it_compares_two_evaluations_task_by_task(seed_candidate, humaneval_suite, policy_version):
    reference = create(seed_candidate, humaneval_suite, policy_version, task_limit=4, seed=1)
    candidate = create(seed_candidate, humaneval_suite, policy_version, task_limit=4, seed=2)
    ref = [
        RolloutOutcome.PASSED,
        RolloutOutcome.TASK_FAILURE,
        RolloutOutcome.PASSED,
        RolloutOutcome.TASK_FAILURE,
    ]
    cand = [
        RolloutOutcome.PASSED,
        RolloutOutcome.PASSED,
        RolloutOutcome.TASK_FAILURE,
        RolloutOutcome.PASSED,
    ]
    for evaluation, outcomes in ((reference, ref), (candidate, cand)):
        for rollout, outcome in zip(
            evaluation.rollouts.order_by("task__position"), outcomes, strict=True
        ):
            run(rollout, outcome)
    comparison = evaluation_compare(reference=reference, candidate=candidate)
    counts = {name: len(keys) for name, keys in comparison.statistics.flips.items()}
    assert counts == {"fixed": 2, "broken": 1, "both_pass": 1, "both_fail": 0}
    assert comparison.statistics.difference == pytest.approx(0.25)
    assert {row.flip for row in comparison.flips} == {"fixed", "broken"}
    assert all(row.reference_rollout and row.candidate_rollout for row in comparison.flips)
    stats = evaluation_statistics(evaluation=candidate)
    assert stats.pass_at_k == {1: 0.75}
