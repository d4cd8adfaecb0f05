"""What every step of a promotion request shares: its audit event (in the transaction of the
change), the refresh sent once a transaction commits, and the compare-and-swap into a new state."""

from __future__ import annotations

import logging
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from coevo.audit.services import audit_record
from coevo.enqueue import task_enqueue
from coevo.reviews.models import PROMOTION_OPEN_STATES, PromotionRequest

logger = logging.getLogger(__name__)

# The Celery task name (coevo.reviews.tasks registers it; services send it by name).
PROMOTION_REFRESH_TASK = "coevo.reviews.tasks.promotion_refresh"


def audit_event(
    *,
    actor: AbstractBaseUser | None,
    request: PromotionRequest,
    action: str,
    before: dict | None = None,
    after: dict | None = None,
) -> None:
    audit_record(
        actor=actor,
        project=request.project,
        action=action,
        target=request,
        before=before,
        after=after,
    )


def refresh_later(request_id: Any) -> None:
    """Send ``promotion_refresh`` for one request (by name: tasks sit above services); a
    broker that is down only delays it (beat's job finds the request later)."""
    task_enqueue(
        PROMOTION_REFRESH_TASK, str(request_id), queue="default", what=f"promotion {request_id}"
    )


def transition(
    *,
    request: PromotionRequest,
    to: str,
    detail: str,
    action: str,
    actor: AbstractBaseUser | None,
    from_states: tuple[str, ...] = PROMOTION_OPEN_STATES,
) -> PromotionRequest:
    now = timezone.now()
    with transaction.atomic():
        updated = PromotionRequest.objects.filter(id=request.id, state__in=from_states).update(
            state=to, state_detail=detail, decided_at=now, updated_at=now
        )
        if updated:
            audit_event(
                actor=actor,
                request=request,
                action=action,
                before={"state": request.state},
                after={"state": to, "detail": detail},
            )
    if updated:
        logger.info("promotion %s %s: %s", request.id, to, detail)
    request.refresh_from_db()
    return request
