"""The regex scorer: RE2 on the worker (bounded time, other threads keep running) and the same
engine at the suite import, which refuses what RE2 would not run."""

from __future__ import annotations

import random
import threading
import time

import pytest

from coevo.errors import InvalidInput
from coevo.evaluations.models import Evaluation
from coevo.evaluations.services import evaluation_create
from coevo.suites.jsonl import ScorerSpec, SuiteImportError, jsonl_tasks_parse, scorer_spec_build
from coevo.suites.models import Split, Task
from coevo.suites.services import suite_import_jsonl
from tests.suites.test_jsonl import lines
from workers.environments.jsonl import verify
from workers.environments.regexes import MAX_REGEX_PROGRAM_SIZE, MAX_REGEX_WORK, regex_compile

REGEX = ScorerSpec(kind="regex")
# The pattern: Python's re backtracks through 2^n ways to split n digits; 26 digits
# and an "x" took 3.4 s there, with every other thread of the worker frozen as long.
BACKTRACKING = r"(\d+\s?)+"


def score(answer, pattern):
    return verify(
        inputs={"input": "q", "metadata": {}},
        verifier={"scorer": {"kind": "regex"}, "expected": pattern},
        answer=answer,
    )


class Ticker:
    """A thread that notes the time every 5 ms: its longest gap is how long it was stalled."""

    def __init__(self) -> None:
        self.ticks: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.ticks.append(time.monotonic())
            time.sleep(0.005)

    def __enter__(self) -> Ticker:
        self._thread.start()
        while not self.ticks:
            time.sleep(0.001)
        return self

    def __exit__(self, *exc) -> None:
        self.ticks.append(time.monotonic())
        self._stop.set()
        self._thread.join()

    @property
    def longest_gap(self) -> float:
        return max(b - a for a, b in zip(self.ticks, self.ticks[1:], strict=False))


def test_it_scores_a_backtracking_pattern_quickly_without_stalling_other_threads():
    with Ticker() as ticker:
        started = time.monotonic()
        verdict = score("1" * 26 + "x", BACKTRACKING)
        elapsed = time.monotonic() - started
    assert not verdict.passed
    assert elapsed < 0.5
    assert ticker.longest_gap < 0.25

    # Each extra digit doubled the time with a backtracking engine; here it is linear.
    started = time.monotonic()
    assert not score("1" * 90_000 + "x", BACKTRACKING).passed
    assert time.monotonic() - started < 1.0
    assert score("12 34 56", BACKTRACKING).passed


def test_it_lets_other_threads_run_while_a_long_match_runs():
    # Linear but slow on purpose: ~1,000 RE2 instructions alive at each of 90,000 bytes
    # (about half a second). RE2 releases the interpreter lock while it matches.
    rng = random.Random(7)
    answer = "".join(rng.choice("ab") for _ in range(90_000))
    with Ticker() as ticker:
        started = time.monotonic()
        verdict = score(answer, r"[ab]*a[ab]{999}")
        elapsed = time.monotonic() - started

    assert verdict.passed is (answer[-1000] == "a")
    assert elapsed > 0.1, "the match should take long enough to show the ticker running"
    # An engine holding the interpreter lock would leave one gap as long as the whole match.
    assert ticker.longest_gap < elapsed / 3


@pytest.mark.parametrize(
    ("answer", "pattern", "passed"),
    [
        ("Answer: 42", r"Answer: \d+", True),
        ("Answer: 42 and more", r"Answer: \d+", False),
        ("YES", r"(?i)yes|no", True),
        ("2026-12-01", r"\d{4}-\d{2}-\d{2}", True),
        ("  3.14\n", r"[-+]?\d+(\.\d+)?", True),  # surrounding whitespace is trimmed
        ("héllo wörld", r"[\p{L} ]+", True),
        ("naïve", r"na.ve", True),  # "." is one character, not one byte
        ("line one\nline two", r"(?s)line one.line two", True),
        ("line one\nline two", r"line one.line two", False),
        ({"a": 1}, r'\{"a": 1\}', True),  # a JSON answer is matched in its canonical text
        ("a\ud800", r"a\?", True),  # a lone surrogate is not Unicode: read as "?", no crash
    ],
)
def test_it_scores_ordinary_patterns_by_a_full_match(answer, pattern, passed):
    assert regex_compile(pattern)
    assert score(answer, pattern).passed is passed


def test_it_fails_an_answer_too_long_for_its_pattern():
    pattern = "(?:" + "|".join(f"[ab]*a[ab]{{{999 - i}}}" for i in range(5)) + ")"
    size = regex_compile(pattern).programsize
    allowed = MAX_REGEX_WORK // size

    verdict = score("a" * (allowed + 1), pattern)

    assert (verdict.passed, verdict.score) == (False, 0.0)
    assert verdict.detail == (
        f"the answer is {allowed + 1} bytes; this pattern can be matched against at most "
        f"{allowed} (a larger pattern leaves room for a shorter answer)"
    )
    assert score("a" * 100_001, r"a*").detail == "the answer is over 100000 characters"


def test_it_fails_a_pattern_re2_refuses_without_showing_the_pattern():
    # Only a suite imported before RE2 can still hold one; the detail is visible to
    # proposers, the expected value is not.
    verdict = score("secret", r"(?=secret-marker)secret")

    assert not verdict.passed
    assert "secret-marker" not in verdict.detail
    assert verdict.detail.startswith("the suite's pattern is not one the RE2 engine runs")


# --- at the suite import --------------------------------------------------------------------


def import_errors(pattern: str) -> list[str]:
    with pytest.raises(SuiteImportError) as caught:
        jsonl_tasks_parse(data=lines({"id": "a", "input": "x", "expected": pattern}), scorer=REGEX)
    return caught.value.errors


@pytest.mark.parametrize(
    ("pattern", "says"),
    [
        (r"foo(?=bar)", "invalid perl operator: (?="),
        (r"(?<!x)y", "invalid perl operator: (?<"),
        (r"(a)\1", "invalid escape sequence: \\1"),
        (r"a++", "bad repetition operator: ++"),
        (r"end\Z", "invalid escape sequence: \\Z"),
    ],
)
def test_it_refuses_at_import_a_pattern_re2_cannot_run(pattern, says):
    (error,) = import_errors(pattern)

    assert error.startswith(
        "line 1: field 'expected' is not a valid regular expression: it is not a pattern RE2 "
        f"accepts ({says}"
    )
    assert "RE2 syntax (linear time): no lookahead/lookbehind, backreferences" in error


def test_it_refuses_an_empty_minimum_repeat_that_re2_would_read_as_text():
    (error,) = import_errors(r"\d{,3}")

    assert error == (
        "line 1: field 'expected' is not a valid regular expression: it uses {,3}, which RE2 "
        "reads as literal text: write {0,3}"
    )
    # Escaped or inside a class it is literal text for both engines: accepted.
    for literal in (r"\{,3}", r"[{,3}]", r"[]{,3}]"):
        assert jsonl_tasks_parse(
            data=lines({"id": "a", "input": "x", "expected": literal}), scorer=REGEX
        )


def test_it_refuses_a_pattern_that_compiles_too_large():
    pattern = r"\p{L}{50}"  # fifty letters of any script: ~60,000 instructions

    (error,) = import_errors(pattern)

    assert f"RE2 instructions, over the limit of {MAX_REGEX_PROGRAM_SIZE}: simplify it" in error


def test_it_accepts_the_patterns_it_scores():
    data = lines(
        {"id": "a", "input": "x", "expected": r"Answer: \d+"},
        {"id": "b", "input": "x", "expected": r"(?i)[\p{L} ]+"},
        {"id": "c", "input": "x", "expected": BACKTRACKING},
    )

    assert len(jsonl_tasks_parse(data=data, scorer=REGEX)) == 3


@pytest.mark.django_db
def test_it_refuses_to_evaluate_a_suite_imported_with_patterns_re2_refuses(
    project, seed_candidate, policy_version
):
    """A suite imported before RE2 may hold lookaround: every such task would fail, so the
    evaluation is refused up front, with what to do, instead of scoring them all 0."""
    data = "\n".join(
        f'{{"id": "t{i}", "input": "q", "expected": "a+", "split": "search"}}' for i in range(3)
    ).encode()
    suite, _ = suite_import_jsonl(
        project=project, name="rx", data=data, scorer=scorer_spec_build(kind="regex")
    )
    evaluation_create(
        candidate=seed_candidate, suite=suite, split=Split.SEARCH, policy_version=policy_version
    )
    # As an import before RE2 stored it.
    Task.objects.filter(suite=suite, key="t1").update(
        verifier={"scorer": {"kind": "regex"}, "expected": "(?=a)a+"}
    )
    before = Evaluation.objects.count()

    with pytest.raises(InvalidInput, match="1 of its search tasks .* Import the suite again"):
        evaluation_create(
            candidate=seed_candidate,
            suite=suite,
            split=Split.SEARCH,
            policy_version=policy_version,
        )
    assert Evaluation.objects.count() == before
