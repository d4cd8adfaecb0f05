"""OpenAPI additions: the error shape on every operation, so clients (and schemathesis) can
check error responses too."""

from __future__ import annotations

from typing import Any

ERROR_SCHEMA = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "code": {"type": "string"},
                "message": {"type": "string"},
                "details": {"type": "object", "additionalProperties": True},
            },
            "required": ["code", "message", "details"],
        }
    },
    "required": ["error"],
}

_ALWAYS = {
    "400": "Invalid input",
    "401": "No token, or an unknown, revoked or expired one",
    "403": "The token lacks the scope, or the user the role",
    "404": "No such object (or not a member of its project)",
    "405": "Method not allowed",
    "406": "Not acceptable",
    "429": "Rate limit reached (see Retry-After)",
    "503": "The database, Redis or the broker is unavailable: try again after Retry-After",
}
_WRITES = {
    "409": "The object's state refuses the action",
    "413": "The body or upload is too large",
    "415": "Unsupported media type",
}


def add_error_responses(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas["Error"] = ERROR_SCHEMA
    ref = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    for operations in result.get("paths", {}).values():
        for method, operation in operations.items():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            extra = dict(_ALWAYS)
            if method in ("post", "put", "patch"):
                extra.update(_WRITES)
            for status, description in extra.items():
                operation["responses"].setdefault(
                    status, {"description": description, "content": ref}
                )
    return result
