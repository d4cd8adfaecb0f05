"""Racing: the best of several candidates with early elimination."""

from __future__ import annotations

import json
import random

import pytest

from coevo.evaluations.stats.base import InvalidStatisticsInput
from coevo.evaluations.stats.racing import Race, race


def test_it_eliminates_an_obviously_bad_candidate_early():
    rng = random.Random(4)
    contest = Race(["good", "fair", "bad"])
    for _ in range(200):
        contest.observe(
            {c: float(rng.random() < 0.8) for c in contest.alive if c == "good"}
            | {c: float(rng.random() < 0.5) for c in contest.alive if c == "fair"}
            | {c: 0.0 for c in contest.alive if c == "bad"}
        )
        if contest.finished:
            break

    result = contest.result()
    bad = next(e for e in result.eliminations if e.candidate == "bad")
    assert bad.after_tasks < 20 and bad.by == "good"
    assert bad.reason.startswith(
        f"eliminated after {bad.after_tasks} tasks: clearly worse than good"
    )
    assert result.winner == "good" and result.decided
    assert result.rollouts < 3 * result.tasks_seen


def test_it_keeps_equal_candidates_in_the_race():
    rng = random.Random(9)
    eliminated = 0
    races = 30
    for _ in range(races):
        probabilities = [rng.random() for _ in range(60)]
        scores = {c: [float(rng.random() < p) for p in probabilities] for c in "abc"}
        result = race(scores, alpha=0.05)
        eliminated += sum(e.kind == "evidence" for e in result.eliminations)

    # Each candidate is wrongly dropped with probability at most alpha (here all are best).
    assert eliminated / (3 * races) <= 0.05


def test_it_picks_the_highest_mean_when_tasks_run_out():
    contest = Race(["a", "b"])
    for a, b in [(1, 1), (0, 1), (1, 1), (0, 0)]:
        contest.observe({"a": a, "b": b})

    result = contest.result()

    assert not result.decided and result.winner == "b" and result.alive == ("a", "b")
    assert result.means == {"a": 0.5, "b": 0.75} and result.rollouts == 8
    assert json.loads(json.dumps(result.as_dict()))["winner"] == "b"


def test_it_drops_a_candidate_that_cannot_catch_up_in_the_tasks_left():
    result = race({"a": [1, 1, 1, 0, 0], "b": [0, 0, 0, 0, 0]})

    (dropped,) = result.eliminations
    assert (dropped.candidate, dropped.kind, dropped.after_tasks) == ("b", "out_of_reach", 3)
    assert dropped.reason == (
        "eliminated after 3 tasks: cannot catch up with a in the 2 tasks left (0 vs 3 passed)"
    )
    assert result.winner == "a" and result.rollouts == 6


def test_it_refuses_to_observe_without_every_alive_candidate():
    contest = Race(["a", "b"])

    with pytest.raises(InvalidStatisticsInput, match="missing scores"):
        contest.observe({"a": 1.0})
