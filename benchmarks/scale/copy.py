"""Rows written with PostgreSQL's COPY (psycopg 3's ``copy.write_row``), for any model.

A table's columns are its model's concrete fields: the ones a caller names come from each row,
every other one takes its field's default (computed once), so a new field with a default never
breaks the fill and one without a default stops it at once with its name. The serial primary
keys (trace steps, tasks) are left to PostgreSQL.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any, TextIO

from django.db import connection, models


class TableCopy:
    def __init__(self, model: type[models.Model], fields: Sequence[str]) -> None:
        self.model = model
        named = {model._meta.get_field(name).column: name for name in fields}
        self.columns = [model._meta.get_field(name).column for name in fields]
        self.constants: list[Any] = []
        for field in model._meta.concrete_fields:
            if field.column in named or isinstance(field, models.AutoField):
                continue
            if field.primary_key:
                raise ValueError(f"{model.__name__}.{field.name}: name the primary key.")
            default = field.get_default()
            if default is None and not field.null:
                raise ValueError(f"{model.__name__}.{field.name} has no default: name it.")
            if isinstance(field, models.JSONField):
                default = json.dumps(default)
            self.columns.append(field.column)
            self.constants.append(default)
        names = ", ".join(f'"{column}"' for column in self.columns)
        self.sql = f'COPY "{model._meta.db_table}" ({names}) FROM STDIN'

    def write(self, rows: Iterable[Sequence[Any]]) -> int:
        """Write ``rows`` (each the named fields' values, in order; JSON as text) and return
        how many; inside the caller's transaction."""
        count = 0
        constants = tuple(self.constants)
        with connection.cursor() as cursor, cursor.cursor.copy(self.sql) as copy:
            for row in rows:
                copy.write_row((*row, *constants))
                count += 1
        return count


class Progress:
    """A line per chunk: what was written, at what rate, and when the phase should end."""

    def __init__(self, *, what: str, total: int, out: TextIO | None = None) -> None:
        self.what = what
        self.total = max(total, 1)
        self.done = 0
        self.out = out or sys.stdout
        self.started = time.monotonic()

    def advance(self, count: int, *, extra: str = "") -> None:
        self.done += count
        elapsed = max(time.monotonic() - self.started, 1e-6)
        rate = self.done / elapsed
        left = max(self.total - self.done, 0) / rate if rate else 0.0
        self.out.write(
            f"{self.what}: {self.done:,}/{self.total:,} ({100 * self.done / self.total:.0f}%), "
            f"{rate:,.0f}/s, {elapsed:.0f} s, ETA {left:.0f} s{extra}\n"
        )
        self.out.flush()
