from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth import forms as auth_forms
from django.http import HttpRequest

from coevo.accounts.login_throttle import (
    client_address,
    login_block_get,
    login_failure_record,
    login_success_record,
)
from coevo.accounts.models import SCOPES, TokenKind

THROTTLED = "throttled"


class TokenCreateForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="Where the token is used, e.g. 'CI main'.")
    kind = forms.ChoiceField(choices=TokenKind.choices, initial=TokenKind.PERSONAL)
    scopes = forms.MultipleChoiceField(
        choices=[(scope, scope) for scope in SCOPES],
        widget=forms.CheckboxSelectMultiple,
        initial=["read"],
    )
    expires_at = forms.DateTimeField(
        required=False, help_text="Optional, e.g. 2027-01-31 00:00 (UTC)."
    )

    def cleaned_token_args(self) -> dict[str, Any]:
        data = self.cleaned_data
        return {
            "name": data["name"],
            "kind": data["kind"],
            "scopes": list(data["scopes"]),
            "expires_at": data.get("expires_at"),
        }


class _ThrottledLoginMixin:
    """Says so when the login throttle refused the attempt, instead of "didn't match".

    The backend (coevo.accounts.backends) counts failures and refuses blocked attempts; the
    form only turns that refusal into its message. The check comes after the attempt, so the
    failure that reaches the limit already answers with the block."""

    request: HttpRequest | None
    cleaned_data: dict[str, Any]

    def clean(self) -> dict[str, Any]:
        try:
            return super().clean()  # type: ignore[misc]
        except forms.ValidationError:
            blocked = login_block_get(
                username=self.cleaned_data.get("username"), address=client_address(self.request)
            )
            if blocked is not None:
                raise forms.ValidationError(blocked.message, code=THROTTLED) from None
            raise


class LoginForm(_ThrottledLoginMixin, auth_forms.AuthenticationForm):
    pass


class AdminLoginForm(_ThrottledLoginMixin, AdminAuthenticationForm):
    pass


class PasswordChangeForm(auth_forms.PasswordChangeForm):
    """The old password is a password check too: it counts against the account (and the
    address) like a login, and a blocked account cannot check it either."""

    def __init__(self, user: Any, *args: Any, request: HttpRequest | None = None, **kwargs: Any):
        super().__init__(user, *args, **kwargs)
        self.request = request

    def clean_old_password(self) -> str:
        username = self.user.get_username()
        address = client_address(self.request)
        blocked = login_block_get(username=username, address=address)
        if blocked is not None:
            raise forms.ValidationError(blocked.message, code=THROTTLED)
        try:
            old_password = super().clean_old_password()
        except forms.ValidationError:
            blocked = login_failure_record(username=username, address=address)
            if blocked is not None:
                raise forms.ValidationError(blocked.message, code=THROTTLED) from None
            raise
        login_success_record(username=username)
        return old_password
