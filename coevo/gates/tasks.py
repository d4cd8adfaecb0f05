"""Gate tasks (``default`` queue; beat's catch-up on ``ops``): take ids, call a service."""

from __future__ import annotations

import logging

from celery import shared_task

from coevo.gates import services

logger = logging.getLogger(__name__)


@shared_task(name=services.GATE_ADVANCE_TASK, acks_late=True, soft_time_limit=120, time_limit=150)
def gate_advance(gate_id: str) -> None:
    services.gate_advance(gate_id=gate_id)


# Beat sends it every COEVO_WATCHDOG_INTERVAL_S; a message older than a minute is dropped on
# arrival (later ones do the same work).
@shared_task(
    name="coevo.gates.tasks.gates_advance_ready", soft_time_limit=240, time_limit=300, expires=60
)
def gates_advance_ready() -> None:
    """Run by beat: finish gates whose evaluation_finished signal was missed."""
    finished = services.gate_advance_ready()
    if finished:
        logger.info("gates watchdog: finished %d gate(s) that missed their signal", finished)
