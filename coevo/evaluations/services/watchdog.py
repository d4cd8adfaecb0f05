"""What beat's watchdog does: re-run rollouts whose worker died or whose thread is stuck, send
again messages a broker lost, resume evaluations paused for a policy outage once the server
answers. It runs on the ``ops`` queue, so busy rollout workers never hold it up."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import F, OuterRef, Q, Subquery
from django.utils import timezone

from coevo.enqueue import queue_depth
from coevo.evaluations.dispatch import evaluation_enqueue, rollout_send
from coevo.evaluations.lifecycle import evaluation_resume
from coevo.evaluations.models import (
    Evaluation,
    EvaluationStage,
    EvaluationState,
    PauseKind,
    Rollout,
    RolloutState,
    StageState,
    TraceStep,
)
from coevo.evaluations.services.rollouts import rollout_finish
from coevo.policies.services import policy_endpoint_reachable
from workers.outcomes import ErrorKind, RolloutOutcome

logger = logging.getLogger(__name__)


def rollout_requeue_stale(*, stale_after_s: float) -> tuple[int, int]:
    """Rollouts whose worker stopped heartbeating are re-run or given up.

    A running rollout whose heartbeat is older than ``stale_after_s`` lost its worker (killed,
    machine gone). With attempts left it goes back to pending and is enqueued again; otherwise
    it ends as an infra_error. Returns (requeued, failed).

    A database that restarted less than ``stale_after_s`` ago took every worker's heartbeats
    with it: nobody is judged until the live ones have had the time to beat again.
    """
    cutoff = timezone.now() - timedelta(seconds=stale_after_s)
    restarted = _database_started_at()
    if restarted is not None and restarted > cutoff:
        logger.info("watchdog: the database restarted at %s; stale check skipped", restarted)
        return 0, 0
    requeued = failed = 0
    stale = Rollout.objects.filter(state=RolloutState.RUNNING, heartbeat_at__lt=cutoff)
    for rollout in stale.select_related("task"):
        detail = f"worker {rollout.worker or '?'} stopped heartbeating (attempt {rollout.attempts})"
        moved = _requeue_or_give_up(
            rollout, detail=detail, error_kind=ErrorKind.WORKER_LOST, heartbeat_at__lt=cutoff
        )
        requeued += moved == "requeued"
        failed += moved == "failed"
    if requeued or failed:
        logger.warning("watchdog: %d stale rollouts requeued, %d given up", requeued, failed)
    return requeued, failed


def rollout_progress_bound_s() -> int:
    """The longest a running attempt can go without a new trace step and still be working.

    The harness's wall time (``COEVO_ROLLOUT_WALL_S``) bounds what the harness does, but not
    what the worker does around it, which the bound adds: the dependency build before the
    harness starts (``COEVO_HARNESS_ENV_BUILD_TIMEOUT_S``), the verifier after it
    (``COEVO_WORKSPACE_VERIFIER_TIMEOUT_S``, the longest one), and one model call at its
    slowest, which the worker waits out even past the wall time (a wait for a policy slot,
    ``COEVO_POLICY_SLOT_WAIT_S``, then ``COEVO_POLICY_RETRIES`` + 1 tries of
    ``COEVO_POLICY_TIMEOUT_S``); and a minute for the rest (exporting the tree, clocks).
    """
    slowest_model_call = settings.COEVO_POLICY_SLOT_WAIT_S + settings.COEVO_POLICY_TIMEOUT_S * (
        settings.COEVO_POLICY_RETRIES + 1
    )
    return (
        settings.COEVO_ROLLOUT_WALL_S
        + settings.COEVO_HARNESS_ENV_BUILD_TIMEOUT_S
        + settings.COEVO_WORKSPACE_VERIFIER_TIMEOUT_S
        + slowest_model_call
        + 60
    )


def rollout_end_stuck(*, no_progress_s: float) -> tuple[int, int]:
    """Rollouts that heartbeat but make no progress are re-run or given up.

    A worker process beats for all its rollouts from one thread, so a rollout whose own thread
    hangs (a call that never returns) looks alive for ever. Progress is what the attempt
    records: its trace steps (one per model call, log line, environment step, answer and
    verdict), and its claim before the first one. An attempt whose newest step, or claim, is
    older than ``no_progress_s`` (``rollout_progress_bound_s``: no working attempt goes that
    long without one) is stuck: with attempts left it goes back to pending and is enqueued
    again, otherwise it ends as an infra_error of kind ``worker``. The stuck thread's late
    result, if it ever comes, is ignored (the finish matches the attempt). Returns (requeued,
    failed).
    """
    now = timezone.now()
    cutoff = now - timedelta(seconds=no_progress_s)
    # The attempt's newest step: its highest index (written in order), over the unique index;
    # written after its claim by the same worker's clock, so only months since then are read.
    newest_step = (
        TraceStep.objects.filter(
            rollout_id=OuterRef("id"),
            attempt=OuterRef("attempts"),
            created_at__gte=OuterRef("started_at"),
        )
        .order_by("-index")
        .values("created_at")[:1]
    )
    stuck = (
        Rollout.objects.filter(state=RolloutState.RUNNING, started_at__lt=cutoff)
        .annotate(progress_at=Subquery(newest_step))
        .filter(Q(progress_at__isnull=True) | Q(progress_at__lt=cutoff))
    )
    requeued = failed = 0
    for rollout in stuck.select_related("task"):
        since = rollout.progress_at or rollout.started_at
        detail = (
            f"attempt {rollout.attempts} made no progress for {(now - since).total_seconds():.0f}s "
            f"(no trace step since {since:%Y-%m-%d %H:%M:%S} UTC) while worker "
            f"{rollout.worker or '?'} kept heartbeating: no working attempt goes "
            f"{no_progress_s:.0f}s without a step, so its thread is stuck"
        )
        moved = _requeue_or_give_up(rollout, detail=detail, error_kind=ErrorKind.WORKER)
        requeued += moved == "requeued"
        failed += moved == "failed"
    if requeued or failed:
        logger.error(
            "watchdog: %d rollouts stuck without progress requeued, %d given up", requeued, failed
        )
    return requeued, failed


def _requeue_or_give_up(
    rollout: Rollout, *, detail: str, error_kind: ErrorKind, **match: Any
) -> str:
    """Back to pending and sent again with attempts left, else ended as an infra_error; both a
    compare-and-swap on the attempt the watchdog judged (and ``match``). Returns "requeued",
    "failed" or "" (the rollout moved on meanwhile)."""
    if rollout.counted_attempts < settings.COEVO_ROLLOUT_MAX_ATTEMPTS:
        moved = Rollout.objects.filter(
            id=rollout.id, state=RolloutState.RUNNING, attempts=rollout.attempts, **match
        ).update(state=RolloutState.PENDING, detail=detail, enqueued_at=None)
        if not moved:
            return ""
        rollout_send(rollout.id)  # or, if the broker is down too, the resend check will
        return "requeued"
    finished = rollout_finish(
        rollout=rollout,
        outcome=RolloutOutcome.INFRA_ERROR,
        score=None,
        detail=detail,
        error_kind=error_kind,
    )
    return "failed" if finished else ""


def _database_started_at() -> datetime | None:
    """When the database server started (PostgreSQL; None for another)."""
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_postmaster_start_time()")
        return cursor.fetchone()[0]


def rollout_resend_lost(*, unsent_after_s: float) -> int:
    """Send again pending rollouts of running stages whose message may be lost.

    A broker restart without persistence, a failed publish or a worker killed with messages
    prefetched all leave a rollout pending with nobody to run it. Sending it twice is harmless
    (the claim is a compare-and-swap), so the rule is simple: with the ``rollouts`` queue empty,
    a rollout of a running stage that has waited longer than ``unsent_after_s`` since its
    message was due is sent again. With the queue empty, a message sent that long ago is either
    lost or held by a worker: a worker holds one only while running it (prefetch 1 and late
    acknowledgement: the rollout is then running, not pending) or until a retry's countdown
    ends, and a retry's ``enqueued_at`` is when it is due (``rollout_retry_sent``). So the
    bound can be seconds: the messages a restarted broker lost are sent again at the
    watchdog's next run once it is back.
    """
    if queue_depth("rollouts"):
        # Messages are still waiting: workers are behind, not lost. (A deep queue of a long
        # evaluation would otherwise be sent again on every watchdog run.)
        return 0
    cutoff = timezone.now() - timedelta(seconds=unsent_after_s)
    # An evaluation is pending until a worker claims its first rollout: one whose every message
    # was lost (a broker restarted, or down, just after it started) is pending with its first
    # stage running, and waits for this as much as a running one.
    running_stages = (
        EvaluationStage.objects.filter(evaluation__stage=F("index"))
        .filter(
            Q(evaluation__state=EvaluationState.RUNNING)
            | Q(evaluation__state=EvaluationState.PENDING, state=StageState.RUNNING)
        )
        .values_list("evaluation_id", "index", "evaluation__paced")
    )
    resent = 0
    for evaluation_id, index, paced in running_stages:
        waiting = Rollout.objects.filter(
            evaluation_id=evaluation_id, stage=index, state=RolloutState.PENDING
        ).filter(Q(enqueued_at__isnull=True) | Q(enqueued_at__lt=cutoff))
        if paced:
            # A paced rollout never sent waits for its pacer (a race sends a few tasks at a
            # time); only one that was sent and may have been lost is sent again.
            waiting = waiting.filter(enqueued_at__isnull=False)
        ids = list(waiting.values_list("id", flat=True))
        if ids:
            Rollout.objects.filter(id__in=ids).update(enqueued_at=None)
            resent += evaluation_enqueue(
                evaluation_id=evaluation_id, stage=index, only_unsent=True, rollout_ids=ids
            )
    # Rollouts sent back to pending by the stale check above wait for this, too.
    if resent:
        logger.warning("watchdog: %d pending rollouts sent again", resent)
    return resent


def evaluations_resume_paused() -> int:
    """Resume evaluations paused for a policy outage once their policy server answers.

    Only that kind: an evaluation a person or its campaign paused stays paused until they
    resume it (the watchdog runs every 30 s and would otherwise undo every such pause).
    """
    resumed = 0
    outage_paused = Evaluation.objects.filter(
        state=EvaluationState.PAUSED, pause_kind=PauseKind.POLICY_OUTAGE
    )
    for evaluation in outage_paused.select_related("policy_version__endpoint"):
        if policy_endpoint_reachable(version=evaluation.policy_version):
            evaluation_resume(evaluation=evaluation)
            resumed += 1
    return resumed
