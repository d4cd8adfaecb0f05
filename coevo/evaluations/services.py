"""Evaluation lifecycle: create and fan out, claim and execute rollouts, finish.

Every state change is a compare-and-swap update, so a redelivered Celery task (acks_late) or
two workers racing on the same rollout never do the work twice.
"""

from __future__ import annotations

import logging
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from coevo.errors import InvalidInput
from coevo.evaluations.models import (
    Evaluation,
    EvaluationState,
    Outcome,
    Rollout,
    RolloutState,
    TraceStep,
)
from coevo.policies.models import PolicyVersion
from coevo.policies.services import policy_client_for
from coevo.suites.models import Split, Suite, Task
from harness_store.models import Candidate
from harness_store.selectors import candidate_export

logger = logging.getLogger(__name__)


class RolloutRetry(Exception):
    """An infra_error with attempts left: the caller re-enqueues the rollout after ``countdown``."""

    def __init__(self, message: str, *, countdown: int) -> None:
        super().__init__(message)
        self.countdown = countdown


def evaluation_create(
    *,
    candidate: Candidate,
    suite: Suite,
    split: str,
    policy_version: PolicyVersion,
    epochs: int = 1,
    task_limit: int | None = None,
    knobs: dict[str, Any] | None = None,
    seed: int = 0,
    created_by: AbstractBaseUser | None = None,
) -> Evaluation:
    """Create the evaluation and its rollouts; enqueue them once the transaction commits."""
    if suite.project_id != candidate.project_id:
        raise InvalidInput("The suite and the candidate belong to different projects.")
    if split not in Split.values:
        raise InvalidInput(f"Unknown split {split!r}: use one of {', '.join(Split.values)}.")
    if not 1 <= epochs <= 100:
        raise InvalidInput("epochs must be between 1 and 100.")
    if task_limit is not None and task_limit < 1:
        raise InvalidInput("task_limit must be at least 1.")
    tasks = list(Task.objects.filter(suite=suite, split=split).order_by("position").only("id"))
    if task_limit is not None:
        tasks = tasks[:task_limit]
    if not tasks:
        raise InvalidInput(f"Suite {suite} has no tasks in the {split} split.")
    with transaction.atomic():
        evaluation = Evaluation.objects.create(
            project_id=candidate.project_id,
            candidate=candidate,
            policy_version=policy_version,
            suite=suite,
            split=split,
            epochs=epochs,
            seed=seed,
            task_limit=task_limit,
            knobs=knobs or {},
            created_by=created_by,
        )
        Rollout.objects.bulk_create(
            Rollout(evaluation=evaluation, task=task, epoch=epoch, seed=seed * 1_000_003 + epoch)
            for task in tasks
            for epoch in range(epochs)
        )
        transaction.on_commit(lambda: evaluation_enqueue(evaluation_id=evaluation.id))
    logger.info(
        "evaluation %s created: candidate %s, %d rollouts",
        evaluation.id,
        candidate.short_sha,
        len(tasks) * epochs,
    )
    return evaluation


def evaluation_enqueue(*, evaluation_id: Any) -> int:
    """Send every pending rollout of the evaluation to the ``rollouts`` queue."""
    from workers.tasks import rollout_run

    sent = 0
    for rollout_id in Rollout.objects.filter(
        evaluation_id=evaluation_id, state=RolloutState.PENDING
    ).values_list("id", flat=True):
        result = rollout_run.apply_async(args=[str(rollout_id)], queue="rollouts")
        Rollout.objects.filter(id=rollout_id).update(celery_task_id=result.id)
        sent += 1
    return sent


def rollout_claim(*, rollout_id: Any, worker: str) -> Rollout | None:
    """Pending → running, or None when another delivery already has it (or it is final)."""
    now = timezone.now()
    claimed = Rollout.objects.filter(id=rollout_id, state=RolloutState.PENDING).update(
        state=RolloutState.RUNNING,
        attempts=F("attempts") + 1,
        worker=worker,
        started_at=now,
        heartbeat_at=now,
    )
    if claimed != 1:
        return None
    rollout = Rollout.objects.select_related(
        "evaluation__candidate__project",
        "evaluation__policy_version__endpoint",
        "evaluation__suite",
        "task",
    ).get(id=rollout_id)
    Evaluation.objects.filter(id=rollout.evaluation_id, state=EvaluationState.PENDING).update(
        state=EvaluationState.RUNNING, started_at=now
    )
    return rollout


def rollout_execute(*, rollout_id: Any, worker: str) -> Rollout | None:
    """Claim and run one rollout; record its trace and outcome. Safe to call twice."""
    from workers.environments import adapter_for
    from workers.rollout import RolloutResult, Step

    rollout = rollout_claim(rollout_id=rollout_id, worker=worker)
    if rollout is None:
        logger.info("rollout %s: already claimed or final; nothing to do", rollout_id)
        return None
    evaluation = rollout.evaluation
    adapter = adapter_for(evaluation.suite.kind)
    step_index = 0

    def on_step(step: Step) -> None:
        nonlocal step_index
        TraceStep.objects.create(
            rollout_id=rollout.id,
            attempt=rollout.attempts,
            index=step_index,
            kind=step.kind,
            payload=step.payload,
            prompt_tokens=step.prompt_tokens,
            completion_tokens=step.completion_tokens,
            latency_ms=step.latency_ms,
        )
        step_index += 1
        Rollout.objects.filter(id=rollout.id).update(heartbeat_at=timezone.now())

    started = timezone.now()
    try:
        result = _rollout_run_in_sandbox(rollout=rollout, adapter=adapter, on_step=on_step)
    except Exception as exc:  # a fault of this worker, not of the candidate: retry it
        logger.exception("rollout %s: worker error", rollout.id)
        result = RolloutResult(
            outcome=Outcome.INFRA_ERROR,
            score=None,
            detail=f"worker error: {type(exc).__name__}: {exc}",
        )
    latency_ms = int((timezone.now() - started).total_seconds() * 1000)
    if (
        result.outcome == Outcome.INFRA_ERROR
        and rollout.attempts < settings.COEVO_ROLLOUT_MAX_ATTEMPTS
    ):
        Rollout.objects.filter(
            id=rollout.id, state=RolloutState.RUNNING, attempts=rollout.attempts
        ).update(state=RolloutState.PENDING, detail=f"attempt {rollout.attempts}: {result.detail}")
        raise RolloutRetry(
            result.detail,
            countdown=min(300, settings.COEVO_ROLLOUT_RETRY_BASE_S * 2 ** (rollout.attempts - 1)),
        )
    rollout_finish(
        rollout=rollout,
        outcome=result.outcome,
        score=result.score,
        detail=result.detail,
        answer=result.answer,
        prompt_tokens=result.prompt_tokens,
        completion_tokens=result.completion_tokens,
        model_calls=result.model_calls,
        latency_ms=latency_ms,
    )
    rollout.refresh_from_db()
    return rollout


def rollout_finish(
    *,
    rollout: Rollout,
    outcome: str,
    score: float | None,
    detail: str,
    answer: Any = None,
    prompt_tokens: int = 0,
    completion_tokens: int = 0,
    model_calls: int = 0,
    latency_ms: int = 0,
) -> bool:
    """Running → done with the outcome; then finish the evaluation if it was the last one.

    The swap also matches the attempt: a worker the watchdog gave up on (its rollout was
    requeued and claimed again) cannot overwrite the result of the newer attempt.
    """
    finished = Rollout.objects.filter(
        id=rollout.id, state=RolloutState.RUNNING, attempts=rollout.attempts
    ).update(
        state=RolloutState.DONE,
        outcome=outcome,
        score=score,
        detail=detail[:10000],
        answer=answer,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        model_calls=model_calls,
        latency_ms=latency_ms,
        finished_at=timezone.now(),
    )
    logger.info(
        "rollout %s (evaluation %s, task %s): %s %s",
        rollout.id,
        rollout.evaluation_id,
        rollout.task.key,
        outcome,
        detail[:200],
    )
    evaluation_finish_if_done(evaluation_id=rollout.evaluation_id)
    return finished == 1


def evaluation_finish_if_done(*, evaluation_id: Any) -> bool:
    open_rollouts = Rollout.objects.filter(
        evaluation_id=evaluation_id, state__in=[RolloutState.PENDING, RolloutState.RUNNING]
    )
    if open_rollouts.exists():
        return False
    return (
        Evaluation.objects.filter(
            id=evaluation_id, state__in=[EvaluationState.PENDING, EvaluationState.RUNNING]
        ).update(state=EvaluationState.FINISHED, finished_at=timezone.now())
        == 1
    )


def _rollout_run_in_sandbox(*, rollout: Rollout, adapter: Any, on_step: Any) -> Any:
    from workers.rollout import RolloutInputs, execute_rollout

    evaluation = rollout.evaluation
    with tempfile.TemporaryDirectory(prefix="coevo-harness-") as tmp:
        harness_dir = Path(tmp) / "harness"
        harness_dir.mkdir()
        candidate_export(candidate=evaluation.candidate, destination=harness_dir)
        inputs = RolloutInputs(
            harness_dir=harness_dir,
            task_key=rollout.task.key,
            task_view=adapter.harness_view(rollout.task.inputs),
            knob_overrides=evaluation.knobs,
            seed=rollout.seed,
            wall_time_s=settings.COEVO_ROLLOUT_WALL_S,
        )
        with policy_client_for(version=evaluation.policy_version) as policy:
            return execute_rollout(
                inputs,
                policy=policy,
                verify=lambda answer: adapter.verify(
                    inputs=rollout.task.inputs, verifier=rollout.task.verifier, answer=answer
                ),
                on_step=on_step,
            )


def rollout_requeue_stale(*, stale_after_s: int) -> tuple[int, int]:
    """The watchdog: rollouts whose worker stopped heartbeating are re-run or given up.

    A running rollout whose heartbeat is older than ``stale_after_s`` lost its worker (killed,
    machine gone). With attempts left it goes back to pending and is enqueued again; otherwise
    it ends as an infra_error. Returns (requeued, failed).
    """
    cutoff = timezone.now() - timedelta(seconds=stale_after_s)
    requeued = failed = 0
    stale = Rollout.objects.filter(state=RolloutState.RUNNING, heartbeat_at__lt=cutoff)
    for rollout in stale.select_related("task"):
        detail = f"worker {rollout.worker or '?'} stopped heartbeating (attempt {rollout.attempts})"
        if rollout.attempts < settings.COEVO_ROLLOUT_MAX_ATTEMPTS:
            moved = Rollout.objects.filter(
                id=rollout.id, state=RolloutState.RUNNING, heartbeat_at__lt=cutoff
            ).update(state=RolloutState.PENDING, detail=detail)
            if moved:
                from workers.tasks import rollout_run

                result = rollout_run.apply_async(args=[str(rollout.id)], queue="rollouts")
                Rollout.objects.filter(id=rollout.id).update(celery_task_id=result.id)
                requeued += 1
        elif rollout_finish(
            rollout=rollout, outcome=Outcome.INFRA_ERROR, score=None, detail=detail
        ):
            failed += 1
    if requeued or failed:
        logger.warning("watchdog: %d stale rollouts requeued, %d given up", requeued, failed)
    return requeued, failed
