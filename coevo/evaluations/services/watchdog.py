"""What beat's watchdog does: re-run rollouts whose worker died, send again messages a broker
lost, resume evaluations paused for a policy outage once the server answers."""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db.models import F, Q
from django.utils import timezone

from coevo.enqueue import queue_depth
from coevo.evaluations.models import (
    Evaluation,
    EvaluationStage,
    EvaluationState,
    Outcome,
    PauseKind,
    Rollout,
    RolloutState,
)
from coevo.evaluations.services.evaluations import _send, evaluation_enqueue
from coevo.evaluations.services.rollouts import rollout_finish
from coevo.policies.services import policy_endpoint_reachable
from workers.outcomes import ErrorKind

logger = logging.getLogger(__name__)


def rollout_requeue_stale(*, stale_after_s: int) -> tuple[int, int]:
    """Rollouts whose worker stopped heartbeating are re-run or given up.

    A running rollout whose heartbeat is older than ``stale_after_s`` lost its worker (killed,
    machine gone). With attempts left it goes back to pending and is enqueued again; otherwise
    it ends as an infra_error. Returns (requeued, failed).
    """
    cutoff = timezone.now() - timedelta(seconds=stale_after_s)
    requeued = failed = 0
    stale = Rollout.objects.filter(state=RolloutState.RUNNING, heartbeat_at__lt=cutoff)
    for rollout in stale.select_related("task"):
        detail = f"worker {rollout.worker or '?'} stopped heartbeating (attempt {rollout.attempts})"
        if rollout.counted_attempts < settings.COEVO_ROLLOUT_MAX_ATTEMPTS:
            moved = Rollout.objects.filter(
                id=rollout.id, state=RolloutState.RUNNING, heartbeat_at__lt=cutoff
            ).update(state=RolloutState.PENDING, detail=detail, enqueued_at=None)
            if moved:
                _send(rollout.id)  # or, if the broker is down too, the resend check will
                requeued += 1
        elif rollout_finish(
            rollout=rollout,
            outcome=Outcome.INFRA_ERROR,
            score=None,
            detail=detail,
            error_kind=ErrorKind.WORKER_LOST,
        ):
            failed += 1
    if requeued or failed:
        logger.warning("watchdog: %d stale rollouts requeued, %d given up", requeued, failed)
    return requeued, failed


def rollout_resend_lost(*, unsent_after_s: int) -> int:
    """Send again pending rollouts of running stages whose message may be lost.

    A broker restart without persistence, a failed publish or a worker killed with messages
    prefetched all leave a rollout pending with nobody to run it. Sending it twice is harmless
    (the claim is a compare-and-swap), so the rule is simple: a rollout of a running stage that
    has waited longer than ``unsent_after_s`` since it was last sent is sent again.
    """
    if queue_depth("rollouts"):
        # Messages are still waiting: workers are behind, not lost. (A deep queue of a long
        # evaluation would otherwise be sent again on every watchdog run.)
        return 0
    cutoff = timezone.now() - timedelta(seconds=unsent_after_s)
    running_stages = EvaluationStage.objects.filter(
        evaluation__state=EvaluationState.RUNNING,
        evaluation__stage=F("index"),
    ).values_list("evaluation_id", "index", "evaluation__paced")
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
    from coevo.evaluations.lifecycle import evaluation_resume

    resumed = 0
    outage_paused = Evaluation.objects.filter(
        state=EvaluationState.PAUSED, pause_kind=PauseKind.POLICY_OUTAGE
    )
    for evaluation in outage_paused.select_related("policy_version__endpoint"):
        if policy_endpoint_reachable(version=evaluation.policy_version):
            evaluation_resume(evaluation=evaluation)
            resumed += 1
    return resumed
