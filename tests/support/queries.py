"""Query counting for pages and API lists (issue 21): a page's queries must not grow with the
project, only with the page. Tests read a page with few rows and again with many, and compare
the two with :func:`assert_same_queries`, which prints both runs' SQL grouped by shape when they
differ, so a reader sees the N+1 at once."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from typing import Any

from django.db import connection
from django.test.utils import CaptureQueriesContext

# Literals that differ between two runs of the same query: quoted strings, numbers, UUIDs.
_LITERALS = re.compile(
    r"'(?:[^']|'')*'|\b[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}\b|\b\d+(?:\.\d+)?\b"
)
_IN_LISTS = re.compile(r"IN \((?:\?, )*\?\)")
# A server-side cursor's name (a form's choices iterate one) numbers it within the process.
_CURSOR_NAMES = re.compile(r'"_django_curs_\w+"')


def sql_shape(sql: str) -> str:
    """``sql`` with its literals (and the length of its IN lists) replaced by ``?``."""
    return _IN_LISTS.sub("IN (…)", _LITERALS.sub("?", _CURSOR_NAMES.sub("cursor", sql)))


def queries_of(fetch: Callable[[], Any]) -> list[str]:
    """The SQL ``fetch()`` runs; it must answer 200 (a page that fails counts nothing)."""
    with CaptureQueriesContext(connection) as captured:
        response = fetch()
    status = getattr(response, "status_code", 200)
    assert status == 200, (status, getattr(response, "content", b"")[:1000])
    return [query["sql"] for query in captured.captured_queries]


def assert_same_queries(few: list[str], many: list[str], *, what: str = "the page") -> None:
    """As many queries with many rows as with few; on failure, the shapes whose count grew."""
    if len(few) == len(many):
        return
    before, after = Counter(map(sql_shape, few)), Counter(map(sql_shape, many))
    grew = [
        f"  {before[shape]} -> {after[shape]}: {shape[:600]}"
        for shape in after
        if after[shape] != before[shape]
    ]
    listing = "\n".join(f"  {i}. {sql[:400]}" for i, sql in enumerate(many, 1))
    raise AssertionError(
        f"{what} ran {len(few)} queries with few rows and {len(many)} with many.\n"
        "Queries whose count changed:\n" + "\n".join(grew) + "\nAll queries with many rows:\n"
        f"{listing}"
    )
