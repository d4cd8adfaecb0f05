"""A gate run end to end by a real Celery worker over the real Redis broker: both
evaluations run, the evaluation_finished signal enqueues gate_advance, and the gate finishes
by itself with a verdict."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from coevo.gates.models import Gate
from coevo.gates.services import gate_create
from coevo.reviews.services import channel_get_or_create, channel_move
from coevo.suites.jsonl import scorer_spec_build
from coevo.suites.services import suite_import_jsonl
from harness_store.services import candidate_import_directory

MANIFEST = """
[harness]
name = "{name}"
entrypoint = "agent:run"
policy_api = "completions"

[limits]
max_model_calls = 2
wall_time_s = 30
"""

ASKS_THE_MODEL = """
def run(task, ctx):
    return ctx.llm.complete(task["input"], max_tokens=8).texts[0].strip()
"""

GUESSES = """
def run(task, ctx):
    return "0"
"""

TASKS = [("mul", "6 * 7 =", "42"), ("add", "1 + 1 =", "2"), ("sub", "9 - 4 =", "5")]


def harness(project, tmp_path: Path, name: str, agent: str):
    directory = tmp_path / name
    directory.mkdir()
    (directory / "harness.toml").write_text(MANIFEST.format(name=name))
    (directory / "agent.py").write_text(agent)
    candidate, _ = candidate_import_directory(
        project=project, directory=directory, message=name, author_name="Tester"
    )
    return candidate


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
    rows = [
        {"id": key, "input": question, "expected": answer, "split": "validation"}
        for key, question, answer in TASKS
    ]
    suite, _ = suite_import_jsonl(
        project=project,
        name="arith",
        data="\n".join(json.dumps(row) for row in rows).encode(),
        scorer=scorer_spec_build(kind="numeric"),
    )
    baseline = harness(project, tmp_path, "guesser", GUESSES)
    candidate = harness(project, tmp_path, "asker", ASKS_THE_MODEL)
    production = channel_get_or_create(project=project, name="production")
    channel_move(channel=production, candidate=baseline, policy_version=None, moved_by=owner)

    gate = gate_create(
        project=project,
        candidate=candidate,
        against="production",
        suite=suite,
        min_score=0.5,
        max_regression=0.0,
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
    assert [r["outcome"] for r in gate.reasons] == ["pass", "pass", "pass"]
