"""What the database can hold of a value a harness controls: its answer, the details and test
output that quote it, the steps of its trace.

PostgreSQL refuses some values a harness can easily produce, and one refused value fails the
whole write: the rollout's finish (or a trace batch) raises, the task dies, the watchdog runs it
again and the rollout ends as an ``infra_error``, which is never scored. A harness that did this
on purpose would turn the tasks it fails into tasks that do not count, and its mean would go up.
So every harness-controlled value passes through here on its way to a text or jsonb column:

- NUL (U+0000): neither text nor jsonb can hold it. Replaced by U+FFFD.
- A lone surrogate (U+D800 to U+DFFF; JSON's ``"\\ud800"`` parses to one): UTF-8 cannot encode
  it, so psycopg cannot send it. Replaced by U+FFFD.
- NaN and ±Infinity (Python's json reads and writes them; JSON and jsonb do not): replaced by
  the strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"``, Python's json spelling of them.

Characters and numbers are *replaced*, not refused: the stored value is a record for people,
the verifier already scored the original, and a harness that printed a NUL broke no rule.
Dictionary keys are treated like strings (two keys that become equal keep the later value).
Values of other types are stored as ``str(value)``, as the trace writer always did.

Structure is *refused*: a value nested deeper than ``MAX_DEPTH`` raises ``Unstorable``. Deep
enough nesting makes ``json.dumps`` (and the walk below) raise ``RecursionError`` in the middle
of a write, and no honest answer is nested a hundred levels deep. ``rollout_finish`` ends a
rollout whose answer is refused as a ``harness_error``; the trace writer stores a note in place
of a step it cannot store.
"""

from __future__ import annotations

import math
import re
from typing import Any

REPLACEMENT = "\ufffd"
MAX_DEPTH = 100

_UNSTORABLE_CHARACTERS = re.compile("[\x00\ud800-\udfff]")


class Unstorable(ValueError):
    """A value the database cannot hold, even with its characters replaced."""


def storable_text(text: str) -> str:
    """``text`` with every NUL and lone surrogate replaced by U+FFFD."""
    return _UNSTORABLE_CHARACTERS.sub(REPLACEMENT, text)


def storable_json(value: Any, *, max_depth: int = MAX_DEPTH) -> Any:
    """A copy of ``value`` that PostgreSQL's jsonb accepts (the module docstring says what is
    replaced); raises ``Unstorable`` when it is nested more than ``max_depth`` levels deep."""
    return _storable(value, max_depth, max_depth)


def _storable(value: Any, depth_left: int, max_depth: int) -> Any:
    if isinstance(value, str):
        return storable_text(value)
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else _non_finite_name(value)
    if isinstance(value, dict | list | tuple):
        if depth_left <= 0:
            raise Unstorable(f"it is nested more than {max_depth} levels deep")
        if isinstance(value, dict):
            return {
                _storable_key(key): _storable(item, depth_left - 1, max_depth)
                for key, item in value.items()
            }
        return [_storable(item, depth_left - 1, max_depth) for item in value]
    return storable_text(str(value))


def _storable_key(key: Any) -> Any:
    if isinstance(key, str):
        return storable_text(key)
    if isinstance(key, float) and not math.isfinite(key):
        return _non_finite_name(key)
    # json writes these keys as strings itself; any other type would make it raise.
    if key is None or isinstance(key, bool | int | float):
        return key
    return storable_text(str(key))


def _non_finite_name(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"
