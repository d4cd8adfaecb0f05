"""Scorers of custom (JSONL) suites: answer × expected → Verdict.

``exact``, ``normalized``, ``numeric`` and ``regex`` are pure functions on the worker (``regex``
matches with RE2, linear time and bounded: workers/environments/regexes.py). ``python``
runs the suite's own verifier module — untrusted code from whoever imported the suite — in a
sandbox of its own with a timeout, fed JSON on stdin; whatever it does (crash, hang, print,
return nonsense) ends as a failed task with the reason, never as a worker crash.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from typing import Any

from django.conf import settings

from workers import sandbox
from workers.environments.base import Verdict
from workers.environments.regexes import RegexAnswerTooLong, RegexRefused, regex_fullmatch

MAX_VERIFIER_OUTPUT = 16 * 1024
RESULT_MARKER = "__coevo_score__ "
_NUMBER = re.compile(r"[-+]?(?:\d[\d,]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")

# Runs the verifier module as ``verifier`` and prints one marked JSON line with the result.
# The verifier's own prints go to stderr, so they cannot forge the result line.
_DRIVER = f"""
import json, math, sys, types
payload = json.loads(sys.stdin.read())
real_stdout, sys.stdout = sys.stdout, sys.stderr
module = types.ModuleType("verifier")
module.__file__ = payload["name"]
exec(compile(payload["source"], payload["name"], "exec"), module.__dict__)
value = module.score(payload["answer"], payload["expected"], payload["metadata"])
if isinstance(value, bool):
    result = {{"score": 1.0 if value else 0.0}}
elif isinstance(value, (int, float)):
    result = {{"score": float(value)}}
else:
    result = {{"error": "score() returned " + type(value).__name__ + ", not a number or bool"}}
real_stdout.write("\\n{RESULT_MARKER}" + json.dumps(result) + "\\n")
"""


def as_text(value: Any) -> str:
    """Strings as they are; other JSON values in a canonical JSON form."""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def normalize(text: str) -> str:
    """Case-, whitespace- and punctuation-insensitive form of a text."""
    kept = (
        " " if unicodedata.category(ch).startswith("P") else ch
        for ch in unicodedata.normalize("NFKC", text).casefold()
    )
    return " ".join("".join(kept).split())


def number_in(value: Any) -> float | None:
    """The answer as a number: a JSON number, a numeric string, or the last number in a text."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) else None
    if not isinstance(value, str):
        return None
    matches = _NUMBER.findall(value.strip())
    if not matches:
        return None
    try:
        number = float(matches[-1].replace(",", ""))
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def score_exact(answer: Any, expected: Any) -> Verdict:
    got, want = as_text(answer).strip(), as_text(expected).strip()
    if got == want:
        return Verdict(True, 1.0, "the answer equals the expected value")
    return Verdict(False, 0.0, f"the answer {_preview(got)} is not the expected value")


def score_normalized(answer: Any, expected: Any) -> Verdict:
    got, want = normalize(as_text(answer)), normalize(as_text(expected))
    if got == want:
        return Verdict(True, 1.0, "the answer matches the expected value (normalized)")
    return Verdict(False, 0.0, f"the normalized answer {_preview(got)} does not match")


def score_numeric(answer: Any, expected: Any, *, abs_tol: float, rel_tol: float) -> Verdict:
    got, want = number_in(answer), number_in(expected)
    if got is None:
        return Verdict(False, 0.0, f"no number in the answer {_preview(as_text(answer))}")
    if want is None:
        return Verdict(False, 0.0, "the expected value is not a number")
    if math.isclose(got, want, rel_tol=rel_tol, abs_tol=abs_tol):
        return Verdict(True, 1.0, f"{got!r} is within tolerance of the expected value")
    return Verdict(False, 0.0, f"{got!r} is not within tolerance of the expected value")


def score_regex(answer: Any, pattern: str) -> Verdict:
    """A full match of the answer by RE2. An answer beyond the bounds fails the task (the answer
    is what is wrong, so it counts like a wrong answer); so does a pattern RE2 refuses, which
    only a suite imported before RE2 can hold (the import checks every pattern)."""
    if not isinstance(pattern, str):
        return Verdict(False, 0.0, "the suite's expected pattern is not a string")
    text = as_text(answer).strip()
    try:
        matched = regex_fullmatch(pattern, text)
    except RegexAnswerTooLong as exc:
        return Verdict(False, 0.0, str(exc))
    except RegexRefused:
        # Not the reason: RE2's message quotes the pattern, and the expected value stays
        # worker-side. The import, shown to the suite's author, names the line and the reason.
        return Verdict(
            False,
            0.0,
            "the suite's pattern is not one the RE2 engine runs; import the suite again: "
            "the import names each line whose pattern must change and why",
        )
    if matched:
        return Verdict(True, 1.0, "the answer matches the expected pattern")
    return Verdict(False, 0.0, f"the answer {_preview(text)} does not match the expected pattern")


def score_python(
    answer: Any, expected: Any, metadata: dict[str, Any], *, source: str, name: str
) -> Verdict:
    """Run the suite's verifier module in the sandbox; its ``score`` decides (bool or [0, 1])."""
    timeout_s = settings.COEVO_VERIFIER_TIMEOUT_S
    payload = {
        "source": source,
        "name": name,
        "answer": answer,
        "expected": expected,
        "metadata": metadata,
    }
    result = sandbox.run(
        [sandbox.python_executable(), "-s", "-c", _DRIVER],
        stdin=json.dumps(payload).encode(),
        timeout_s=timeout_s,
        # CPU time above the wall timeout, so a busy loop ends as "timed out", not as a signal.
        limits=sandbox.SandboxLimits(cpu_s=math.ceil(timeout_s) + 2, memory_bytes=2 * 1024**3),
        max_output_bytes=MAX_VERIFIER_OUTPUT,
    )
    stdout = result.stdout.decode(errors="replace")
    stderr = result.stderr.decode(errors="replace")
    if result.timed_out:
        return Verdict(False, 0.0, f"the verifier {name} timed out after {timeout_s}s", stderr)
    _, found, tail = stdout.rpartition(RESULT_MARKER)
    if result.returncode != 0 or not found:
        last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
        reason = last or f"exit code {result.returncode}"
        return Verdict(False, 0.0, f"the verifier {name} failed: {reason[:300]}", stderr)
    try:
        outcome = json.loads(tail.splitlines()[0])
    except (ValueError, IndexError):
        return Verdict(False, 0.0, f"the verifier {name} gave an unreadable result", stderr)
    if "error" in outcome:
        return Verdict(False, 0.0, f"the verifier {name} failed: {outcome['error']}", stderr)
    score = outcome.get("score")
    if not isinstance(score, int | float) or not math.isfinite(score) or not 0 <= score <= 1:
        return Verdict(
            False, 0.0, f"the verifier {name} returned {score!r}, outside [0, 1]", stderr
        )
    passed = score >= 1.0
    return Verdict(passed, float(score), f"the verifier {name} scored {score:g}", stderr)


def _preview(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")
