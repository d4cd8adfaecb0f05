"""The JSONL suite format: parsing, and every kind of error naming its line and field."""

from __future__ import annotations

import json

import pytest

from coevo.suites import jsonl
from coevo.suites.jsonl import (
    ScorerSpec,
    SuiteImportError,
    jsonl_content_hash,
    jsonl_tasks_parse,
    scorer_spec_build,
)
from coevo.suites.models import Split

EXACT = ScorerSpec(kind="exact")
VERIFIER = b"def score(answer, expected, metadata):\n    return answer == expected\n"


def lines(*rows) -> bytes:
    return "\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows).encode() + b"\n"


def errors_of(data: bytes, scorer: ScorerSpec = EXACT) -> list[str]:
    with pytest.raises(SuiteImportError) as caught:
        jsonl_tasks_parse(data=data, scorer=scorer)
    return caught.value.errors


# --- valid files ---------------------------------------------------------------------------


def test_it_parses_tasks_with_optional_metadata_and_split():
    data = lines(
        {"id": "q1", "input": "2+2?", "expected": "4"},
        "",
        {
            "id": "q2",
            "input": {"a": 1},
            "expected": 7,
            "metadata": {"topic": "x"},
            "split": "heldout",
        },
    )

    tasks = jsonl_tasks_parse(data=data, scorer=EXACT)

    assert [(t.line, t.key, t.input, t.expected) for t in tasks] == [
        (1, "q1", "2+2?", "4"),
        (3, "q2", {"a": 1}, 7),
    ]
    assert tasks[0].metadata == {} and tasks[0].split is None
    assert tasks[1].metadata == {"topic": "x"} and tasks[1].split == Split.HELDOUT


def test_it_accepts_a_utf8_byte_order_mark_and_a_missing_final_newline():
    data = b"\xef\xbb\xbf" + json.dumps({"id": "é", "input": "ü", "expected": "ß"}).encode()

    (task,) = jsonl_tasks_parse(data=data, scorer=EXACT)

    assert task.key == "é"


# --- errors name the line and the field ----------------------------------------------------


def test_it_names_the_line_of_a_missing_field():
    data = lines({"id": "a", "input": "x", "expected": "y"}, {"input": "x", "expected": "y"})

    assert errors_of(data) == ["line 2: field 'id' is missing"]


def test_it_refuses_a_duplicate_id_naming_where_it_was_first_seen():
    data = lines(
        {"id": "q7", "input": "x", "expected": "y"},
        {"id": "q8", "input": "x", "expected": "y"},
        {"id": "q7", "input": "z", "expected": "w"},
    )

    assert errors_of(data) == ["line 3: duplicate id 'q7' (first seen on line 1)"]


def test_it_reports_every_error_in_the_file_at_once():
    data = lines(
        "{not json",
        [1, 2],
        {"id": 5, "input": "x", "expected": "y"},
        {"id": "b", "input": 3, "expected": "y"},
        {"id": "c", "input": "x", "expected": "y", "metadata": "m"},
        {"id": "d", "input": "x", "expected": "y", "split": "train"},
        {"id": "e", "input": "x", "expected": "y", "expect": "typo"},
        {"id": "f", "input": "x"},
    )

    errors = errors_of(data)

    assert errors[0].startswith("line 1: invalid JSON at column 2")
    assert errors[1:] == [
        "line 2: expected a JSON object, got an array",
        "line 3: field 'id' must be a string, got a number",
        "line 4: field 'input' must be a string or an object, got a number",
        "line 5: field 'metadata' must be an object, got a string",
        "line 6: field 'split' must be one of search, validation, heldout; got \"train\"",
        "line 7: unknown field 'expect' (allowed: id, input, expected, metadata, split)",
        "line 8: field 'expected' is missing",
    ]


def test_it_refuses_an_empty_file():
    assert errors_of(b"") == ["the file has no tasks: it is empty or only blank lines"]
    assert errors_of(b"\n  \n") == ["the file has no tasks: it is empty or only blank lines"]


def test_it_refuses_text_that_is_not_utf8_naming_the_line():
    data = lines({"id": "a", "input": "x", "expected": "y"}) + b'{"id": "b\xff"}\n'

    (error,) = errors_of(data)

    assert error.startswith("line 2: not UTF-8 text")


def test_it_refuses_a_line_over_the_size_limit(monkeypatch):
    monkeypatch.setattr(jsonl, "MAX_LINE_BYTES", 100)
    data = lines({"id": "a", "input": "x" * 200, "expected": "y"})

    assert errors_of(data) == ["line 1: 241 bytes, over the 100 bytes limit"]


def test_it_refuses_a_file_over_the_size_limit(monkeypatch):
    monkeypatch.setattr(jsonl, "MAX_FILE_BYTES", 1024**2)
    data = lines(*({"id": str(i), "input": "x" * 100, "expected": "y"} for i in range(10_000)))

    (error,) = errors_of(data)

    assert "over the 1 MiB limit" in error


def test_it_counts_errors_beyond_those_it_keeps(monkeypatch):
    monkeypatch.setattr(jsonl, "MAX_ERRORS", 3)
    data = lines(*({"input": "x", "expected": "y"} for _ in range(10)))

    with pytest.raises(SuiteImportError) as caught:
        jsonl_tasks_parse(data=data, scorer=EXACT)

    assert len(caught.value.errors) == 3
    assert caught.value.total == 10


def test_it_checks_expected_values_against_the_scorer():
    numeric = ScorerSpec(kind="numeric")
    regex = ScorerSpec(kind="regex")

    assert errors_of(lines({"id": "a", "input": "x", "expected": "four"}), numeric) == [
        "line 1: field 'expected' must be a number for the numeric scorer, got \"four\""
    ]
    (error,) = errors_of(lines({"id": "a", "input": "x", "expected": "(unclosed"}), regex)
    assert error.startswith("line 1: field 'expected' is not a valid regular expression")
    # A numeric string is a number.
    assert jsonl_tasks_parse(
        data=lines({"id": "a", "input": "x", "expected": "1,024.5"}), scorer=numeric
    )


# --- the scorer spec -----------------------------------------------------------------------


def test_it_builds_a_numeric_scorer_with_tolerances():
    spec = scorer_spec_build(kind="numeric", abs_tol=1e-6, rel_tol=0.01)

    assert spec.public() == {"kind": "numeric", "abs_tol": 1e-6, "rel_tol": 0.01}


def test_it_refuses_an_unknown_scorer_and_misplaced_options():
    with pytest.raises(SuiteImportError, match="unknown scorer 'fuzzy'"):
        scorer_spec_build(kind="fuzzy")
    with pytest.raises(SuiteImportError, match="tolerance only applies to the numeric scorer"):
        scorer_spec_build(kind="exact", abs_tol=0.1)
    with pytest.raises(SuiteImportError, match="must be a finite number ≥ 0"):
        scorer_spec_build(kind="numeric", abs_tol=-1)


def test_it_requires_a_verifier_module_defining_score_for_the_python_scorer():
    with pytest.raises(SuiteImportError, match="needs a verifier module"):
        scorer_spec_build(kind="python")
    with pytest.raises(SuiteImportError, match=r"verifier v\.py: line 1: syntax error"):
        scorer_spec_build(kind="python", verifier_name="v.py", verifier_source=b"def (:\n")
    with pytest.raises(SuiteImportError, match=r"must define score\(answer, expected, metadata\)"):
        scorer_spec_build(kind="python", verifier_source=b"def grade(a, b, c):\n    return 1\n")


def test_it_keeps_the_verifier_source_out_of_the_public_spec():
    spec = scorer_spec_build(kind="python", verifier_name="v.py", verifier_source=VERIFIER)

    assert "source" not in spec.public()
    assert spec.public()["verifier"] == "v.py"
    assert spec.for_worker()["source"] == VERIFIER.decode()


def test_it_hashes_content_not_formatting():
    a = jsonl_tasks_parse(data=b'{"id": "a", "input": "x", "expected": "y"}\n', scorer=EXACT)
    b = jsonl_tasks_parse(data=b'{"expected":"y","input":"x","id":"a"}', scorer=EXACT)
    c = jsonl_tasks_parse(data=b'{"id": "a", "input": "x", "expected": "z"}', scorer=EXACT)

    assert jsonl_content_hash(tasks=a, scorer=EXACT) == jsonl_content_hash(tasks=b, scorer=EXACT)
    assert jsonl_content_hash(tasks=a, scorer=EXACT) != jsonl_content_hash(tasks=c, scorer=EXACT)
    normalized = ScorerSpec(kind="normalized")
    assert jsonl_content_hash(tasks=a, scorer=EXACT) != jsonl_content_hash(
        tasks=a, scorer=normalized
    )
