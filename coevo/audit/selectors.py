"""Reading the audit log and webhook deliveries."""

from __future__ import annotations

import datetime
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.db import connection
from django.db.models import Q, QuerySet

from coevo.audit.models import AuditEvent, Webhook, WebhookDelivery
from coevo.db import keyset_slice
from coevo.errors import InvalidInput, NotFound

if TYPE_CHECKING:
    from coevo.projects.models import Project


@dataclass(frozen=True)
class AuditPage:
    events: list[AuditEvent]
    # Pass as ``cursor`` to get the next (older) page; None on the last page.
    next_cursor: str | None


def _cursor_encode(event: AuditEvent) -> str:
    return f"{event.created_at.isoformat()}|{event.pk}"


def _cursor_decode(cursor: str) -> tuple[datetime.datetime, str]:
    try:
        stamp, pk = cursor.split("|", 1)
        return datetime.datetime.fromisoformat(stamp), pk
    except ValueError:
        raise InvalidInput("That page link is broken: start again from the first page.") from None


def audit_event_list(
    *,
    project: Project | None = None,
    global_only: bool = False,
    actor: str | None = None,
    action_prefix: str | None = None,
    target_type: str | None = None,
    since: datetime.datetime | None = None,
    until: datetime.datetime | None = None,
) -> QuerySet[AuditEvent]:
    """Events newest first, filtered. ``project`` None lists all projects' events (staff);
    ``actor`` matches the username (``system`` for events without a user)."""
    events = AuditEvent.objects.all()
    if project is not None:
        events = events.filter(project_id=project.pk)
    elif global_only:
        events = events.filter(project__isnull=True)
    if actor:
        events = events.filter(actor_label=actor)
    if action_prefix:
        # "channel" matches "channel.moved" and "channel" itself, but not "channelx.*".
        prefix = action_prefix.rstrip(".")
        events = events.filter(Q(action=prefix) | Q(action__startswith=prefix + "."))
    if target_type:
        events = events.filter(target_type__iexact=target_type)
    if since is not None:
        events = events.filter(created_at__gte=since)
    if until is not None:
        events = events.filter(created_at__lt=until)
    return events.select_related("project").order_by("-created_at", "-id")


def audit_event_page(
    *, events: QuerySet[AuditEvent], cursor: str | None = None, limit: int = 50
) -> AuditPage:
    """One page of ``events`` (ordered newest first) after ``cursor``: keyset pagination, so
    new events arriving while someone pages never shift or repeat rows."""
    limit = max(1, min(limit, 500))
    if cursor:
        stamp, pk = _cursor_decode(cursor)
        events = events.filter(Q(created_at__lt=stamp) | Q(created_at=stamp, id__lt=pk))
    rows, more = keyset_slice(events, limit)
    return AuditPage(events=rows, next_cursor=_cursor_encode(rows[-1]) if more else None)


def audit_target_types(*, project: Project | None) -> list[str]:
    if project is not None:
        events = AuditEvent.objects.filter(project_id=project.pk).order_by()
        return sorted(set(events.values_list("target_type", flat=True).distinct()))
    # The whole log (a million events and more): hop from one type to the next along the
    # target_type index (a loose index scan), a few index lookups instead of reading it all.
    table = connection.ops.quote_name(AuditEvent._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH RECURSIVE types(t) AS ("
            f" (SELECT target_type FROM {table} ORDER BY target_type LIMIT 1)"
            f" UNION ALL SELECT (SELECT target_type FROM {table} WHERE target_type > types.t"
            f" ORDER BY target_type LIMIT 1) FROM types WHERE types.t IS NOT NULL"
            f") SELECT t FROM types WHERE t IS NOT NULL"
        )
        return [row[0] for row in cursor.fetchall()]


def webhook_list(*, project: Project) -> QuerySet[Webhook]:
    return Webhook.objects.filter(project=project).select_related("created_by")


def webhook_delivery_list(*, project: Project, limit: int = 100) -> QuerySet[WebhookDelivery]:
    return WebhookDelivery.objects.filter(webhook__project=project).select_related("webhook")[
        :limit
    ]


def _uuid_or_none(value: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return None


def webhook_delivery_get(*, project: Project, delivery_id: str) -> WebhookDelivery:
    pk = _uuid_or_none(delivery_id)
    delivery = (
        WebhookDelivery.objects.select_related("webhook__project")
        .filter(webhook__project=project, pk=pk)
        .first()
        if pk
        else None
    )
    if delivery is None:
        raise NotFound("No such webhook delivery in this project.")
    return delivery


def webhook_get(*, project: Project, webhook_id: str) -> Webhook:
    pk = _uuid_or_none(webhook_id)
    webhook = Webhook.objects.filter(project=project, pk=pk).first() if pk else None
    if webhook is None:
        raise NotFound("No such webhook in this project.")
    return webhook
