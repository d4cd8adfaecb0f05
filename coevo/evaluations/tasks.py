"""Evaluation tasks: take ids, call a service. Rollouts run on the ``rollouts`` queue.

Services send these by name (``coevo.enqueue.task_enqueue``); nothing imports this module but
Celery's autodiscovery.
"""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings

from coevo.evaluations.dbwait import DatabaseUnavailable
from coevo.evaluations.dispatch import ROLLOUT_RUN_TASK
from coevo.evaluations.services import (
    RolloutRetry,
    evaluations_resume_paused,
    rollout_end_stuck,
    rollout_execute,
    rollout_progress_bound_s,
    rollout_requeue_stale,
    rollout_resend_lost,
    rollout_retry_sent,
)
from coevo.evaluations.services.evaluations import ROLLOUTS_WATCHDOG_TASK

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
        rollout_retry_sent(rollout_id=rollout_id, countdown=exc.countdown)
        raise self.retry(countdown=exc.countdown, queue="rollouts") from exc
    except DatabaseUnavailable as exc:
        # The task waited COEVO_DB_OUTAGE_WAIT_S for the database, holding its message: sent
        # again rather than dropped (nothing can be recorded now; a duplicate the watchdog sends
        # once the database is back is harmless, the claim being a compare-and-swap).
        countdown = settings.COEVO_ROLLOUT_RETRY_BASE_S
        logger.error("rollout %s: %s; sent again, due in %ss", rollout_id, exc, countdown)
        raise self.retry(countdown=countdown, queue="rollouts") from exc


# Beat sends it every COEVO_WATCHDOG_INTERVAL_S to the ``ops`` queue (CELERY_TASK_ROUTES). A
# message that waited a minute (no ops worker running) is dropped on arrival: the runs sent
# since do the same work, and a backlog would only delay them.
@shared_task(name=ROLLOUTS_WATCHDOG_TASK, soft_time_limit=120, time_limit=150, expires=60)
def rollouts_watchdog() -> None:
    """Run by beat: re-run rollouts whose worker died or whose thread is stuck, send again lost
    messages, and resume evaluations paused for a policy outage once the server answers."""
    rollout_requeue_stale(stale_after_s=settings.COEVO_ROLLOUT_STALE_S)
    rollout_end_stuck(no_progress_s=rollout_progress_bound_s())
    rollout_resend_lost(unsent_after_s=settings.COEVO_ROLLOUT_RESEND_S)
    evaluations_resume_paused()
