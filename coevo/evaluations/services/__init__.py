"""Evaluation lifecycle: create and fan out, claim and execute rollouts, finish.

Every state change is a compare-and-swap update, so a redelivered Celery task (acks_late) or
two workers racing on the same rollout never do the work twice. The plan (stages, early
stopping), cancel, pause and resume live in ``coevo.evaluations.lifecycle``, below these
services; sending to the queue in ``coevo.evaluations.dispatch``, below it; budgets in
``coevo.evaluations.ledger``.
"""

from coevo.evaluations.dispatch import evaluation_enqueue, rollout_retry_sent
from coevo.evaluations.services.evaluations import evaluation_create
from coevo.evaluations.services.rollouts import (
    RolloutCancelled,
    RolloutRetry,
    rollout_claim,
    rollout_execute,
    rollout_finish,
)
from coevo.evaluations.services.watchdog import (
    evaluations_resume_paused,
    rollout_end_stuck,
    rollout_progress_bound_s,
    rollout_requeue_stale,
    rollout_resend_lost,
)

__all__ = [
    "RolloutCancelled",
    "RolloutRetry",
    "evaluation_create",
    "evaluation_enqueue",
    "evaluations_resume_paused",
    "rollout_claim",
    "rollout_end_stuck",
    "rollout_execute",
    "rollout_finish",
    "rollout_progress_bound_s",
    "rollout_requeue_stale",
    "rollout_resend_lost",
    "rollout_retry_sent",
]
