"""Running one rollout: claim it (compare-and-swap), run it in the sandbox with a heartbeat,
record its trace, classify infra errors (retry, or pause the evaluation on a policy outage) and
finish it (settle its budget, move the evaluation along)."""

from __future__ import annotations

import logging
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import DatabaseError, close_old_connections, transaction
from django.db.models import F
from django.utils import timezone

from coevo.evaluations.dbwait import DatabaseUnavailable, database_retry
from coevo.evaluations.ledger import (
    Amount,
    budget_settle,
    budget_unit,
    wall_seconds,
)
from coevo.evaluations.lifecycle import evaluation_pause, evaluation_rollout_ended
from coevo.evaluations.models import (
    Budget,
    Evaluation,
    EvaluationState,
    PauseKind,
    Rollout,
    RolloutState,
)
from coevo.evaluations.services.heartbeats import rollout_heartbeat
from coevo.evaluations.storable import Unstorable, storable_json, storable_text
from coevo.evaluations.traces import TraceWriter
from coevo.logs import log_bind, log_context, rollout_log_ids
from coevo.policies.services import policy_client_for, policy_endpoint_reachable
from coevo.suites.image_builds import task_image_builds_record_steps
from harness_store.tree_cache import candidate_tree
from workers import metrics
from workers.environments import environment_for
from workers.harness_env import harness_env_prepare
from workers.outcomes import SCORED_OUTCOMES, DependencyBuildFailed, ErrorKind, RolloutOutcome
from workers.rollout import RolloutInputs, RolloutResult, TaskEnvironment, execute_rollout
from workers.trace import Error, Step, StepKind

logger = logging.getLogger(__name__)


class RolloutRetry(Exception):
    """An infra_error with attempts left: the caller re-enqueues the rollout after ``countdown``."""

    def __init__(self, message: str, *, countdown: int) -> None:
        super().__init__(message)
        self.countdown = countdown


class RolloutCancelled(Exception):
    """The rollout was cancelled while it ran (its evaluation was cancelled or stopped)."""


def rollout_claim(*, rollout_id: Any, worker: str) -> Rollout | None:
    """Pending → running, or None when another delivery already has it, it is final, or its
    evaluation is paused or over."""
    now = timezone.now()
    # The evaluation's state as a subquery, not a join: Django turns an update filtered across
    # a join into "id IN (SELECT … WHERE state = 'pending')", which a second delivery waiting
    # on the row lock re-checks against its old snapshot and passes: both claimed the rollout.
    # On the row itself, PostgreSQL re-checks state against the first claim's write.
    open_evaluations = Evaluation.objects.filter(
        state__in=[EvaluationState.PENDING, EvaluationState.RUNNING]
    ).values("id")
    claimed = Rollout.objects.filter(
        id=rollout_id, state=RolloutState.PENDING, evaluation_id__in=open_evaluations
    ).update(
        state=RolloutState.RUNNING,
        attempts=F("attempts") + 1,
        worker=worker,
        started_at=now,
        heartbeat_at=now,
    )
    if claimed != 1:
        return None
    # The policy's endpoints are read when its client is made (their health as written now).
    rollout = Rollout.objects.select_related(
        "evaluation__candidate__project",
        "evaluation__policy_version",
        "evaluation__suite",
        "task",
    ).get(id=rollout_id)
    if rollout.evaluation.state == EvaluationState.PENDING:  # its first rollout (or one of them)
        Evaluation.objects.filter(id=rollout.evaluation_id, state=EvaluationState.PENDING).update(
            state=EvaluationState.RUNNING, started_at=now
        )
    return rollout


def rollout_execute(*, rollout_id: Any, worker: str) -> Rollout | None:
    """Claim and run one rollout; record its trace and outcome. Safe to call twice."""
    with log_context(rollout=rollout_id, worker=worker):  # ids on its log lines, and only there
        return _rollout_execute(rollout_id=rollout_id, worker=worker)


def _rollout_execute(*, rollout_id: Any, worker: str) -> Rollout | None:
    close_old_connections()
    # A database outage is waited out holding the message (prefetch 1: the worker takes no
    # other meanwhile), not turned into a failed task, which would acknowledge a message that
    # nobody ran; past COEVO_DB_OUTAGE_WAIT_S the task is retried later (DatabaseUnavailable).
    rollout = database_retry(
        lambda: rollout_claim(rollout_id=rollout_id, worker=worker),
        what=f"claim rollout {rollout_id}",
    )
    if rollout is None:
        logger.info("rollout %s: already claimed, final or paused; nothing to do", rollout_id)
        return None
    log_bind(**rollout_log_ids(rollout))  # every line from here on carries the rollout's ids
    metrics.rollout_started()
    evaluation = rollout.evaluation
    adapter = environment_for(evaluation.suite.kind)
    # Steps are written in batches; every way out below flushes first, so the trace is
    # complete before the outcome is recorded (or the rollout is given up).
    trace = TraceWriter(rollout_id=rollout.id, attempt=rollout.attempts)

    # Beaten with the process's other rollouts (services/heartbeats.py), so a long model call
    # does not look like a dead worker; ``cancelled`` says the rollout was taken from it.
    with rollout_heartbeat(rollout=rollout) as cancelled:
        # The task's image builds this attempt ran, for the suite's page (recorded below).
        environment_steps: list[Step] = []

        def on_step(step: Step) -> None:
            if cancelled.is_set():
                raise RolloutCancelled(f"rollout {rollout.id} was cancelled")
            trace.add(step)
            if step.kind == StepKind.ENVIRONMENT:
                environment_steps.append(step)

        started = timezone.now()
        ended = None
        try:
            result = _rollout_run_in_sandbox(rollout=rollout, adapter=adapter, on_step=on_step)
            ended = timezone.now()  # a wait for the database below is not the rollout's time
            # The result is in hand: an outage now is waited out, not paid for with a rerun.
            database_retry(trace.flush, what=f"write rollout {rollout.id}'s trace")
        except DatabaseUnavailable:
            raise  # not the rollout's fault, and the database is needed to record one
        except RolloutCancelled:
            trace.flush_after_failure()
            _rollout_record_image_builds(rollout=rollout, steps=environment_steps)
            logger.info("rollout %s: cancelled while running", rollout.id)
            return None
        except Exception as exc:  # a fault of this worker, not of the candidate: retry it
            trace.flush_after_failure()
            logger.exception("rollout %s: worker error", rollout.id)
            result = RolloutResult(
                outcome=RolloutOutcome.INFRA_ERROR,
                score=None,
                detail=f"worker error: {type(exc).__name__}: {exc}",
                error_kind=ErrorKind.WORKER,
            )
    _rollout_record_image_builds(rollout=rollout, steps=environment_steps)
    latency_ms = int(((ended or timezone.now()) - started).total_seconds() * 1000)
    if result.outcome == RolloutOutcome.INFRA_ERROR:
        try:
            _handle_infra_error(
                rollout=rollout, detail=result.detail, endpoint_down=result.endpoint_down
            )
        except RolloutCancelled as exc:
            logger.info("rollout %s: %s", rollout.id, exc)
            return None
    rollout_finish(
        rollout=rollout,
        outcome=result.outcome,
        score=result.score,
        detail=result.detail,
        error_kind=result.error_kind,
        answer=result.answer,
        prompt_tokens=result.prompt_tokens,
        completion_tokens=result.completion_tokens,
        model_calls=result.model_calls,
        latency_ms=latency_ms,
        cost_usd=result.cost_usd,
        by_worker=True,
    )
    return rollout


def _rollout_record_image_builds(*, rollout: Rollout, steps: list[Step]) -> None:
    """The image builds this attempt's "environment" steps record, as the task's builds (the
    suite's page shows them: coevo/suites/image_builds.py), before the attempt ends or is
    retried. Written once, not waited for through an outage (a repeated insert would record a
    build twice): a failure is logged, never the rollout's, and what they record is in its
    trace too."""
    if not steps:
        return
    try:
        task_image_builds_record_steps(task_id=rollout.task_id, steps=steps)
    except DatabaseError:
        logger.exception("rollout %s: its image builds were not recorded", rollout.id)


def _handle_infra_error(*, rollout: Rollout, detail: str, endpoint_down: bool = False) -> None:
    """Decide what an infra error means; returns only when the rollout should end with it.

    A policy server that does not answer is an outage, not this rollout's fault: the attempt is
    given back, and past COEVO_INFRA_PAUSE_THRESHOLD outages the whole evaluation pauses until
    the server answers again (the watchdog resumes it). An outage is either what the failure
    itself was (``endpoint_down``: the server was down when the rollout asked) or a server that
    does not answer the probe made now. Other infra errors (a busy server, no policy slot, the
    sandbox) use up an attempt.
    """
    evaluation = rollout.evaluation
    detail = storable_text(detail)  # it may quote the harness, and lands in text columns
    # The failure's own kind decides first: a server restarted in a second is back before this
    # probe, yet the rollouts it failed are the outage's, not theirs. The probe still runs: it
    # marks the endpoint healthy again for the retries, and it catches another kind of infra
    # error that the server's death caused.
    reachable = policy_endpoint_reachable(version=evaluation.policy_version)
    if endpoint_down or not reachable:
        Evaluation.objects.filter(id=evaluation.id).update(policy_outages=F("policy_outages") + 1)
        outages = Evaluation.objects.values_list("policy_outages", flat=True).get(id=evaluation.id)
        moved = Rollout.objects.filter(
            id=rollout.id, state=RolloutState.RUNNING, attempts=rollout.attempts
        ).update(
            state=RolloutState.PENDING,
            forgiven_attempts=F("forgiven_attempts") + 1,
            detail=f"policy outage (attempt not counted): {detail}"[:10000],
        )
        if not moved:
            raise RolloutCancelled(f"rollout {rollout.id} is no longer running")
        if outages >= settings.COEVO_INFRA_PAUSE_THRESHOLD:
            evaluation_pause(
                evaluation_id=evaluation.id,
                kind=PauseKind.POLICY_OUTAGE,
                reason=(
                    f"paused after {outages} policy outages: {detail[:300]}. It resumes by "
                    "itself once the policy server answers again."
                ),
            )
            raise RolloutCancelled(f"evaluation {evaluation.id} paused")
        raise RolloutRetry(detail, countdown=settings.COEVO_ROLLOUT_RETRY_BASE_S)
    if rollout.counted_attempts < settings.COEVO_ROLLOUT_MAX_ATTEMPTS:
        moved = Rollout.objects.filter(
            id=rollout.id, state=RolloutState.RUNNING, attempts=rollout.attempts
        ).update(state=RolloutState.PENDING, detail=f"attempt {rollout.attempts}: {detail}")
        if not moved:
            raise RolloutCancelled(f"rollout {rollout.id} is no longer running")
        raise RolloutRetry(
            detail,
            countdown=min(
                300, settings.COEVO_ROLLOUT_RETRY_BASE_S * 2 ** (rollout.counted_attempts - 1)
            ),
        )


# What the worker that ran an attempt may finish: the rollout running, or sent back to pending
# by the watchdog with that attempt (rollout_finish says why the result still counts).
_FINISHABLE_BY_WORKER = (RolloutState.RUNNING, RolloutState.PENDING)


def _stored_error_kind(outcome: str, error_kind: str) -> ErrorKind:
    """The kind the code that failed gave (one of ErrorKind: a misspelt one is refused); an
    error without one is ``other``, a scored rollout has none."""
    if outcome in SCORED_OUTCOMES:
        return ErrorKind.NONE
    return ErrorKind(error_kind) if error_kind else ErrorKind.OTHER


def rollout_finish(
    *,
    rollout: Rollout,
    outcome: str,
    score: float | None,
    detail: str,
    error_kind: str = ErrorKind.NONE,
    answer: Any = None,
    prompt_tokens: int = 0,
    completion_tokens: int = 0,
    model_calls: int = 0,
    latency_ms: int = 0,
    cost_usd: Decimal | None = None,
    by_worker: bool = False,
) -> bool:
    """Running → done with the outcome, settle its budget, then move the evaluation along.

    ``error_kind`` says what went wrong for a harness_error or infra_error, as decided where
    it went wrong (workers/outcomes.py); ``detail`` is for people and is never parsed.
    The swap also matches the attempt: a worker the watchdog gave up on (its rollout was
    requeued and claimed again) cannot overwrite the result of the newer attempt.
    ``rollout`` ends up as written: the values set here, or the row read again when the swap
    did not match.

    ``by_worker``: the worker that ran this attempt records what it computed. Its result also
    stands on a rollout the watchdog sent back to pending meanwhile (same attempt, not claimed
    again): the watchdog only guessed that the worker was dead (no heartbeat, as while the
    database was down), and the new message then finds the rollout done. And while PostgreSQL
    cannot be reached, the result is kept in memory and written once it answers
    (coevo.evaluations.dbwait), rather than lost and the rollout, policy calls and all, run
    again.

    The answer and the detail are the harness's (or quote it): they are stored as
    coevo.evaluations.storable makes them, and an answer the database cannot hold even so ends
    the rollout as a harness_error, so that no harness can make its rollouts fail to finish.
    """
    detail = storable_text(detail)
    try:
        answer = storable_json(answer)
    except Unstorable as exc:
        answer = None
        if outcome in SCORED_OUTCOMES:
            outcome, score, error_kind = RolloutOutcome.HARNESS_ERROR, 0.0, ErrorKind.LIMIT
            detail = f"limit exceeded: the answer cannot be stored: {exc}; return a flatter value"
    error_kind = _stored_error_kind(outcome, error_kind)
    written = {
        "state": RolloutState.DONE,
        "outcome": outcome,
        "error_kind": error_kind,
        "score": score,
        "detail": detail[:10000],
        "answer": answer,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "model_calls": model_calls,
        "latency_ms": latency_ms,
        "cost_usd": cost_usd,
        "finished_at": timezone.now(),
    }
    tries = 0

    def write() -> bool:
        nonlocal tries
        tries += 1
        # A write whose connection was lost while the server committed it landed all the same:
        # its finished_at (this call's own) tells it from another writer's.
        if (
            tries > 1
            and Rollout.objects.filter(
                id=rollout.id,
                state=RolloutState.DONE,
                attempts=rollout.attempts,
                finished_at=written["finished_at"],
            ).exists()
        ):
            return True
        with transaction.atomic():
            finished = Rollout.objects.filter(
                id=rollout.id,
                state__in=_FINISHABLE_BY_WORKER if by_worker else [RolloutState.RUNNING],
                attempts=rollout.attempts,
            ).update(**written)
            if finished:
                budget = Budget.objects.filter(evaluation_id=rollout.evaluation_id).first()
                if budget is not None:
                    budget_settle(
                        budget=budget,
                        reserved=budget_unit(budget),
                        actual=Amount(
                            1,
                            prompt_tokens + completion_tokens,
                            wall_seconds(latency_ms),
                            usd=cost_usd or Decimal(0),
                        ),
                        rollout=rollout,
                        note=outcome,
                    )
        return bool(finished)

    def durably(call: Any) -> Any:
        if not by_worker:
            return call()
        return database_retry(call, what=f"write rollout {rollout.id}'s result")

    finished = durably(write)
    logger.info(
        "rollout %s (evaluation %s, task %s): %s %s",
        rollout.id,
        rollout.evaluation_id,
        rollout.task.key,
        outcome,
        detail[:200],
    )
    if not finished:
        durably(rollout.refresh_from_db)
        return False
    for field, value in written.items():
        setattr(rollout, field, value)
    metrics.rollout_finished(outcome=outcome, error_kind=error_kind, seconds=latency_ms / 1000)
    durably(lambda: evaluation_rollout_ended(rollout=rollout))
    return True


def _rollout_run_in_sandbox(*, rollout: Rollout, adapter: Any, on_step: Any) -> Any:
    evaluation = rollout.evaluation
    # The tree is exported once per worker and shared by its rollouts (and by its warm sandbox).
    with candidate_tree(candidate=evaluation.candidate) as harness_dir:
        # Declared dependencies are built (or found cached) before the harness's wall time
        # starts, and held until its sandbox is gone.
        try:
            harness_env = harness_env_prepare(harness_dir=harness_dir)
        except DependencyBuildFailed as exc:
            return _rollout_dependencies_failed(exc, on_step=on_step)
        inputs = RolloutInputs(
            harness_dir=harness_dir,
            task_key=rollout.task.key,
            task_view=adapter.harness_view(rollout.task.inputs),
            knob_overrides=evaluation.knobs,
            seed=rollout.seed,
            wall_time_s=settings.COEVO_ROLLOUT_WALL_S,
            policy_version=str(evaluation.policy_version),
            harness_env=harness_env.path,
        )
        environment = TaskEnvironment(
            adapter=adapter, inputs=rollout.task.inputs, verifier=rollout.task.verifier
        )
        # Reads the endpoints (a query): a database outage here, before the harness runs, is
        # waited out too, rather than turning the rollout into a worker error to rerun.
        policy = database_retry(
            lambda: policy_client_for(
                version=evaluation.policy_version, holder=f"rollout {rollout.id}"
            ),
            what=f"read rollout {rollout.id}'s policy endpoints",
        )
        with harness_env, policy:
            return execute_rollout(inputs, policy=policy, environment=environment, on_step=on_step)


def _rollout_dependencies_failed(exc: DependencyBuildFailed, *, on_step: Any) -> Any:
    """The harness's declared dependencies did not build: a harness_error, in the trace too."""
    detail = str(exc)
    on_step(Step.of(Error(outcome=RolloutOutcome.HARNESS_ERROR, message=detail)))
    return RolloutResult(
        outcome=RolloutOutcome.HARNESS_ERROR, score=0.0, detail=detail, error_kind=exc.error_kind
    )
