"""Training tasks. ``training_run_execute`` runs on the ``training`` queue (a worker on the
machine with the trainer's GPU); the watchdog runs from beat on ``ops``."""

from __future__ import annotations

import logging

from celery import shared_task

from coevo.training import services

logger = logging.getLogger(__name__)


# Acknowledged on receipt, not on completion: a training run can outlast the broker's
# visibility timeout, and a killed worker's run must not start again silently on another
# machine. The watchdog fails a run whose worker stopped heartbeating, with the reason.
@shared_task(name=services.TRAINING_RUN_EXECUTE_TASK, acks_late=False)
def training_run_execute(run_id: str) -> None:
    services.training_run_execute(run_id=run_id)


# Beat sends it every COEVO_WATCHDOG_INTERVAL_S; a message older than a minute is dropped on
# arrival (later ones do the same work).
@shared_task(
    name="coevo.training.tasks.training_runs_watchdog",
    soft_time_limit=120,
    time_limit=150,
    expires=60,
)
def training_runs_watchdog() -> None:
    counts = services.training_runs_watchdog()
    if any(counts.values()):
        logger.info("training watchdog: %s", counts)
