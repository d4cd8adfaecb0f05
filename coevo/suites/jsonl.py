"""Custom suites from a JSONL file: parsing, validation and the scorer spec.

One JSON object per line: ``id`` (string, unique), ``input`` (string or object: what the harness
sees), ``expected`` (the reference, worker-side only), optional ``metadata`` (object, seen by
the harness and the scorer) and optional ``split`` (else the deterministic hash split).

Validation collects every error it can (each names the line and the field) so one upload shows
all that is wrong with a file, instead of one error per attempt.
"""

from __future__ import annotations

import ast
import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

from coevo.errors import InvalidInput
from coevo.suites.models import Split
from workers.environments.regexes import regex_problem

MAX_FILE_BYTES = 50 * 1024**2
MAX_LINE_BYTES = 1024**2
MAX_VERIFIER_BYTES = 256 * 1024
MAX_KEY_CHARS = 200  # Task.key's column width
# Errors kept per import: enough to see the pattern of a broken file, bounded for huge ones.
MAX_ERRORS = 1000

SCORERS = ("exact", "normalized", "numeric", "regex", "python")
FIELDS = ("id", "input", "expected", "metadata", "split")
SPLIT_NAMES = {
    "search": Split.SEARCH,
    "validation": Split.VALIDATION,
    "heldout": Split.HELDOUT,
    "held-out": Split.HELDOUT,
}


class SuiteImportError(InvalidInput):
    """A suite file or spec that cannot be imported; ``errors`` lists every problem found."""

    code = "suite_import_invalid"

    def __init__(self, errors: list[str], *, total: int | None = None) -> None:
        self.errors = errors
        self.total = total if total is not None else len(errors)
        more = f" (and {self.total - 1} more)" if self.total > 1 else ""
        super().__init__(f"{errors[0]}{more}" if errors else "the suite could not be imported")


@dataclass(frozen=True)
class ScorerSpec:
    """How answers are scored. ``verifier_source`` is the Python module of the ``python`` kind."""

    kind: str
    abs_tol: float = 0.0
    rel_tol: float = 0.0
    verifier_name: str = ""
    verifier_source: str = ""

    def public(self) -> dict[str, Any]:
        """What pages may show (parameters, the verifier's name and hash; never its source)."""
        data: dict[str, Any] = {"kind": self.kind}
        if self.kind == "numeric":
            data.update(abs_tol=self.abs_tol, rel_tol=self.rel_tol)
        if self.kind == "python":
            data.update(
                verifier=self.verifier_name,
                verifier_sha256=hashlib.sha256(self.verifier_source.encode()).hexdigest(),
            )
        return data

    def for_worker(self) -> dict[str, Any]:
        data = self.public()
        if self.kind == "python":
            data["source"] = self.verifier_source
        return data


@dataclass(frozen=True)
class JsonlTask:
    line: int
    key: str
    input: Any
    expected: Any
    metadata: dict[str, Any] = field(default_factory=dict)
    split: Split | None = None


def scorer_spec_build(
    *,
    kind: str,
    abs_tol: float | None = None,
    rel_tol: float | None = None,
    verifier_name: str = "",
    verifier_source: bytes | str | None = None,
) -> ScorerSpec:
    """Validate the declared scorer; raises SuiteImportError naming the wrong option."""
    errors: list[str] = []
    if kind not in SCORERS:
        raise SuiteImportError(
            [f"scorer: unknown scorer {kind!r}; choose one of {', '.join(SCORERS)}"]
        )
    for label, value in (("tolerance", abs_tol), ("relative tolerance", rel_tol)):
        if value is not None and (not math.isfinite(value) or value < 0):
            errors.append(f"scorer: the {label} must be a finite number ≥ 0, got {value}")
        if value is not None and kind != "numeric":
            errors.append(f"scorer: a {label} only applies to the numeric scorer, not {kind!r}")
    source = ""
    if kind == "python":
        source = _verifier_source(verifier_source, verifier_name, errors)
    elif verifier_source:
        errors.append(f"scorer: a verifier module only applies to the python scorer, not {kind!r}")
    if errors:
        raise SuiteImportError(errors)
    return ScorerSpec(
        kind=kind,
        abs_tol=float(abs_tol or 0.0),
        rel_tol=float(rel_tol or 0.0),
        verifier_name=(verifier_name or "verify.py") if kind == "python" else "",
        verifier_source=source,
    )


def _verifier_source(raw: bytes | str | None, name: str, errors: list[str]) -> str:
    label = f"verifier {name}" if name else "verifier"
    if not raw:
        errors.append(
            "scorer: the python scorer needs a verifier module "
            "(a .py file defining score(answer, expected, metadata))"
        )
        return ""
    data = raw.encode() if isinstance(raw, str) else raw
    if len(data) > MAX_VERIFIER_BYTES:
        errors.append(f"{label}: {len(data)} bytes is over the {_size(MAX_VERIFIER_BYTES)} limit")
        return ""
    try:
        source = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        errors.append(f"{label}: not UTF-8 text (byte {exc.start})")
        return ""
    # Parsed, never executed here: the module is untrusted and only runs in the worker sandbox.
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        errors.append(f"{label}: line {exc.lineno}: syntax error: {exc.msg}")
        return ""
    defines_score = any(
        isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "score"
        for node in tree.body
    )
    if not defines_score:
        errors.append(f"{label}: it must define score(answer, expected, metadata) at top level")
    return source


def jsonl_tasks_parse(*, data: bytes, scorer: ScorerSpec) -> list[JsonlTask]:
    """Parse and validate a suite file; raises SuiteImportError with every error found."""
    if len(data) > MAX_FILE_BYTES:
        raise SuiteImportError(
            [
                f"the file is {len(data) / 1024**2:.1f} MiB, over the {_size(MAX_FILE_BYTES)} "
                "limit; split it into several suites"
            ]
        )
    errors: list[str] = []
    total_errors = 0

    def error(message: str) -> None:
        nonlocal total_errors
        total_errors += 1
        if len(errors) < MAX_ERRORS:
            errors.append(message)

    tasks: list[JsonlTask] = []
    first_line_of: dict[str, int] = {}
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if len(raw) > MAX_LINE_BYTES:
            error(f"line {number}: {len(raw)} bytes, over the {_size(MAX_LINE_BYTES)} limit")
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            error(
                f"line {number}: not UTF-8 text (byte {exc.start + 1} of the line); "
                "save the file as UTF-8"
            )
            continue
        if not text.strip():
            continue
        task = _task_parse(number, text, scorer, error)
        if task is None:
            continue
        first = first_line_of.setdefault(task.key, number)
        if first != number:
            error(f"line {number}: duplicate id {task.key!r} (first seen on line {first})")
            continue
        tasks.append(task)
    if not tasks and not total_errors:
        error("the file has no tasks: it is empty or only blank lines")
    if total_errors:
        raise SuiteImportError(errors, total=total_errors)
    return tasks


def _task_parse(number: int, text: str, scorer: ScorerSpec, error: Any) -> JsonlTask | None:
    try:
        row = json.loads(text)
    except json.JSONDecodeError as exc:
        error(f"line {number}: invalid JSON at column {exc.colno}: {exc.msg}")
        return None
    if not isinstance(row, dict):
        error(f"line {number}: expected a JSON object, got {_json_type(row)}")
        return None
    ok = True
    for name in row:
        if name not in FIELDS:
            error(f"line {number}: unknown field {name!r} (allowed: {', '.join(FIELDS)})")
            ok = False
    for name in ("id", "input", "expected"):
        if name not in row:
            error(f"line {number}: field {name!r} is missing")
            ok = False
    key = row.get("id")
    if "id" in row:
        if not isinstance(key, str):
            error(f"line {number}: field 'id' must be a string, got {_json_type(key)}")
            ok = False
        elif not key.strip() or len(key) > MAX_KEY_CHARS:
            error(f"line {number}: field 'id' must be 1 to {MAX_KEY_CHARS} characters, not blank")
            ok = False
    if "input" in row and not isinstance(row["input"], str | dict):
        error(
            f"line {number}: field 'input' must be a string or an object, "
            f"got {_json_type(row['input'])}"
        )
        ok = False
    if "expected" in row:
        problem = _expected_problem(row["expected"], scorer)
        if problem:
            error(f"line {number}: field 'expected' {problem}")
            ok = False
    metadata = row.get("metadata", {})
    if not isinstance(metadata, dict):
        error(f"line {number}: field 'metadata' must be an object, got {_json_type(metadata)}")
        ok = False
    split = None
    if "split" in row:
        split = SPLIT_NAMES.get(row["split"]) if isinstance(row["split"], str) else None
        if split is None:
            error(
                f"line {number}: field 'split' must be one of search, validation, heldout; "
                f"got {json.dumps(row['split'])[:60]}"
            )
            ok = False
    if not ok:
        return None
    return JsonlTask(
        line=number,
        key=key,
        input=row["input"],
        expected=row["expected"],
        metadata=metadata,
        split=split,
    )


def _expected_problem(expected: Any, scorer: ScorerSpec) -> str | None:
    if scorer.kind == "numeric":
        if isinstance(expected, bool) or parse_number(expected) is None:
            return f"must be a number for the numeric scorer, got {json.dumps(expected)[:60]}"
    elif scorer.kind == "regex":
        if not isinstance(expected, str):
            return f"must be a regular expression string, got {_json_type(expected)}"
        problem = regex_problem(expected)
        if problem:
            return f"is not a valid regular expression: it {problem}"
    elif scorer.kind in ("exact", "normalized") and expected is None:
        return "must not be null"
    return None


def parse_number(value: Any) -> float | None:
    """A finite float from a JSON number or a numeric string (commas as thousands separators)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip().replace(",", ""))
        except ValueError:
            return None
    else:
        return None
    return number if math.isfinite(number) else None


def jsonl_content_hash(*, tasks: list[JsonlTask], scorer: ScorerSpec) -> str:
    """SHA-256 of the tasks and the scorer: same content → same suite, any change → new version.

    Over the parsed rows (not the bytes), so re-saving a file with other whitespace or key
    order is the same suite.
    """
    digest = hashlib.sha256()
    digest.update(json.dumps(scorer.for_worker(), sort_keys=True).encode())
    for task in tasks:
        row = [task.key, task.input, task.expected, task.metadata, task.split]
        digest.update(b"\n" + json.dumps(row, sort_keys=True, ensure_ascii=False).encode())
    return digest.hexdigest()


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _size(n: int) -> str:
    for unit, scale in (("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} bytes"
