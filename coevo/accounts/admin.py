from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from coevo.accounts.forms import AdminLoginForm
from coevo.accounts.models import SCOPES, ApiToken
from coevo.accounts.services import token_create, token_revoke, token_scopes_validate
from coevo.errors import CoevoError

# The admin's login says when the login throttle refused an attempt (the throttle itself is in
# the authentication backend, so it holds for the admin with or without this form).
admin.site.login_form = AdminLoginForm


class ApiTokenAddForm(forms.ModelForm):
    scopes = forms.MultipleChoiceField(
        choices=[(scope, scope) for scope in SCOPES], widget=forms.CheckboxSelectMultiple
    )

    class Meta:
        model = ApiToken
        fields = ["user", "name", "kind", "scopes", "expires_at"]

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if data.get("user") and data.get("kind") and data.get("scopes"):
            try:
                data["scopes"] = token_scopes_validate(
                    user=data["user"], kind=data["kind"], scopes=list(data["scopes"])
                )
            except CoevoError as exc:
                raise forms.ValidationError(str(exc)) from None
        return data


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("name", "user", "kind", "prefix", "scopes", "last_used_at", "revoked_at")
    list_filter = ("kind",)
    search_fields = ("name", "prefix", "user__username")
    actions = ["revoke"]
    readonly_fields = (
        "user",
        "name",
        "kind",
        "prefix",
        "scopes",
        "created_by",
        "created_at",
        "last_used_at",
        "expires_at",
        "revoked_at",
    )

    def get_form(self, request: HttpRequest, obj: Any = None, **kwargs: Any) -> Any:
        if obj is None:
            kwargs["form"] = ApiTokenAddForm
        return super().get_form(request, obj, **kwargs)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        # A token's secret cannot be changed, only revoked; adding one goes through the form.
        return self.readonly_fields if obj is not None else ()

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return self.readonly_fields if obj is not None else ApiTokenAddForm.Meta.fields

    def save_model(self, request: HttpRequest, obj: ApiToken, form: Any, change: bool) -> None:
        if change:
            return
        token, raw = token_create(
            user=form.cleaned_data["user"],
            name=form.cleaned_data["name"],
            kind=form.cleaned_data["kind"],
            scopes=form.cleaned_data["scopes"],
            expires_at=form.cleaned_data.get("expires_at"),
            created_by=request.user,
        )
        # The admin goes on with ``obj`` (log entry, redirect): make it the stored token.
        obj.pk = token.pk
        obj.prefix = token.prefix
        obj._state.adding = False
        messages.warning(
            request,
            f"Token for {token.user}: {raw} — copy it now, it will not be shown again.",
        )

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        revoked = sum(token_revoke(token=token, actor=request.user) for token in queryset)
        self.message_user(request, f"{revoked} token(s) revoked.")
