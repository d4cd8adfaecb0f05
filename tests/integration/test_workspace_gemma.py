"""The shipped workspace suite end to end: imported from its Harbor directories, the shipped
seed harness (examples/workspace-basic) evaluated on it by a real Celery worker against the
real llama.cpp server with Gemma 3 270M, each rollout verified by the task's own test.sh in the
sandbox. Nothing scripted: the model may fail a task, the pipeline may not."""

from __future__ import annotations

from pathlib import Path

import pytest

from coevo.evaluations.models import (
    EvaluationState,
    Rollout,
    TraceStep,
)
from coevo.evaluations.services import evaluation_create
from coevo.policies.embedded import DEFAULT_MODEL_ALIAS
from coevo.suites.harbor import suite_import_workspace_basic
from coevo.suites.models import Split
from harness_store.services import candidate_import_directory
from tests.conftest import wait_until_final
from workers.outcomes import RolloutOutcome

pytestmark = pytest.mark.llm

SEED = Path(__file__).resolve().parents[2] / "examples" / "workspace-basic"


def test_the_shipped_workspace_suite_is_evaluated_with_gemma_on_a_real_worker(
    llama_server, celery_worker_thread, project, settings
):
    from coevo.policies.services import policy_version_get_default

    settings.COEVO_POLICY_URL = llama_server
    settings.COEVO_POLICY_MODEL = DEFAULT_MODEL_ALIAS
    suite, created, report = suite_import_workspace_basic(project=project)
    assert created and len(report.taken) >= 20 and not report.refused
    candidate, _ = candidate_import_directory(
        project=project, directory=SEED, message="workspace seed", author_name="t"
    )
    evaluation = evaluation_create(
        candidate=candidate,
        suite=suite,
        split=Split.SEARCH,
        policy_version=policy_version_get_default(),
        task_limit=2,
        # One attempt of at most 256 tokens a task: the pipeline is under test, not the model.
        knobs={"max_attempts": 1, "max_tokens": 256},
    )
    wait_until_final(evaluation, timeout_s=600)

    assert evaluation.state == EvaluationState.FINISHED
    rollouts = list(Rollout.objects.filter(evaluation=evaluation))
    assert len(rollouts) == 2
    for rollout in rollouts:
        assert rollout.outcome in (RolloutOutcome.PASSED, RolloutOutcome.TASK_FAILURE), (
            rollout.detail
        )
        kinds = list(TraceStep.objects.filter(rollout=rollout).values_list("kind", flat=True))
        assert "model_call" in kinds and "workspace_diff" in kinds and "verdict" in kinds
        verdict = TraceStep.objects.get(rollout=rollout, kind="verdict").payload
        # The task's own test.sh ran: its output is kept for reviewers.
        assert verdict["output"].strip(), verdict
