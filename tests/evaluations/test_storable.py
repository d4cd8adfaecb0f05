"""coevo.evaluations.storable: what is replaced, what is refused, and that PostgreSQL takes what
it returns (and refuses what it was given)."""

from __future__ import annotations

import json
import math

import pytest
from django.db import DataError, connection, transaction

from coevo.evaluations.storable import MAX_DEPTH, Unstorable, storable_json, storable_text

# json.loads('"\\ud800"') gives a str that UTF-8 cannot encode: a harness can send one.
LONE = json.loads('"\\ud800"')


def nested(depth: int, leaf: object = "x") -> object:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def test_it_replaces_nul_and_lone_surrogates_in_text():
    assert storable_text(f"a\x00b{LONE}c\udfffd") == "a\ufffdb\ufffdc\ufffdd"


def test_it_keeps_text_postgresql_accepts_as_it_is():
    text = 'tab\t \\x00 \\u0000 "quoted" \u00e9 \u2028 \U0001f600 \ufffd'
    assert storable_text(text) == text
    value = {"text": text, "n": [1, -2, 1.5, True, None], "empty": {}}
    assert storable_json(value) == value


def test_it_replaces_them_in_keys_and_at_any_depth():
    value = {f"k\x00{LONE}": [{"inner": ["x\x00", {LONE: 1}]}]}
    assert storable_json(value) == {"k\ufffd\ufffd": [{"inner": ["x\ufffd", {"\ufffd": 1}]}]}


def test_it_names_non_finite_numbers():
    value = [math.nan, math.inf, -math.inf, {"score": math.nan}, 0.5]
    assert storable_json(value) == ["NaN", "Infinity", "-Infinity", {"score": "NaN"}, 0.5]
    assert storable_json({math.nan: 1, 2.5: 2, 3: 3, None: 4}) == {
        "NaN": 1,
        2.5: 2,
        3: 3,
        None: 4,
    }


def test_it_stores_values_that_are_not_json_as_text():
    assert storable_json({"t": (1, "a\x00"), "b": b"\x00", ("k", 1): 1}) == {
        "t": [1, "a\ufffd"],
        "b": "b'\\x00'",
        "('k', 1)": 1,
    }


def test_it_refuses_a_value_nested_deeper_than_the_limit():
    assert storable_json(nested(MAX_DEPTH)) == nested(MAX_DEPTH)
    with pytest.raises(Unstorable, match=f"nested more than {MAX_DEPTH} levels deep"):
        storable_json(nested(MAX_DEPTH + 1))
    # Deep enough to make json.dumps raise RecursionError: refused all the same.
    with pytest.raises(Unstorable):
        storable_json(nested(50_000))
    cycle: list = []
    cycle.append(cycle)
    with pytest.raises(Unstorable):
        storable_json(cycle)
    with pytest.raises(Unstorable, match="more than 3 levels"):
        storable_json({"a": {"b": {"c": {"d": 1}}}}, max_depth=3)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "value",
    [
        "nul \x00 here",
        f"lone {LONE} surrogate",
        {"key \x00": ["deep \x00", {LONE: math.nan}]},
        [math.inf, -math.inf],
        nested(MAX_DEPTH, leaf="\x00"),
    ],
    ids=["nul", "surrogate", "keys", "infinities", "deep"],
)
def test_it_makes_what_postgresql_refuses_storable(value):
    def select(text: str) -> object:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT %s::jsonb, %s::text", [text, text])
            return json.loads(cursor.fetchone()[0])  # Django has psycopg return jsonb as text

    # What the harness sent is refused (so this test can fail)...
    with pytest.raises((DataError, ValueError)):
        select(json.dumps(value, ensure_ascii=False))
    # ... and what storable_json makes of it is taken, in a jsonb and in a text column.
    stored = storable_json(value)
    assert select(json.dumps(stored, ensure_ascii=False, allow_nan=False)) == stored
