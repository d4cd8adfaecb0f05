"""Bearer token authentication for the API (tokens: coevo.accounts)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from coevo.accounts.models import ApiToken
from coevo.accounts.services import token_authenticate
from coevo.errors import NotAuthenticated

WWW_AUTHENTICATE = 'Bearer realm="coevo"'


class BearerTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer coevo_<prefix>_<secret>``. No header: anonymous (then 401)."""

    def authenticate(self, request: Request) -> tuple[Any, ApiToken] | None:
        header = authentication.get_authorization_header(request).decode("latin-1").strip()
        if not header:
            return None
        scheme, _, raw = header.partition(" ")
        if scheme.lower() != "bearer" or not raw.strip():
            raise exceptions.AuthenticationFailed(
                "Send the token as 'Authorization: Bearer <token>'."
            )
        try:
            token = token_authenticate(raw=raw.strip())
        except NotAuthenticated as exc:
            raise exceptions.AuthenticationFailed(str(exc)) from None
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        # Makes DRF answer 401 (not 403) to requests without credentials.
        return WWW_AUTHENTICATE


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "coevo.api.authentication.BearerTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "bearerFormat": "coevo_<prefix>_<secret>"}
