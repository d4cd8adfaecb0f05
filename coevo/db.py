"""Shared model bases and database expressions."""

from collections.abc import Sequence
from typing import Any

from django.db import models
from django.db.models import Func


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


class JSONWithout(Func):
    """A JSON column without some of its paths, computed by the database (PostgreSQL's ``-``
    and ``#-``, SQLite's ``json_remove``): a list that shows a summary of a large document
    neither transfers nor parses the rest. ``omit``: paths as key tuples, e.g.
    ``[("diff",), ("comparison", "flips")]``; keys are code's constants, never user input."""

    output_field = models.JSONField()

    def __init__(self, expression: Any, *, omit: Sequence[tuple[str, ...]]) -> None:
        for path in omit:
            if not path or not all(key.replace("_", "").isalnum() for key in path):
                raise ValueError(f"Not a JSON key path: {path!r}")
        self.omit = [tuple(path) for path in omit]
        super().__init__(expression)

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list]:
        sql, params = compiler.compile(self.source_expressions[0])
        for path in self.omit:
            sql = f"({sql} #- '{{{','.join(path)}}}')"
        return sql, params

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list]:
        sql, params = compiler.compile(self.source_expressions[0])
        paths = ", ".join(f"'$.{'.'.join(path)}'" for path in self.omit)
        return f"json_remove({sql}, {paths})", params
