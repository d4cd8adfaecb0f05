"""Gate test data: two candidates, and evaluation results written straight to the database
(the way workers leave them), so each verdict rule is tested on known numbers."""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest
from django.utils import timezone

from coevo.evaluations.models import Evaluation, EvaluationState, Outcome, Rollout, RolloutState
from coevo.gates.models import Gate
from coevo.gates.services import gate_create
from coevo.suites.models import Split, Task
from harness_store.services import candidate_import_directory
from tests.conftest import SEED_HARNESS


def import_child(project, parent, directory: Path):
    """A candidate with one change from ``parent`` (the seed harness)."""
    shutil.copytree(SEED_HARNESS, directory)
    agent = directory / "agent.py"
    agent.write_text(agent.read_text() + "\n# the child's change\n")
    candidate, created = candidate_import_directory(
        project=project,
        directory=directory,
        message="Child: one change",
        author_name="Proposer",
        parent=parent,
    )
    assert created
    return candidate


@pytest.fixture
def child_candidate(project, seed_candidate, tmp_path):
    return import_child(project, seed_candidate, tmp_path / "child")


def validation_keys(suite) -> list[str]:
    return list(
        Task.objects.filter(suite=suite, split=Split.VALIDATION)
        .order_by("position")
        .values_list("key", flat=True)
    )


def record(
    evaluation: Evaluation,
    *,
    passed: Iterable[str] = (),
    outcomes: Mapping[str, str] | None = None,
    state: str = EvaluationState.FINISHED,
    detail: str = "",
) -> None:
    """Finish every rollout: tasks in ``passed`` pass, ``outcomes`` overrides, the rest fail."""
    passed, outcomes = set(passed), dict(outcomes or {})
    for rollout in Rollout.objects.filter(evaluation=evaluation).select_related("task"):
        outcome = outcomes.get(
            rollout.task.key,
            Outcome.PASSED if rollout.task.key in passed else Outcome.TASK_FAILURE,
        )
        score = None if outcome == Outcome.INFRA_ERROR else float(outcome == Outcome.PASSED)
        Rollout.objects.filter(id=rollout.id).update(
            state=RolloutState.DONE, outcome=outcome, score=score, finished_at=timezone.now()
        )
    Evaluation.objects.filter(id=evaluation.id).update(
        state=state, state_detail=detail, finished_at=timezone.now()
    )


@pytest.fixture
def make_gate(project, seed_candidate, child_candidate, humaneval_suite, policy_version, owner):
    """``make_gate(**rules)``: the child gated against the seed (by SHA) on validation."""

    def make(**kwargs) -> Gate:
        kwargs.setdefault("against", seed_candidate.sha)
        kwargs.setdefault("candidate", child_candidate)
        return gate_create(
            project=project,
            suite=humaneval_suite,
            policy_version=policy_version,
            created_by=owner,
            **kwargs,
        )

    return make
