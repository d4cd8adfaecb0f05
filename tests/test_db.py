"""coevo.db.JSONWithout: the same paths removed by PostgreSQL and by SQLite (the embedded
stack), and no key that could break out of the SQL."""

from __future__ import annotations

import json
import sqlite3

import pytest
from django.db import connection
from django.db.models import F

from coevo.db import JSONWithout

DOCUMENT = {
    "keep": 1,
    "drop": [1, 2, 3],
    "nested": {"keep": "x", "drop_me": {"deep": True}},
    "absent_parent": None,
}
OMIT = [("drop",), ("nested", "drop_me"), ("missing",), ("absent_parent", "child")]
EXPECTED = {"keep": 1, "nested": {"keep": "x"}, "absent_parent": None}


class ColumnCompiler:
    """Compiles the expression's one source, the column ``doc``."""

    def compile(self, node):
        return '"doc"', []


@pytest.mark.django_db
def test_postgresql_removes_the_paths():
    sql, params = JSONWithout(F("doc"), omit=OMIT).as_postgresql(ColumnCompiler(), connection)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {sql} FROM (SELECT %s::jsonb AS doc) AS t", [json.dumps(DOCUMENT)])
        (value,) = cursor.fetchone()
    assert (json.loads(value) if isinstance(value, str) else value) == EXPECTED


def test_sqlite_removes_the_same_paths():
    sql, params = JSONWithout(F("doc"), omit=OMIT).as_sqlite(ColumnCompiler(), None)
    with sqlite3.connect(":memory:") as db:
        (value,) = db.execute(
            f"SELECT {sql} FROM (SELECT ? AS doc)", [json.dumps(DOCUMENT)]
        ).fetchone()
    assert json.loads(value) == EXPECTED


@pytest.mark.parametrize("path", [(), ("a'b",), ("a", "b}"), ("a.b",), ("",)])
def test_it_refuses_a_path_that_is_not_plain_keys(path):
    with pytest.raises(ValueError, match="Not a JSON key path"):
        JSONWithout(F("doc"), omit=[path])
