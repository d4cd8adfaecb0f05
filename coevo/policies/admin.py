from typing import Any

from django import forms
from django.contrib import admin
from django.db import models, transaction
from django.forms.models import model_to_dict
from django.http import HttpRequest

from coevo.audit.services import audit_record
from coevo.errors import InvalidInput
from coevo.policies.models import LoadedAdapter, ModelPrice, PolicyEndpoint, PolicyVersion
from coevo.policies.prices import model_price_check, model_price_create
from coevo.policies.secrets import MAX_API_KEY_CHARS, SecretsKeyMissing, secret_encrypt
from coevo.policies.services import policy_endpoint_api_key_revoke, policy_endpoint_api_key_set


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


class PolicyEndpointForm(forms.ModelForm):
    """The endpoint with its API key write-only: typed in, stored encrypted, never shown again
    (the page says only whether one is set)."""

    base_url = forms.URLField(max_length=500, assume_scheme="http")
    api_key = forms.CharField(
        label="API key",
        required=False,
        max_length=MAX_API_KEY_CHARS,
        strip=True,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Write-only: a new key replaces the stored one; leave empty to keep it. "
        "Sent as Authorization: Bearer (x-api-key for the Anthropic API).",
    )
    revoke_api_key = forms.BooleanField(
        label="Revoke the API key", required=False, help_text="Forget the stored key."
    )

    class Meta:
        model = PolicyEndpoint
        fields = ["name", "base_url", "kind", "max_concurrency"]

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if data.get("api_key") and data.get("revoke_api_key"):
            raise forms.ValidationError("Set a new API key or revoke the key, not both.")
        if data.get("api_key"):
            try:
                secret_encrypt(plain="check")
            except SecretsKeyMissing as exc:
                raise forms.ValidationError(str(exc)) from None
        return data


@admin.register(PolicyEndpoint)
class PolicyEndpointAdmin(AuditedAdmin):
    """Operators size ``max_concurrency`` to what the server sustains (workers honour it).
    Health is written by the beat check, so it is read-only here. The API key is write-only
    (PolicyEndpointForm); setting, rotating and revoking it are audited events of their own."""

    form = PolicyEndpointForm

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
    readonly_fields = ["api_key_status", *_HEALTH]

    @admin.display(description="API key")
    def api_key_status(self, obj: PolicyEndpoint) -> str:
        if not obj.has_api_key:
            return "not set"
        return f"set {obj.api_key_set_at:%Y-%m-%d %H:%M}" if obj.api_key_set_at else "set"

    def save_model(self, request: HttpRequest, obj: models.Model, form: Any, change: bool) -> None:
        with transaction.atomic():
            super().save_model(request, obj, form, change)
            if form.cleaned_data.get("api_key"):
                policy_endpoint_api_key_set(
                    endpoint=obj, api_key=form.cleaned_data["api_key"], actor=request.user
                )
            elif form.cleaned_data.get("revoke_api_key"):
                policy_endpoint_api_key_revoke(endpoint=obj, actor=request.user)


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


PRICE_FIELDS = ("input_per_m", "cached_input_per_m", "cache_write_per_m", "output_per_m")


class ModelPriceForm(forms.ModelForm):
    """A new price row; ``effective_from`` empty means now. A start in the past is refused
    (coevo.policies.prices.model_price_create says why)."""

    effective_from = forms.DateTimeField(
        required=False, help_text="When it starts to apply (empty: now). Never in the past."
    )

    class Meta:
        model = ModelPrice
        fields = [
            "endpoint",
            "model",
            "effective_from",
            "input_per_m",
            "cached_input_per_m",
            "cache_write_per_m",
            "output_per_m",
            "note",
        ]
        help_texts = {
            "model": "The served model name it prices; empty: every model of the endpoint "
            "without a row of its own.",
            "input_per_m": "US dollars per million prompt tokens.",
            "cached_input_per_m": "US dollars per million prompt tokens served from the "
            "provider's prompt cache.",
            "cache_write_per_m": "US dollars per million prompt tokens written to the "
            "provider's prompt cache (Anthropic's cache writes); empty: the input price.",
            "output_per_m": "US dollars per million completion tokens.",
        }

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        try:
            model_price_check(
                effective_from=data.get("effective_from"),
                prices=[data.get(f) for f in PRICE_FIELDS],
            )
        except InvalidInput as exc:
            raise forms.ValidationError(str(exc)) from None
        return data


@admin.register(ModelPrice)
class ModelPriceAdmin(admin.ModelAdmin):
    """The price table: operators add rows, never change or delete one (a call keeps the price
    that applied when it was made; a new price is a new row from its time). Each row is audited."""

    form = ModelPriceForm
    list_display = [
        "endpoint",
        "model",
        "effective_from",
        "input_per_m",
        "cached_input_per_m",
        "cache_write_per_m",
        "output_per_m",
        "note",
    ]
    list_filter = ["endpoint"]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # The list and a row's page stay readable; only adding writes.
        return obj is None and super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: ModelPrice, form: Any, change: bool) -> None:
        data = form.cleaned_data
        saved = model_price_create(
            endpoint=data["endpoint"],
            model=data["model"],
            input_per_m=data["input_per_m"],
            cached_input_per_m=data["cached_input_per_m"],
            cache_write_per_m=data.get("cache_write_per_m"),
            output_per_m=data["output_per_m"],
            effective_from=data.get("effective_from"),
            note=data.get("note") or "",
            actor=request.user,
        )
        obj.pk = saved.pk
