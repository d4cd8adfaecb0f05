from __future__ import annotations

from typing import Any

from django import forms

from coevo.accounts.models import SCOPES, TokenKind


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
