"""The one place where errors become API responses: ``{"error": {code, message, details}}``.

``code`` is stable (docs/api.md lists them); ``message`` says what was wrong and what to do.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.http import Http404, HttpRequest
from rest_framework import exceptions as drf
from rest_framework.response import Response

from coevo import errors
from coevo.api.authentication import WWW_AUTHENTICATE
from coevo.outages import RETRY_AFTER_S, mark_logged, outage_message, outage_of, outage_warning
from coevo.suites.models import SuiteInUse

logger = logging.getLogger(__name__)

# First match wins: subclasses before their bases.
_DOMAIN_STATUS: tuple[tuple[type[errors.CoevoError], int], ...] = (
    (errors.NotAuthenticated, 401),
    (errors.PermissionDenied, 403),
    (errors.NotFound, 404),
    (errors.PayloadTooLarge, 413),
    # A budget or a state conflict: the request was well-formed, the server's state refuses it.
    (errors.BudgetExceeded, 409),
    (errors.InvalidState, 409),
    (SuiteInUse, 409),
    (errors.PolicyUnavailable, 503),
    (errors.SandboxUnavailable, 503),
    (errors.InvalidInput, 400),
)

_DRF_CODES: tuple[tuple[type[drf.APIException], str], ...] = (
    (drf.NotAuthenticated, "not_authenticated"),
    (drf.AuthenticationFailed, "not_authenticated"),
    (drf.PermissionDenied, "permission_denied"),
    (drf.NotFound, "not_found"),
    (drf.ValidationError, "invalid_input"),
    (drf.ParseError, "invalid_input"),
    (drf.MethodNotAllowed, "method_not_allowed"),
    (drf.NotAcceptable, "not_acceptable"),
    (drf.UnsupportedMediaType, "unsupported_media_type"),
    (drf.Throttled, "throttled"),
)


def error_body(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": details or {}}}


def error_response(
    status: int, code: str, message: str, details: dict[str, Any] | None = None
) -> Response:
    response = Response(error_body(code, message, details), status=status)
    if status == 401:
        response["WWW-Authenticate"] = WWW_AUTHENTICATE
    return response


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response:
    if isinstance(exc, errors.CoevoError):
        return _domain_response(exc)
    if isinstance(exc, Http404):
        return error_response(404, "not_found", "Not found.")
    if isinstance(exc, DjangoPermissionDenied):
        return error_response(403, "permission_denied", "You may not do this.")
    if isinstance(exc, RequestDataTooBig):
        return error_response(413, "payload_too_large", "The request body is too large.")
    if isinstance(exc, (TooManyFieldsSent, TooManyFilesSent)):
        return error_response(400, "invalid_input", str(exc) or "Too many form fields or files.")
    if isinstance(exc, drf.APIException):
        return _drf_response(exc)
    request: HttpRequest | None = getattr(context.get("request"), "_request", None)
    dependency = outage_of(exc)
    if dependency is not None:
        # The database, Redis or the broker is down: not a bug, and over in seconds.
        outage_warning(
            dependency,
            "the API answers 503",
            exc,
            example=f"{getattr(request, 'method', '?')} {getattr(request, 'path', '?')}",
        )
        response = error_response(
            503,
            f"{dependency}_unavailable",
            outage_message(dependency),
            {"dependency": str(dependency), "retry_after": RETRY_AFTER_S},
        )
        response["Retry-After"] = str(RETRY_AFTER_S)
        return mark_logged(response)
    logger.exception(
        "API error on %s %s",
        getattr(request, "method", "?"),
        getattr(request, "path", "?"),
        exc_info=exc,
    )
    return error_response(
        500, "server_error", "The server failed on this request; it has been logged."
    )


def _domain_response(exc: errors.CoevoError) -> Response:
    status = next((s for cls, s in _DOMAIN_STATUS if isinstance(exc, cls)), 400)
    details: dict[str, Any] = {}
    if isinstance(exc, errors.MissingPrerequisites):
        details["missing"] = list(exc.missing)
    if hasattr(exc, "errors") and isinstance(exc.errors, list):
        # e.g. a suite file: every problem found, each naming its line and field.
        details["errors"] = [str(e) for e in exc.errors]
        if hasattr(exc, "total"):
            details["total"] = exc.total
    return error_response(status, exc.code, str(exc) or exc.__class__.__name__, details)


def _drf_response(exc: drf.APIException) -> Response:
    code = next((c for cls, c in _DRF_CODES if isinstance(exc, cls)), None)
    code = code or str(getattr(exc, "default_code", "error"))
    details: dict[str, Any] = {}
    if isinstance(exc, drf.ValidationError):
        detail = exc.detail
        details = {"fields": detail} if isinstance(detail, dict) else {"non_field_errors": detail}
        message = _first_message(detail) or "Invalid input."
    else:
        message = str(exc.detail)
    response = error_response(exc.status_code, code, message, details)
    if isinstance(exc, drf.Throttled) and exc.wait is not None:
        wait = math.ceil(exc.wait)
        response["Retry-After"] = str(wait)
        response.data["error"]["details"] = {"retry_after": wait}
    return response


def _first_message(detail: Any, path: str = "") -> str:
    if isinstance(detail, dict):
        for key, value in detail.items():
            found = _first_message(value, f"{path}.{key}" if path else str(key))
            if found:
                return found
        return ""
    if isinstance(detail, list):
        for value in detail:
            found = _first_message(value, path)
            if found:
                return found
        return ""
    return f"{path}: {detail}" if path else str(detail)
