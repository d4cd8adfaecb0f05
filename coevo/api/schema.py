"""OpenAPI additions: the error shape on every operation, so clients (and schemathesis) can
check error responses too, and a tag per resource (coevo.api.views serves the schema)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.openapi import AutoSchema

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


# Path segments whose tag is not the segment itself.
_TAG_ALIASES = {"training-runs": "training", "trainers": "training"}


class ResourceAutoSchema(AutoSchema):
    """Tags each operation by its resource: the first segment after ``projects/{slug}/`` (or
    after ``/api/v1/`` outside a project), so one rule here tags every view, present and
    future, and a new resource fails tests/api/test_schema.py until SPECTACULAR_SETTINGS["TAGS"]
    describes it."""

    def get_tags(self) -> list[str]:
        segments = self._tokenize_path()
        if not segments:
            return []
        segment = segments[1] if segments[0] == "projects" and len(segments) > 1 else segments[0]
        return [_TAG_ALIASES.get(segment, segment)]
