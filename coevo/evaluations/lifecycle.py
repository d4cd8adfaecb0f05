"""Running an evaluation's plan: start stages, stop early, finish, cancel, pause and resume.

``evaluation_advance`` is called whenever a rollout ends (and after create and resume). It
locks the evaluation row, so two workers finishing the last two rollouts of a stage cannot both
start the next one.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

from django.db import transaction
from django.db.models import F, Q, QuerySet
from django.utils import timezone

from coevo.errors import InvalidState
from coevo.evaluations.dispatch import evaluation_enqueue
from coevo.evaluations.ledger import budget_refund, budget_reserve, budget_unit
from coevo.evaluations.models import (
    EVALUATION_OPEN_STATES,
    Budget,
    Evaluation,
    EvaluationStage,
    EvaluationState,
    PauseKind,
    Rollout,
    RolloutState,
    StageKind,
    StageState,
)
from coevo.evaluations.plans import EvaluationPlan
from coevo.evaluations.selectors import evaluation_task_scores
from coevo.evaluations.signals import evaluation_finished, evaluation_progressed
from coevo.evaluations.stats.sequential import sequential_paired_decision
from workers.outcomes import RolloutOutcome

logger = logging.getLogger(__name__)

_OPEN_ROLLOUT = (RolloutState.PENDING, RolloutState.RUNNING)


def evaluation_advance(*, evaluation_id: Any) -> None:
    """Move the evaluation along its plan after something changed."""
    next_stage: EvaluationStage | None = None
    with transaction.atomic():
        evaluation = Evaluation.objects.select_for_update().filter(id=evaluation_id).first()
        if evaluation is None or evaluation.state not in (
            EvaluationState.PENDING,
            EvaluationState.RUNNING,
        ):
            return
        if evaluation.paced:
            _send_progressed(evaluation.id)
        stage = EvaluationStage.objects.filter(
            evaluation=evaluation, index=evaluation.stage
        ).first()
        if stage is None:  # an evaluation created before plans existed: one implicit stage
            _finish_if_done(evaluation)
            return
        if stage.state == StageState.PENDING:
            _start_stage(evaluation, stage)
        if stage.is_final:
            _finish_if_done(evaluation)
            return
        stage_rollouts = Rollout.objects.filter(evaluation=evaluation, stage=stage.index)
        open_in_stage = stage_rollouts.filter(state__in=_OPEN_ROLLOUT).exists()

        decision = _early_stop_decision(evaluation, stage)
        if decision is not None:
            _stop(evaluation, stage, reason=decision, state=StageState.STOPPED)
            _finish_if_done(evaluation)
            return
        if open_in_stage:
            return

        counts = _outcome_counts(stage_rollouts)
        stage.result = counts
        stage.finished_at = timezone.now()
        if stage.kind == StageKind.SMOKE and counts.get(RolloutOutcome.HARNESS_ERROR):
            _stop(
                evaluation,
                stage,
                reason=(
                    f"smoke stage: {counts[RolloutOutcome.HARNESS_ERROR]} harness error(s) on "
                    f"{stage.tasks} task(s); the rest of the split was not run"
                ),
                state=StageState.FAILED,
            )
            _finish_if_done(evaluation)
            return
        stage.state = StageState.PASSED
        stage.save(update_fields=["state", "result", "finished_at"])
        following = EvaluationStage.objects.filter(
            evaluation=evaluation, index__gt=stage.index
        ).order_by("index")
        next_stage = following.first()
        if next_stage is None:
            _finish_if_done(evaluation)
            return
        evaluation.stage = next_stage.index
        evaluation.save(update_fields=["stage", "updated_at"])
        _start_stage(evaluation, next_stage)
    # Reused (cached) rollouts can complete a stage without any worker: look again.
    if (
        next_stage is not None
        and not Rollout.objects.filter(
            evaluation_id=evaluation_id, stage=next_stage.index, state__in=_OPEN_ROLLOUT
        ).exists()
    ):
        evaluation_advance(evaluation_id=evaluation_id)


def evaluation_rollout_ended(*, rollout: Rollout) -> None:
    """``evaluation_advance`` after one of the evaluation's rollouts ended, skipped (one query,
    no lock) when it could not move anything: the evaluation is not paced, cannot stop early,
    and another rollout of the same stage is still open.

    Of the last two rollouts of a stage, the later to commit always sees the other one done
    (each looks only after its own ending committed), so one of them advances.
    """
    evaluation = rollout.evaluation  # plan, reference and pacing are fixed at creation
    may_stop_early = (
        bool(evaluation.reference_id) and EvaluationPlan.from_dict(evaluation.plan).early_stop
    )
    if (
        not evaluation.paced
        and not may_stop_early
        and Rollout.objects.filter(
            evaluation_id=evaluation.id, stage=rollout.stage, state__in=_OPEN_ROLLOUT
        ).exists()
    ):
        return
    evaluation_advance(evaluation_id=evaluation.id)


def evaluation_cancel(*, evaluation: Evaluation, reason: str = "cancelled by a user") -> int:
    """Cancel pending and running rollouts (running ones stop at their next heartbeat)."""
    with transaction.atomic():
        moved = Evaluation.objects.filter(
            id=evaluation.id, state__in=EVALUATION_OPEN_STATES
        ).update(
            state=EvaluationState.CANCELLED,
            state_detail=reason,
            pause_kind="",
            finished_at=timezone.now(),
        )
        if not moved:
            raise InvalidState(
                f"Evaluation {evaluation.id} is {evaluation.state}: nothing to cancel."
            )
        _send_finished(evaluation.id, EvaluationState.CANCELLED)
        cancelled = _cancel_rollouts(
            evaluation,
            Rollout.objects.filter(evaluation=evaluation, state__in=_OPEN_ROLLOUT),
            reason=reason,
        )
    evaluation.refresh_from_db()
    logger.info("evaluation %s cancelled: %d rollouts stopped", evaluation.id, cancelled)
    return cancelled


def evaluation_pause(*, evaluation_id: Any, reason: str, kind: PauseKind) -> bool:
    """Pending or running → paused: workers stop claiming its rollouts until it is resumed.

    ``kind`` says who resumes it: the watchdog resumes a ``policy_outage`` pause by itself once
    the server answers; a ``campaign`` pause waits for the campaign to resume. A campaign's
    pause also takes over an evaluation already paused for an outage, so that the watchdog
    leaves it alone.
    """
    states = [EvaluationState.PENDING, EvaluationState.RUNNING]
    pausable = Evaluation.objects.filter(id=evaluation_id, state__in=states)
    if kind != PauseKind.POLICY_OUTAGE:
        pausable = Evaluation.objects.filter(id=evaluation_id).filter(
            Q(state__in=states)
            | Q(state=EvaluationState.PAUSED, pause_kind=PauseKind.POLICY_OUTAGE)
        )
    paused = (
        pausable.update(state=EvaluationState.PAUSED, state_detail=reason, pause_kind=kind) == 1
    )
    if paused:
        logger.warning("evaluation %s paused (%s): %s", evaluation_id, kind, reason)
    return paused


def evaluation_resume(*, evaluation: Evaluation) -> int:
    """Run again what did not finish: paused, failed (infra errors) or cancelled evaluations.

    Scored rollouts are kept; infra-error and cancelled ones go back to pending (with their
    budget reserved again) and the plan continues from the first stage that has work.
    """
    if evaluation.state not in (
        EvaluationState.PAUSED,
        EvaluationState.FAILED,
        EvaluationState.CANCELLED,
    ):
        raise InvalidState(
            f"Evaluation {evaluation.id} is {evaluation.state}; only paused, failed or cancelled "
            "evaluations can be resumed."
        )
    with transaction.atomic():
        evaluation = Evaluation.objects.select_for_update().get(id=evaluation.id)
        rerun = Rollout.objects.filter(evaluation=evaluation).filter(
            state=RolloutState.CANCELLED
        ) | Rollout.objects.filter(
            evaluation=evaluation, state=RolloutState.DONE, outcome=RolloutOutcome.INFRA_ERROR
        )
        rerun_ids = list(rerun.values_list("id", flat=True))
        budget = Budget.objects.filter(evaluation=evaluation).first()
        if budget is not None and rerun_ids:
            budget_reserve(
                budget=budget,
                amount=budget_unit(budget) * len(rerun_ids),
                note=f"resume: {len(rerun_ids)} rollouts",
            )
        Rollout.objects.filter(id__in=rerun_ids).update(
            state=RolloutState.PENDING,
            outcome="",
            error_kind="",
            score=None,
            forgiven_attempts=F("attempts"),
            detail="resumed",
            enqueued_at=None,
            finished_at=None,
        )
        pending_stages = set(
            Rollout.objects.filter(evaluation=evaluation, state=RolloutState.PENDING)
            .values_list("stage", flat=True)
            .distinct()
        )
        stages = EvaluationStage.objects.filter(evaluation=evaluation)
        first = min(pending_stages) if pending_stages else evaluation.stage
        stages.filter(index__gte=first).update(
            state=StageState.PENDING, reason="", finished_at=None
        )
        evaluation.state = EvaluationState.RUNNING
        evaluation.state_detail = ""
        evaluation.pause_kind = ""
        evaluation.stop_reason = ""
        evaluation.policy_outages = 0
        evaluation.finished_at = None
        evaluation.stage = first
        evaluation.save()
        transaction.on_commit(lambda: evaluation_advance(evaluation_id=evaluation.id))
        # A paused evaluation's pending rollouts were never cancelled; send them again too.
        transaction.on_commit(lambda: _enqueue_open_stage(evaluation.id))
    logger.info("evaluation %s resumed: %d rollouts to run again", evaluation.id, len(rerun_ids))
    return len(rerun_ids)


def _enqueue_open_stage(evaluation_id: Any) -> None:
    evaluation = Evaluation.objects.filter(id=evaluation_id).first()
    if evaluation is None or evaluation.state != EvaluationState.RUNNING:
        return
    if evaluation.paced:
        # Messages delivered while it was paused were dropped (the claim refused them): mark
        # its pending rollouts unsent, and its pacer sends those it wants now.
        Rollout.objects.filter(evaluation=evaluation, state=RolloutState.PENDING).update(
            enqueued_at=None
        )
        _send_progressed(evaluation_id)
        return
    evaluation_enqueue(evaluation_id=evaluation_id, stage=evaluation.stage)


def _start_stage(evaluation: Evaluation, stage: EvaluationStage) -> None:
    stage.state = StageState.RUNNING
    stage.started_at = timezone.now()
    stage.save(update_fields=["state", "started_at"])
    if evaluation.paced:
        return  # its pacer sends the stage's rollouts, a few tasks at a time
    index = stage.index
    transaction.on_commit(lambda: evaluation_enqueue(evaluation_id=evaluation.id, stage=index))


def _stop(evaluation: Evaluation, stage: EvaluationStage, *, reason: str, state: str) -> None:
    stage.state = state
    stage.reason = reason
    stage.finished_at = timezone.now()
    stage.result = _outcome_counts(Rollout.objects.filter(evaluation=evaluation, stage=stage.index))
    stage.save(update_fields=["state", "reason", "finished_at", "result"])
    EvaluationStage.objects.filter(evaluation=evaluation, index__gt=stage.index).update(
        state=StageState.SKIPPED, reason=f"not run: {reason}"
    )
    _cancel_rollouts(
        evaluation,
        Rollout.objects.filter(evaluation=evaluation, state=RolloutState.PENDING),
        reason=f"not run: {reason}",
    )
    evaluation.stop_reason = reason
    evaluation.save(update_fields=["stop_reason", "updated_at"])
    logger.info("evaluation %s stopped early: %s", evaluation.id, reason)


def _cancel_rollouts(evaluation: Evaluation, rollouts: QuerySet[Rollout], *, reason: str) -> int:
    ids = list(rollouts.values_list("id", flat=True))
    cancelled = Rollout.objects.filter(id__in=ids, state__in=_OPEN_ROLLOUT).update(
        state=RolloutState.CANCELLED, detail=reason[:10000], finished_at=timezone.now()
    )
    budget = Budget.objects.filter(evaluation=evaluation).first()
    if budget is not None and cancelled:
        budget_refund(budget=budget, amount=budget_unit(budget) * cancelled, note=reason)
    return cancelled


def _finish_if_done(evaluation: Evaluation) -> bool:
    if Rollout.objects.filter(evaluation=evaluation, state__in=_OPEN_ROLLOUT).exists():
        return False
    infra = Rollout.objects.filter(
        evaluation=evaluation, state=RolloutState.DONE, outcome=RolloutOutcome.INFRA_ERROR
    ).count()
    state, detail = EvaluationState.FINISHED, ""
    if infra:
        state = EvaluationState.FAILED
        detail = (
            f"{infra} rollout(s) could not run (infra errors, not scored); resume the "
            "evaluation to run only those again"
        )
    moved = Evaluation.objects.filter(
        id=evaluation.id, state__in=[EvaluationState.PENDING, EvaluationState.RUNNING]
    ).update(state=state, state_detail=detail, finished_at=timezone.now())
    if moved:
        logger.info("evaluation %s %s", evaluation.id, state)
        _send_finished(evaluation.id, state)
    return moved == 1


def _send_finished(evaluation_id: Any, state: str) -> None:
    """Announce a final state once its compare-and-swap commits (listeners: coevo.gates).

    send_robust: a failing listener is logged, never turned into a failure of the rollout or
    request that finished the evaluation.
    """

    def send() -> None:
        for receiver, result in evaluation_finished.send_robust(
            sender=Evaluation, evaluation_id=evaluation_id, state=str(state)
        ):
            if isinstance(result, Exception):
                logger.error(
                    "evaluation %s: evaluation_finished receiver %r failed: %s",
                    evaluation_id,
                    receiver,
                    result,
                )

    transaction.on_commit(send)


def _send_progressed(evaluation_id: Any) -> None:
    """Tell a paced evaluation's pacer that it moved, once the step commits (send_robust, as
    _send_finished; the pacer's own periodic job catches up on a lost one)."""

    def send() -> None:
        for receiver, result in evaluation_progressed.send_robust(
            sender=Evaluation, evaluation_id=evaluation_id
        ):
            if isinstance(result, Exception):
                logger.error(
                    "evaluation %s: evaluation_progressed receiver %r failed: %s",
                    evaluation_id,
                    receiver,
                    result,
                )

    transaction.on_commit(send)


def _outcome_counts(rollouts: QuerySet[Rollout]) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for state, outcome in rollouts.values_list("state", "outcome"):
        counts[outcome if state == RolloutState.DONE else state] += 1
    return dict(counts)


def _early_stop_decision(evaluation: Evaluation, stage: EvaluationStage) -> str | None:
    plan = EvaluationPlan.from_dict(evaluation.plan)
    if not (plan.early_stop and evaluation.reference_id and stage.kind != StageKind.SMOKE):
        return None

    reference = evaluation_task_scores(evaluation_id=evaluation.reference_id)
    mine = evaluation_task_scores(evaluation_id=evaluation.id)
    complete = _complete_tasks(evaluation)
    improved = regressed = compared = 0
    for key in complete:
        if key not in reference or key not in mine:
            continue
        compared += 1
        delta = sum(mine[key]) / len(mine[key]) - sum(reference[key]) / len(reference[key])
        if delta > 0:
            improved += 1
        elif delta < 0:
            regressed += 1
    decision = sequential_paired_decision(improved, regressed, tasks=compared, alpha=plan.alpha)
    return decision.reason if decision.stop else None


def _complete_tasks(evaluation: Evaluation) -> list[str]:
    """Tasks whose every epoch has ended."""
    per_task: dict[str, bool] = {}
    for key, state in Rollout.objects.filter(evaluation=evaluation).values_list(
        "task__key", "state"
    ):
        per_task[key] = per_task.get(key, True) and state == RolloutState.DONE
    return [key for key, done in per_task.items() if done]
