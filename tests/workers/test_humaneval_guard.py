"""HumanEval's hidden tests call the answer through a guard: a function that returns an object
of its own making (equal to anything) fails, every canonical solution still passes."""

from __future__ import annotations

import re

import pytest

from coevo.suites.humaneval import humaneval_problems
from workers.environments import humaneval

pytestmark = pytest.mark.django_db

EQUALS_ANYTHING = """\
    class Yes:
        def __eq__(self, other):
            return True
        def __ne__(self, other):
            return False
        def __bool__(self):
            return True
    return Yes()
"""
INT_SUBCLASS = """\
    class Anything(int):
        def __eq__(self, other):
            return True
        __hash__ = int.__hash__
    return Anything(0)
"""
INSIDE_A_LIST = """\
    class Yes:
        def __eq__(self, other):
            return True
    return [Yes()]
"""
# Module-level code that rebinds the names a naive guard would use, then the same hack.
REBINDS_BUILTINS = """\
    class Yes:
        def __eq__(self, other):
            return True
    return Yes()

import builtins
builtins.type = lambda value: bool
builtins.isinstance = lambda value, kinds: True
set = lambda *args: {0}
id = lambda value: 0
"""


@pytest.fixture(scope="module")
def problems():
    return {p.task_id: p for p in humaneval_problems()[0]}


def verify(problem, answer: str):
    return humaneval.verify(
        inputs={"prompt": problem.prompt, "entry_point": problem.entry_point},
        verifier={"test": problem.test, "entry_point": problem.entry_point},
        answer=answer,
    )


@pytest.mark.parametrize(
    "answer",
    [EQUALS_ANYTHING, INT_SUBCLASS, REBINDS_BUILTINS],
    ids=["__eq__ always true", "int subclass", "rebinds builtins"],
)
def test_an_object_equal_to_anything_does_not_pass(problems, answer):
    # has_close_elements: the tests assert both `== True` and `== False`.
    verdict = verify(problems["HumanEval/0"], answer)

    assert verdict.passed is False and verdict.score == 0.0
    assert "object where the tests expect plain values" in verdict.detail, verdict.detail


def test_an_object_inside_a_list_does_not_pass(problems):
    # sort_third returns a list: [Yes()] == [..] would hold element by element.
    problem = problems["HumanEval/33"]
    verdict = verify(problem, INSIDE_A_LIST)

    assert verdict.passed is False
    assert "returned a Yes object" in verdict.detail, verdict.detail


def test_every_canonical_solution_still_passes(problems):
    failed = [
        (task_id, verdict.detail)
        for task_id, problem in problems.items()
        if not (verdict := verify(problem, problem.canonical_solution)).passed
    ]
    assert not failed, failed


def test_a_pass_shows_a_readable_line_instead_of_the_end_marker(problems):
    problem = problems["HumanEval/0"]
    answer = problem.canonical_solution + '\nprint("from the answer")\n'
    verdict = verify(problem, answer)

    assert verdict.passed is True
    assert verdict.output.splitlines() == ["from the answer", humaneval.PASSED_LINE]
    assert not re.search(r"\b[0-9a-f]{32}\b", verdict.output), verdict.output
