"""Webhook tasks (``default`` queue; beat's requeue on ``ops``): take ids, call a service."""

from __future__ import annotations

import logging

from celery import shared_task

from coevo.audit import webhooks

logger = logging.getLogger(__name__)


@shared_task(name=webhooks.WEBHOOK_DELIVER_TASK, acks_late=True, soft_time_limit=60, time_limit=75)
def webhook_deliver(delivery_id: str) -> None:
    webhooks.webhook_delivery_attempt(delivery_id=delivery_id)


@shared_task(name="coevo.audit.tasks.webhooks_requeue_due", soft_time_limit=60, time_limit=75)
def webhooks_requeue_due() -> None:
    """Run by beat: deliveries whose message was lost get sent again."""
    count = webhooks.webhook_deliveries_requeue_due()
    if count:
        logger.info("webhooks: re-enqueued %d overdue deliver(ies)", count)
