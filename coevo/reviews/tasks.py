"""Promotion tasks (``default`` queue; beat's catch-up on ``ops``): take ids, call a service."""

from __future__ import annotations

import logging

from celery import shared_task

from coevo.reviews.models import PromotionRequest
from coevo.reviews.promotions import refresh
from coevo.reviews.promotions.transitions import PROMOTION_REFRESH_TASK

logger = logging.getLogger(__name__)


@shared_task(
    name=PROMOTION_REFRESH_TASK,
    acks_late=True,
    soft_time_limit=240,
    time_limit=300,
)
def promotion_refresh(request_id: str) -> None:
    request = PromotionRequest.objects.filter(id=request_id).first()
    if request is not None:
        refresh.promotion_evidence_refresh(request=request)


# Beat sends it every COEVO_WATCHDOG_INTERVAL_S; a message older than a minute is dropped on
# arrival (later ones do the same work).
@shared_task(
    name="coevo.reviews.tasks.promotions_refresh_open",
    soft_time_limit=480,
    time_limit=600,
    expires=60,
)
def promotions_refresh_open() -> None:
    """Run by beat: assemble the evidence of requests whose evaluation_finished was missed."""
    ready = refresh.promotions_refresh_open()
    if ready:
        logger.info("promotions watchdog: %d request(s) became ready after a missed signal", ready)
