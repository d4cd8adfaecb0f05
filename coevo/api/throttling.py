from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework.request import Request
from rest_framework.throttling import SimpleRateThrottle

from coevo.accounts.models import ApiToken


class TokenRateThrottle(SimpleRateThrottle):
    """COEVO_API_RATE requests per token, counted in the shared cache (Redis when configured),
    so every web process enforces one limit."""

    scope = "token"

    def get_rate(self) -> str:
        # Read per request (not at import) so the limit can be changed in settings and tests.
        return settings.COEVO_API_RATE

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        token = request.auth
        if not isinstance(token, ApiToken):
            return None
        return f"coevo-api-throttle:{token.id}"
