"""What the gate page and the promotion evidence show of their statistics (issue 38): each
figure named for what it is and what it decides, an interval over too few tasks replaced by
words; and the campaign's Pareto-front table, which always lists the chosen best."""

from __future__ import annotations

import uuid
from types import SimpleNamespace

import pytest

from coevo.campaigns.models import ProposalState
from coevo.campaigns.selectors import ProposalPoint, pareto_front
from coevo.gates.models import Gate
from coevo.web.presenters import gate_statistics, pareto_table, score_interval


def stored_gate(*, policy: dict, tasks: int, kind: str = "binary") -> Gate:
    summary = {
        "method": "wilson",
        "mean": 1.0,
        "ci_low": 0.3,
        "ci_high": 1.0,
        "n_tasks": tasks,
        "confidence": 0.95,
    }
    return Gate(
        policy={"confidence": 0.95, **policy},
        statistics={
            "confidence": 0.95,
            "candidate": summary,
            "baseline": {**summary, "mean": 0.0, "ci_low": 0.0, "ci_high": 0.7},
            "comparison": {
                "n_tasks": tasks,
                "kind": kind,
                "delta": 1.0,
                "ci_low": 1.0,
                "ci_high": 1.0,
                "test": "exact McNemar",
                "p_value": 0.5,
                "significant": False,
                "flips": {"fixed": ["a", "b"], "broken": []},
            },
        },
    )


def test_the_gate_withholds_a_paired_interval_over_two_tasks_and_names_each_figure():
    stats = gate_statistics(gate=stored_gate(policy={"max_regression": 0.1}, tasks=2))

    assert stats.score_name == "pass rate"
    assert stats.delta.low is None and stats.delta.interval_note == (
        "too few tasks (n=2) for an interval"
    )
    assert stats.delta.role == "max_regression is judged on its interval"
    # The exact test is labelled for what it is: not this gate's verdict.
    assert stats.test_verdict == "no significant difference"
    assert stats.test_role == "the comparison page's verdict; no rule of this gate uses it"
    # Wilson intervals hold at any n: shown, named.
    assert stats.candidate.low == 0.3 and stats.candidate.interval_name == "95% Wilson interval"
    assert stats.candidate.role == "no rule of this gate uses it"


def test_the_gate_shows_the_interval_its_rule_used_from_ten_tasks_on():
    stats = gate_statistics(gate=stored_gate(policy={"min_score": 0.5}, tasks=10, kind="graded"))
    assert stats.score_name == "mean per-task score"
    assert (stats.delta.low, stats.delta.high, stats.delta.interval_note) == (1.0, 1.0, None)
    assert stats.delta.role == "no rule of this gate uses it"
    assert stats.candidate.role == "min_score is judged on it"


def test_a_gate_without_statistics_shows_none():
    assert gate_statistics(gate=Gate(policy={"min_score": 0.5}, statistics={})) is None


@pytest.mark.parametrize(
    ("score", "shown", "note", "name"),
    [
        ({"method": "wilson", "ci_low": 0.1, "n_tasks": 3}, True, None, "95% Wilson interval"),
        (
            {"method": "bootstrap", "ci_low": 0.1, "n_tasks": 3, "confidence": 0.9},
            False,
            "too few tasks (n=3) for an interval",
            "90% bootstrap interval over tasks",
        ),
        (
            {"method": "bootstrap", "ci_low": 0.1, "n_tasks": 12},
            True,
            None,
            "95% bootstrap interval over tasks",
        ),
        (None, False, None, None),
    ],
)
def test_an_evidence_score_names_its_interval_or_says_why_there_is_none(score, shown, note, name):
    assert score_interval(score) == {
        "interval_shown": shown,
        "interval_note": note,
        "interval_name": name,
    }


def point(sequence: int, validation: float, tokens: float | None) -> ProposalPoint:
    return ProposalPoint(
        id=uuid.uuid4(),
        sequence=sequence,
        kind="llm-patch",
        state=ProposalState.EVALUATED,
        search_score=validation,
        validation_score=validation,
        tokens_per_task=tokens,
        improved=False,
        parent_shas=[],
        candidate_id=uuid.uuid4(),
        sha=f"{sequence:040x}",
        candidate_parents=[],
        subject="",
    )


def front_of(points):
    usable = [p for p in points if p.tokens_per_task is not None]
    return pareto_front(
        usable, score=lambda p: p.validation_score, cost=lambda p: p.tokens_per_task
    )


def test_the_front_table_lists_the_chosen_best_a_cheaper_tie_pushed_off_the_front():
    best, cheap, tie = point(1, 0.75, 40.0), point(4, 0.5, 10.0), point(5, 0.75, 20.0)
    points = [point(0, 0.5, 30.0), best, cheap, tie]

    rows = pareto_table(points=points, front=front_of(points), best=SimpleNamespace(id=best.id))

    assert [(r.point.sequence, r.is_best, r.on_front) for r in rows] == [
        (5, False, True),
        (1, True, False),
        (4, False, True),
    ]
    assert rows[1].note == (
        "chosen best though dominated on tokens: #5 (20.0 tokens/task) tied its validation "
        "score later with fewer tokens; the campaign keeps the first candidate to reach its "
        "best validation score, and a tie does not replace it"
    )


def test_the_front_table_marks_a_best_on_the_front_without_a_note():
    best = point(1, 0.75, 40.0)
    points = [point(0, 0.5, 30.0), best]
    rows = pareto_table(points=points, front=front_of(points), best=SimpleNamespace(id=best.id))
    assert [(r.point.sequence, r.is_best, r.note) for r in rows] == [(1, True, ""), (0, False, "")]


def test_the_front_table_lists_a_best_without_a_token_count():
    best = point(1, 0.75, None)
    points = [point(0, 0.5, 30.0), best]
    rows = pareto_table(points=points, front=front_of(points), best=SimpleNamespace(id=best.id))
    assert rows[0].point is best and "no token count" in rows[0].note
    assert pareto_table(points=points, front=front_of(points), best=None)[0].point.sequence == 0
