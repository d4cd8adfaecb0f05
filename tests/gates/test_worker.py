"""A gate run end to end by a real Celery worker over the real Redis broker: both
evaluations run, the evaluation_finished signal enqueues gate_advance, and the gate finishes
by itself with a verdict."""

from __future__ import annotations

import time

import pytest

from coevo.gates.models import Gate
from coevo.gates.services import gate_create
from coevo.reviews.services import channel_get_or_create, channel_move
from tests.support.factories import (
    ASKS_THE_MODEL,
    GUESSES,
    jsonl_rows,
    make_agent_candidate,
    make_jsonl_suite,
)

TASKS = [("mul", "6 * 7 =", "42"), ("add", "1 + 1 =", "2"), ("sub", "9 - 4 =", "5")]


def wait_for_gate(gate: Gate, timeout_s: float = 90) -> Gate:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        gate.refresh_from_db()
        if gate.is_final:
            return gate
        time.sleep(0.2)
    raise AssertionError(f"gate still {gate.state} after {timeout_s}s")


@pytest.mark.django_db(transaction=True)
def test_it_finishes_a_gate_by_itself_on_a_real_worker(
    celery_worker_thread, project, owner, policy_version, scripted_policy, tmp_path
):
    scripted_policy.rules.extend((question, f" {answer}") for _, question, answer in TASKS)
    suite = make_jsonl_suite(
        project, jsonl_rows(TASKS, split="validation"), name="arith", scorer="numeric"
    )
    baseline = make_agent_candidate(project, tmp_path, "guesser", GUESSES)
    candidate = make_agent_candidate(project, tmp_path, "asker", ASKS_THE_MODEL)
    production = channel_get_or_create(project=project, name="production")
    channel_move(channel=production, candidate=baseline, policy_version=None, moved_by=owner)

    gate = gate_create(
        project=project,
        candidate=candidate,
        against="production",
        suite=suite,
        min_score=0.5,
        # No max_regression: on three tasks it is inconclusive (too few for its interval).
        critical_tasks=["mul"],
        created_by=owner,
    )
    gate = wait_for_gate(gate)

    assert gate.verdict == "pass", gate.reasons
    assert gate.state == "finished"
    assert gate.candidate_evaluation.state == gate.baseline_evaluation.state == "finished"
    assert gate.statistics["candidate"]["mean"] == 1.0
    assert gate.statistics["baseline"]["mean"] == 0.0
    assert gate.statistics["comparison"]["flips"]["fixed"] == ["add", "mul", "sub"]
    assert [r["outcome"] for r in gate.reasons] == ["pass", "pass"]
