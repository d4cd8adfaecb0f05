"""The seed harness on real HumanEval tasks, against the real llama.cpp server and Gemma 3 270M,
executed by a real Celery worker: the whole path with nothing scripted."""

from __future__ import annotations

import pytest

from coevo.evaluations.models import (
    EvaluationState,
    Rollout,
    TraceStep,
)
from coevo.evaluations.selectors import evaluation_progress
from coevo.evaluations.services import evaluation_create
from coevo.policies.embedded import (
    DEFAULT_MODEL_ALIAS,
)
from coevo.suites.models import Split
from tests.conftest import wait_until_final
from workers.outcomes import RolloutOutcome

pytestmark = pytest.mark.llm


def test_it_evaluates_the_seed_harness_with_gemma_on_humaneval(
    llama_server, celery_worker_thread, seed_candidate, humaneval_suite, settings
):
    from coevo.policies.services import policy_version_get_default

    settings.COEVO_POLICY_URL = llama_server
    settings.COEVO_POLICY_MODEL = DEFAULT_MODEL_ALIAS
    evaluation = evaluation_create(
        candidate=seed_candidate,
        suite=humaneval_suite,
        split=Split.SEARCH,
        policy_version=policy_version_get_default(),
        task_limit=3,
        knobs={"max_tokens": 96},
    )
    wait_until_final(evaluation, timeout_s=300)

    assert evaluation.state == EvaluationState.FINISHED
    rollouts = list(Rollout.objects.filter(evaluation=evaluation))
    assert len(rollouts) == 3
    for rollout in rollouts:
        # The model may well be wrong, but the pipeline must not be: no errors of any kind.
        assert rollout.outcome in (RolloutOutcome.PASSED, RolloutOutcome.TASK_FAILURE), (
            rollout.detail
        )
        call = TraceStep.objects.get(rollout=rollout, kind="model_call")
        assert call.payload["model"] == DEFAULT_MODEL_ALIAS
        assert call.payload["sampling"]["max_tokens"] == 96
        assert call.prompt_tokens > 20 and call.completion_tokens > 0
        assert call.latency_ms > 0
        assert call.payload["completion"].strip()
        verdict = TraceStep.objects.get(rollout=rollout, kind="verdict")
        assert verdict.payload["passed"] == (rollout.outcome == RolloutOutcome.PASSED)
    progress = evaluation_progress(evaluation=evaluation)
    assert progress.done == 3 and progress.score.n == 3
