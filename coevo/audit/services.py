"""Writing the audit log. Every state change a human cares about goes through audit_record."""

from __future__ import annotations

import datetime
import decimal
import enum
import uuid
from typing import TYPE_CHECKING, Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import models

from coevo.audit.models import AuditEvent

if TYPE_CHECKING:  # audit sits below every app it records, projects included
    from coevo.projects.models import Project

# Public ids first (see STYLE: UUIDs, slugs or SHAs), the integer pk only as a last resort.
_ID_FIELDS = ("sha", "slug", "username", "name", "pk")


def _target_id(target: models.Model) -> str:
    for field in _ID_FIELDS:
        value = getattr(target, field, None)
        if value not in (None, "") and not callable(value):
            if field == "name" and not _is_unique(target, "name"):
                continue
            return str(value)
    return ""


def _is_unique(target: models.Model, field: str) -> bool:
    try:
        return bool(target._meta.get_field(field).unique)
    except Exception:  # noqa: BLE001 - a property, not a field
        return False


def _json_safe(value: Any) -> Any:
    """Turn a before/after snapshot into plain JSON (the column is JSON; Django's encoder
    would accept some of these, but a UUID or a model read back as a string is clearer)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_json_safe(v) for v in value]
    if isinstance(value, enum.Enum):
        return _json_safe(value.value)
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, uuid.UUID | decimal.Decimal):
        return str(value)
    if isinstance(value, models.Model):
        return _target_id(value) or str(value)
    return str(value)


def audit_record(
    *,
    actor: AbstractBaseUser | None,
    project: Project | None,
    action: str,
    target: models.Model,
    before: dict | None = None,
    after: dict | None = None,
) -> None:
    """Append one event: ``actor`` (None: the system) did ``action`` (dotted, e.g.
    ``channel.moved``) to ``target`` in ``project`` (None: a global event).

    Call it inside the transaction that makes the change, so the event and the change
    commit (or roll back) together.
    """
    is_user = actor is not None and getattr(actor, "is_authenticated", False)
    AuditEvent.objects.create(
        project=project,
        actor=actor if is_user else None,
        actor_label=actor.get_username() if is_user else "system",
        action=action,
        target_type=target._meta.label,
        target_id=_target_id(target)[:100],
        target_label=str(target)[:300],
        before=_json_safe(before) if before is not None else None,
        after=_json_safe(after) if after is not None else None,
    )
