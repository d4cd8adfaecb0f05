"""Beat jobs of operations: trace retention and the harness store's integrity check.

Both run on the ``ops`` queue (housekeeping, on a worker of its own: never in the way of
rollouts, nor held up by them), and both are idempotent, so a redelivered or overlapping run
does no harm.
"""

from __future__ import annotations

import logging

from celery import shared_task

from coevo.evaluations.retention import traces_prune as prune
from harness_store.maintenance import store_fsck_all

logger = logging.getLogger(__name__)


@shared_task(name="coevo.ops.tasks.traces_prune", soft_time_limit=6 * 3600, time_limit=7 * 3600)
def traces_prune() -> None:
    """Delete the trace bodies of old, unprotected evaluations (COEVO_TRACE_RETENTION_DAYS)."""
    prune()


@shared_task(
    name="coevo.ops.tasks.harness_store_fsck", soft_time_limit=3 * 3600, time_limit=4 * 3600
)
def harness_store_fsck() -> None:
    """``git fsck`` of every project's repository; results land in StoreCheck (system page)."""
    failed = [check.project.slug for check in store_fsck_all() if not check.ok]
    if failed:
        logger.error("harness store fsck: %s failed", ", ".join(failed))
