"""Promotion tasks (``default`` queue): take ids, call a service."""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task

from coevo.reviews.models import PromotionRequest
from coevo.reviews.promotions import refresh

logger = logging.getLogger(__name__)


@shared_task(
    name="coevo.reviews.tasks.promotion_refresh",
    acks_late=True,
    soft_time_limit=240,
    time_limit=300,
)
def promotion_refresh(request_id: str) -> None:
    request = PromotionRequest.objects.filter(id=request_id).first()
    if request is not None:
        refresh.promotion_evidence_refresh(request=request)


@shared_task(
    name="coevo.reviews.tasks.promotions_refresh_open", soft_time_limit=480, time_limit=600
)
def promotions_refresh_open() -> None:
    """Run by beat: assemble the evidence of requests whose evaluation_finished was missed."""
    ready = refresh.promotions_refresh_open()
    if ready:
        logger.info("promotions watchdog: %d request(s) became ready after a missed signal", ready)


def promotion_refresh_enqueue(*, request_id: Any) -> None:
    """Send ``promotion_refresh`` for one request; a broker that is down only delays it
    (beat's job finds the request later)."""
    try:
        promotion_refresh.apply_async(args=[str(request_id)], queue="default")
    except Exception as exc:  # kombu's errors differ by transport
        logger.warning(
            "promotion %s: could not enqueue promotion_refresh (%s); beat will", request_id, exc
        )
