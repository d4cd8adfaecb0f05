"""Evaluation tasks: take ids, call a service. Rollouts run on the ``rollouts`` queue.

Services send these by name (``coevo.enqueue.task_enqueue``); nothing imports this module but
Celery's autodiscovery.
"""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings

from coevo.evaluations.services import (
    RolloutRetry,
    evaluations_resume_paused,
    rollout_execute,
    rollout_requeue_stale,
    rollout_resend_lost,
)
from coevo.evaluations.services.evaluations import ROLLOUT_RUN_TASK, ROLLOUTS_WATCHDOG_TASK

logger = logging.getLogger(__name__)

# Soft limit above the longest rollout wall time and the build of its declared dependencies
# (which precedes the wall time); the hard limit about 1.2x the soft one.
_SOFT_LIMIT_S = settings.COEVO_ROLLOUT_WALL_S + settings.COEVO_HARNESS_ENV_BUILD_TIMEOUT_S + 120
_HARD_LIMIT_S = int(_SOFT_LIMIT_S * 1.2)


@shared_task(
    bind=True,
    name=ROLLOUT_RUN_TASK,
    acks_late=True,
    soft_time_limit=_SOFT_LIMIT_S,
    time_limit=_HARD_LIMIT_S,
    max_retries=None,  # the rollout row counts attempts (COEVO_ROLLOUT_MAX_ATTEMPTS)
)
def rollout_run(self, rollout_id: str) -> None:
    try:
        rollout_execute(rollout_id=rollout_id, worker=self.request.hostname or "worker")
    except RolloutRetry as exc:
        logger.warning(
            "rollout %s: infra error, retrying in %ss: %s", rollout_id, exc.countdown, exc
        )
        raise self.retry(countdown=exc.countdown, queue="rollouts") from exc


@shared_task(name=ROLLOUTS_WATCHDOG_TASK, soft_time_limit=120, time_limit=150)
def rollouts_watchdog() -> None:
    """Run by beat: re-run rollouts whose worker died, send again lost messages, and resume
    evaluations paused for a policy outage once the server answers."""
    rollout_requeue_stale(stale_after_s=settings.COEVO_ROLLOUT_STALE_S)
    rollout_resend_lost(unsent_after_s=settings.COEVO_ROLLOUT_RESEND_S)
    evaluations_resume_paused()
