"""Gate tasks (``default`` queue): take ids, call a service."""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task

from coevo.gates import services

logger = logging.getLogger(__name__)


@shared_task(
    name="coevo.gates.tasks.gate_advance", acks_late=True, soft_time_limit=120, time_limit=150
)
def gate_advance(gate_id: str) -> None:
    services.gate_advance(gate_id=gate_id)


@shared_task(name="coevo.gates.tasks.gates_advance_ready", soft_time_limit=240, time_limit=300)
def gates_advance_ready() -> None:
    """Run by beat: finish gates whose evaluation_finished signal was missed."""
    finished = services.gate_advance_ready()
    if finished:
        logger.info("gates watchdog: finished %d gate(s) that missed their signal", finished)


def gate_advance_enqueue(*, gate_id: Any) -> None:
    """Send ``gate_advance`` for one gate; a broker that is down only delays it (beat's job
    finds the gate later)."""
    try:
        gate_advance.apply_async(args=[str(gate_id)], queue="default")
    except Exception as exc:  # kombu's errors differ by transport
        logger.warning("gate %s: could not enqueue gate_advance (%s); beat will", gate_id, exc)
