from typing import Any

from django.contrib import admin
from django.db import models, transaction
from django.forms.models import model_to_dict
from django.http import HttpRequest

from coevo.audit.services import audit_record
from coevo.policies.models import LoadedAdapter, PolicyEndpoint, PolicyVersion


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


_HEALTH = ["healthy", "checked_at", "latency_ms", "consecutive_failures", "failed_at", "last_error"]


@admin.register(LoadedAdapter)
class LoadedAdapterAdmin(admin.ModelAdmin):
    """Adapters coevo loaded on vLLM endpoints (read-only: the beat job unloads idle ones)."""

    list_display = ["adapter_name", "endpoint", "adapter_path", "last_used_at"]
    list_filter = ["endpoint"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(PolicyEndpoint)
class PolicyEndpointAdmin(AuditedAdmin):
    """Operators size ``max_concurrency`` to what the server sustains (workers honour it).
    Health is written by the beat check, so it is read-only here."""

    list_display = [
        "name",
        "base_url",
        "kind",
        "max_concurrency",
        "healthy",
        "checked_at",
        "latency_ms",
        "consecutive_failures",
    ]
    list_editable = ["max_concurrency"]
    list_filter = ["kind", "healthy"]
    readonly_fields = _HEALTH


@admin.register(PolicyVersion)
class PolicyVersionAdmin(AuditedAdmin):
    list_display = ["name", "served_name", "base_model", "adapter_name", "parent", "endpoint"]
    list_filter = ["endpoint"]
    raw_id_fields = ["parent"]
    filter_horizontal = ["replicas"]
    fieldsets = [
        (None, {"fields": ["name", "base_model", "served_name", "endpoint", "replicas"]}),
        ("LoRA adapter", {"fields": ["adapter_name", "adapter_path", "parent"]}),
        ("Provenance", {"fields": ["provenance"]}),
    ]
