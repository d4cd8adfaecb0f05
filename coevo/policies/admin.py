from typing import Any

from django.contrib import admin
from django.db import models, transaction
from django.forms.models import model_to_dict
from django.http import HttpRequest

from coevo.audit.services import audit_record
from coevo.policies.models import PolicyEndpoint, PolicyVersion


class AuditedAdmin(admin.ModelAdmin):
    """Policy changes are audited (global events: endpoints and versions are shared)."""

    def save_model(self, request: HttpRequest, obj: models.Model, form: Any, change: bool) -> None:
        before = model_to_dict(type(obj).objects.get(pk=obj.pk)) if change else None
        with transaction.atomic():
            super().save_model(request, obj, form, change)
            audit_record(
                actor=request.user,
                project=None,
                action=f"{obj._meta.model_name}.{'changed' if change else 'created'}",
                target=obj,
                before=before,
                after=model_to_dict(obj),
            )

    def delete_model(self, request: HttpRequest, obj: models.Model) -> None:
        with transaction.atomic():
            audit_record(
                actor=request.user,
                project=None,
                action=f"{obj._meta.model_name}.deleted",
                target=obj,
                before=model_to_dict(obj),
            )
            super().delete_model(request, obj)

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        for obj in queryset:
            self.delete_model(request, obj)


@admin.register(PolicyEndpoint)
class PolicyEndpointAdmin(AuditedAdmin):
    """Operators size ``max_concurrency`` to what the server sustains (workers honour it)."""

    list_display = ["name", "base_url", "kind", "max_concurrency"]
    list_editable = ["max_concurrency"]


@admin.register(PolicyVersion)
class PolicyVersionAdmin(AuditedAdmin):
    list_display = ["name", "served_name", "base_model", "endpoint"]
    list_filter = ["endpoint"]
