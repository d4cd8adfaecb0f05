"""The append-only audit log and the webhooks that tell outside systems about events."""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.db import models

from coevo.db import TimeStampedModel
from coevo.errors import InvalidState


class AuditEvent(models.Model):
    """Who did what to which object, when, with the object's state before and after.

    Append-only: the model refuses to update or delete a row, and on PostgreSQL a trigger
    (migration 0001) refuses UPDATE and DELETE from any client, so not even raw SQL or a
    queryset ``update()`` can rewrite history.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Null for global events (e.g. a staff-only setting); PROTECT-free on purpose: deleting a
    # project must not silently erase its history, so the row keeps the id in ``project_ref``.
    project = models.ForeignKey(
        "projects.Project",
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
    )
    # Null means "the system" (a task, a management command); the username is kept as text so
    # the row still says who acted after the user is deleted.
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
    )
    actor_label = models.CharField(max_length=150, blank=True)
    action = models.CharField(max_length=100, db_index=True)
    target_type = models.CharField(max_length=100, db_index=True)
    target_id = models.CharField(max_length=100)
    target_label = models.CharField(max_length=300, blank=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            # The project audit page: newest first within one project.
            models.Index(fields=["project", "-created_at"], name="audit_project_created"),
            # The audit log filtered by who acted: newest first for one actor (a rare actor
            # read a million events without it).
            models.Index(fields=["actor_label", "-created_at"], name="audit_actor_created"),
        ]

    def __str__(self) -> str:
        return f"{self.action} {self.target_type}:{self.target_id}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise InvalidState("Audit events are append-only: they cannot be changed.")
        kwargs["force_insert"] = True
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        raise InvalidState("Audit events are append-only: they cannot be deleted.")


class Webhook(TimeStampedModel):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    project = models.ForeignKey(
        "projects.Project", on_delete=models.CASCADE, related_name="webhooks"
    )
    url = models.URLField(max_length=500)
    # Stored in clear because signing needs it; shown once at creation, masked afterwards.
    secret = models.CharField(max_length=128)
    events = models.JSONField(default=list)
    active = models.BooleanField(default=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["created_at"]

    def __str__(self) -> str:
        return self.url

    @property
    def secret_masked(self) -> str:
        return f"{self.secret[:4]}…" if self.secret else ""


class DeliveryState(models.TextChoices):
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"


DELIVERY_FINAL_STATES = (DeliveryState.DELIVERED, DeliveryState.FAILED)


class WebhookDelivery(TimeStampedModel):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE, related_name="deliveries")
    event = models.CharField(max_length=100)
    payload = models.JSONField(default=dict)
    state = models.CharField(
        max_length=16, choices=DeliveryState.choices, default=DeliveryState.PENDING
    )
    attempts = models.PositiveIntegerField(default=0)
    last_status_code = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    task_id = models.CharField(max_length=64, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            # webhook_deliveries_due: pending deliveries whose retry time has come.
            models.Index(
                fields=["next_attempt_at"],
                name="webhook_delivery_due",
                condition=models.Q(state="pending"),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.event} → {self.webhook_id} ({self.state})"
