"""Webhooks: tell outside systems about project events (e.g. ``channel.moved``).

Each matching webhook gets a WebhookDelivery row first; its id is enqueued on commit, and the
task POSTs the JSON body signed with the webhook's secret. Failed attempts are retried with
exponential backoff until COEVO_WEBHOOK_MAX_ATTEMPTS, then the delivery ends ``failed``. The
row is the log the webhooks page shows: status codes and errors, never a reply's body.

Where a POST may go is coevo.audit.outbound's to decide (public addresses only, checked when a
URL is saved and again, pinned, at every send; COEVO_WEBHOOK_ALLOWED_HOSTS for internal hosts).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import httpx
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from coevo.audit.models import DeliveryState, Webhook, WebhookDelivery
from coevo.audit.outbound import outbound_post, outbound_url_check
from coevo.audit.services import audit_record
from coevo.enqueue import task_enqueue
from coevo.errors import InvalidInput, InvalidState

if TYPE_CHECKING:
    from coevo.projects.models import Project


logger = logging.getLogger(__name__)

# The Celery task name (coevo.audit.tasks registers it; services send it by name).
WEBHOOK_DELIVER_TASK = "coevo.audit.tasks.webhook_deliver"

# The events a webhook can subscribe to; "*" means all of them (and any added later). Only
# events something sends belong here: coevo.reviews sends channel.moved for moves and
# rollbacks alike (the payload's "kind" tells them apart).
WEBHOOK_EVENTS = ("channel.moved",)
ALL_EVENTS = "*"
_ERROR_LIMIT = 2000


def webhook_url_check(url: str) -> str:
    """Only http(s) URLs with a host that is not, and does not resolve to, an address on this
    machine or a private network (coevo.audit.outbound; checked again at every send)."""
    return outbound_url_check(url, allowed=settings.COEVO_WEBHOOK_ALLOWED_HOSTS)


def webhook_signature(*, secret: str, body: bytes) -> str:
    """The X-Coevo-Signature header: ``sha256=<hex HMAC-SHA256 of the raw body>``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def webhook_backoff_s(*, attempts: int) -> float:
    """Delay before the next try after ``attempts`` failed attempts: base × 2^(attempts-1)."""
    return float(settings.COEVO_WEBHOOK_BACKOFF_S) * (2 ** max(attempts - 1, 0))


def webhook_create(
    *, project: Project, url: str, events: list[str], created_by: AbstractBaseUser | None
) -> tuple[Webhook, str]:
    """Create a webhook; returns it with its secret (the only time the caller sees it whole)."""
    url = webhook_url_check(url)
    events = sorted(set(events))
    if not events:
        raise InvalidInput("Choose at least one event for the webhook.")
    unknown = [e for e in events if e != ALL_EVENTS and e not in WEBHOOK_EVENTS]
    if unknown:
        raise InvalidInput(
            f"Unknown webhook event(s): {', '.join(unknown)}. Known: {', '.join(WEBHOOK_EVENTS)}."
        )
    secret = secrets.token_hex(32)
    with transaction.atomic():
        webhook = Webhook.objects.create(
            project=project, url=url, secret=secret, events=events, created_by=created_by
        )
        audit_record(
            actor=created_by,
            project=project,
            action="webhook.created",
            target=webhook,
            after={"url": url, "events": events, "active": True},
        )
    return webhook, secret


def webhook_set_active(*, webhook: Webhook, active: bool, actor: AbstractBaseUser | None) -> None:
    with transaction.atomic():
        before = webhook.active
        Webhook.objects.filter(pk=webhook.pk).update(active=active, updated_at=timezone.now())
        webhook.active = active
        audit_record(
            actor=actor,
            project=webhook.project,
            action="webhook.updated",
            target=webhook,
            before={"active": before},
            after={"active": active},
        )


def webhook_delete(*, webhook: Webhook, actor: AbstractBaseUser | None) -> None:
    with transaction.atomic():
        audit_record(
            actor=actor,
            project=webhook.project,
            action="webhook.deleted",
            target=webhook,
            before={"url": webhook.url, "events": webhook.events, "active": webhook.active},
        )
        webhook.delete()


def _delivery_enqueue(delivery_id: Any, *, countdown: float = 0) -> None:
    task_enqueue(
        WEBHOOK_DELIVER_TASK,
        str(delivery_id),
        queue="default",
        what=f"webhook delivery {delivery_id}",
        record=lambda task_id: WebhookDelivery.objects.filter(pk=delivery_id).update(
            task_id=task_id
        ),
        countdown=countdown or None,
    )


def _delivery_create(*, webhook: Webhook, event: str, payload: dict) -> WebhookDelivery:
    delivery = WebhookDelivery.objects.create(
        webhook=webhook, event=event, payload=payload, next_attempt_at=timezone.now()
    )
    transaction.on_commit(lambda: _delivery_enqueue(delivery.pk))
    return delivery


def webhooks_notify(*, project: Project, event: str, payload: dict) -> None:
    """Queue ``event`` for every active webhook of the project subscribed to it; the POSTs
    happen after the caller's transaction commits (nothing is sent for a rolled-back change)."""
    body = json.loads(json.dumps(payload, default=str))  # JSON-safe, as it will be sent
    for webhook in Webhook.objects.filter(project=project, active=True):
        if event in webhook.events or ALL_EVENTS in webhook.events:
            _delivery_create(webhook=webhook, event=event, payload=body)


def webhook_redeliver(*, delivery: WebhookDelivery, actor: AbstractBaseUser | None) -> None:
    """Send a past delivery's event again, as a new delivery (the old one stays in the log)."""
    with transaction.atomic():
        new = _delivery_create(
            webhook=delivery.webhook, event=delivery.event, payload=delivery.payload
        )
        audit_record(
            actor=actor,
            project=delivery.webhook.project,
            action="webhook.redelivered",
            target=delivery.webhook,
            after={"delivery": str(new.pk), "of": str(delivery.pk), "event": delivery.event},
        )


def _body(delivery: WebhookDelivery) -> bytes:
    envelope = {
        "event": delivery.event,
        "delivery": str(delivery.pk),
        "project": delivery.webhook.project.slug,
        "created_at": delivery.created_at.isoformat(),
        "data": delivery.payload,
    }
    return json.dumps(envelope, sort_keys=True, separators=(",", ":")).encode()


def webhook_delivery_attempt(*, delivery_id: Any) -> WebhookDelivery | None:
    """Make one attempt at a delivery; on failure schedule the next (or end ``failed``).

    Safe under redelivery of the task: the attempt is claimed by a compare-and-swap on
    ``attempts``, and a delivery that is final, or not yet due, is left alone.
    """
    delivery = (
        WebhookDelivery.objects.select_related("webhook__project").filter(pk=delivery_id).first()
    )
    if delivery is None or delivery.state != DeliveryState.PENDING:
        return delivery
    now = timezone.now()
    if delivery.next_attempt_at and delivery.next_attempt_at > now + timedelta(seconds=1):
        return delivery  # an early duplicate of a scheduled retry
    claimed = WebhookDelivery.objects.filter(
        pk=delivery.pk, state=DeliveryState.PENDING, attempts=delivery.attempts
    ).update(attempts=F("attempts") + 1, updated_at=now)
    if claimed != 1:
        return delivery  # another worker took this attempt
    attempts = delivery.attempts + 1
    webhook = delivery.webhook
    status_code: int | None = None
    error = ""
    try:
        if not webhook.active:
            raise InvalidState("The webhook was deactivated.")
        body = _body(delivery)
        # Checked and pinned here, not only at creation: what the name resolves to now is
        # where the request goes.
        status_code, phrase = outbound_post(
            webhook.url,
            content=body,
            headers={
                "Content-Type": "application/json",
                "User-Agent": "coevo-webhooks",
                "X-Coevo-Event": delivery.event,
                "X-Coevo-Delivery": str(delivery.pk),
                "X-Coevo-Signature": webhook_signature(secret=webhook.secret, body=body),
            },
            timeout_s=float(settings.COEVO_WEBHOOK_TIMEOUT_S),
            allowed=settings.COEVO_WEBHOOK_ALLOWED_HOSTS,
        )
        if not 200 <= status_code < 300:
            # The status only: the reply body is not read, so it cannot reach the log.
            error = f"HTTP {status_code} {phrase}".rstrip()
    except (InvalidInput, InvalidState) as exc:
        error = str(exc)
        attempts = max(attempts, settings.COEVO_WEBHOOK_MAX_ATTEMPTS)  # retrying cannot help
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"

    done = timezone.now()
    fields: dict[str, Any] = {
        "last_status_code": status_code,
        "last_error": error[:_ERROR_LIMIT],
        "updated_at": done,
    }
    if not error:
        fields.update(state=DeliveryState.DELIVERED, delivered_at=done, next_attempt_at=None)
    elif attempts >= settings.COEVO_WEBHOOK_MAX_ATTEMPTS:
        fields.update(state=DeliveryState.FAILED, next_attempt_at=None)
    else:
        delay = webhook_backoff_s(attempts=attempts)
        fields.update(next_attempt_at=done + timedelta(seconds=delay))
    WebhookDelivery.objects.filter(pk=delivery.pk, state=DeliveryState.PENDING).update(**fields)
    if error and "next_attempt_at" in fields and fields["next_attempt_at"] is not None:
        logger.info(
            "webhook delivery %s: attempt %d failed (%s); retry in %.1fs",
            delivery.pk,
            attempts,
            error[:200],
            delay,
        )
        _delivery_enqueue(delivery.pk, countdown=delay)
    elif error:
        logger.warning(
            "webhook delivery %s failed after %d attempt(s): %s", delivery.pk, attempts, error[:200]
        )
    delivery.refresh_from_db()
    return delivery


def webhook_deliveries_requeue_due(*, grace_s: float = 300) -> int:
    """Beat's sweep: re-enqueue pending deliveries overdue by ``grace_s`` (a lost message, a
    broker that was down at enqueue time). Receivers dedupe on X-Coevo-Delivery."""
    cutoff = timezone.now() - timedelta(seconds=grace_s)
    ids = list(
        WebhookDelivery.objects.filter(
            state=DeliveryState.PENDING, next_attempt_at__lt=cutoff
        ).values_list("pk", flat=True)[:500]
    )
    for pk in ids:
        _delivery_enqueue(pk)
    return len(ids)
