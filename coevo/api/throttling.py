from __future__ import annotations

import time
from typing import Any

from django.conf import settings
from rest_framework.request import Request
from rest_framework.throttling import SimpleRateThrottle

from coevo.accounts.models import ApiToken
from coevo.outages import RETRY_AFTER_S, outage_of, outage_warning

# Until when (time.monotonic) this process skips the rate limit because the cache failed: a
# Redis that stopped answering costs each request its socket timeout, so only the first
# request in each window pays it.
_cache_down_until = 0.0


class TokenRateThrottle(SimpleRateThrottle):
    """COEVO_API_RATE requests per token, counted in the shared cache (Redis when configured),
    so every web process enforces one limit.

    A cache that is down lets every request through (logged, rate-limited): the limit protects
    the server's capacity from one busy token, and is not worth refusing every API call for
    while Redis restarts."""

    scope = "token"

    def get_rate(self) -> str:
        # Read per request (not at import) so the limit can be changed in settings and tests.
        return settings.COEVO_API_RATE

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        token = request.auth
        if not isinstance(token, ApiToken):
            return None
        return f"coevo-api-throttle:{token.id}"

    def allow_request(self, request: Request, view: Any) -> bool:
        global _cache_down_until
        if time.monotonic() < _cache_down_until:
            return True
        try:
            return super().allow_request(request, view)
        except Exception as exc:
            dependency = outage_of(exc)
            if dependency is None:
                raise
            _cache_down_until = time.monotonic() + RETRY_AFTER_S
            outage_warning(
                dependency,
                "the API rate limit is not enforced",
                exc,
                example=f"{request.method} {request.path}",
            )
            return True
