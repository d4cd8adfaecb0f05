"""Cursor pagination with strict parameters: a malformed ``limit`` or ``cursor`` is
``400 invalid_input``, never a silent fallback to the default page (docs/api.md)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import QuerySet
from rest_framework import serializers
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import Cursor, CursorPagination
from rest_framework.request import Request

PAGE_SIZE = 50
MAX_PAGE_SIZE = 200
# The messages follow the parameter's name ("limit: must be ...").
_LIMIT = f"must be a whole number from 1 to {MAX_PAGE_SIZE} (default {PAGE_SIZE})."
_CURSOR = "not a cursor this API gave out; follow a page's next or previous URL as it is."


class PageIn(serializers.Serializer):
    """The query parameters of every list; also what the schema declares for them."""

    cursor = serializers.CharField(
        required=False, help_text="From a previous page's next/previous URL."
    )
    limit = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_PAGE_SIZE,
        help_text=f"Items per page (at most {MAX_PAGE_SIZE}; default {PAGE_SIZE}).",
        error_messages={
            key: _LIMIT for key in ("invalid", "min_value", "max_value", "max_string_length")
        },
    )


class CreatedCursorPagination(CursorPagination):
    """Newest first; cursors stay valid while rows are added (no offsets that shift)."""

    ordering = ("-created_at", "-id")
    page_size = PAGE_SIZE
    page_size_query_param = "limit"
    max_page_size = MAX_PAGE_SIZE

    def get_page_size(self, request: Request) -> int:
        params = PageIn(data=request.query_params)
        params.is_valid(raise_exception=True)
        return params.validated_data.get("limit", self.page_size)

    def decode_cursor(self, request: Request) -> Cursor | None:
        try:
            return super().decode_cursor(request)
        except NotFound:
            raise ValidationError({"cursor": [_CURSOR]}) from None

    def paginate_queryset(
        self, queryset: QuerySet, request: Request, view: Any = None
    ) -> list[Any] | None:
        try:
            return super().paginate_queryset(queryset, request, view)
        except DjangoValidationError:
            # A cursor that decodes but whose position is no created_at (hand-made or
            # truncated): the filter on it refuses the value before any query runs.
            raise ValidationError({"cursor": [_CURSOR]}) from None
