"""Shared model bases."""

from typing import Any

from django.db import models


class TimeStampedModel(models.Model):
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    updated_at = models.DateTimeField(auto_now=True, db_index=True)

    class Meta:
        abstract = True


def keyset_slice(rows: Any, limit: int) -> tuple[list[Any], bool]:
    """The first ``limit`` rows of an ordered, already-filtered queryset, and whether more
    follow: one query for limit + 1 rows (keyset pagination's page, whatever its key)."""
    page = list(rows[: limit + 1])
    return page[:limit], len(page) > limit
