"""The textworld-basic seed harness playing real TextWorld games against the real llama.cpp
server and Gemma 3 270M, executed by a real Celery worker: nothing scripted."""

from __future__ import annotations

import time

import pytest

from coevo.evaluations.models import (
    EvaluationState,
    Rollout,
    TraceStep,
)
from coevo.evaluations.selectors import evaluation_progress
from coevo.evaluations.services import evaluation_create
from coevo.policies.embedded import DEFAULT_MODEL_ALIAS
from coevo.suites.models import Split
from coevo.suites.textworld import suite_import_textworld
from tests.conftest import REPO_ROOT, wait_until_final
from workers.outcomes import RolloutOutcome

pytestmark = pytest.mark.llm

TEXTWORLD_HARNESS = REPO_ROOT / "examples" / "textworld-basic"
GAMES = 2
MAX_STEPS = 15


def test_it_plays_textworld_games_with_gemma_through_the_seed_harness(
    llama_server,
    celery_worker_thread,
    project,
    owner,
    settings,
):
    from coevo.policies.services import policy_version_get_default
    from harness_store.services import candidate_import_directory

    settings.COEVO_POLICY_URL = llama_server
    settings.COEVO_POLICY_MODEL = DEFAULT_MODEL_ALIAS
    candidate, _ = candidate_import_directory(
        project=project,
        directory=TEXTWORLD_HARNESS,
        message="Seed harness: textworld-basic",
        author_name="Owner",
        created_by=owner,
    )
    suite, _ = suite_import_textworld(project=project, max_steps=MAX_STEPS)
    started = time.monotonic()
    evaluation = evaluation_create(
        candidate=candidate,
        suite=suite,
        split=Split.SEARCH,
        policy_version=policy_version_get_default(),
        task_limit=GAMES,
    )
    wait_until_final(evaluation, timeout_s=900)
    elapsed = time.monotonic() - started

    assert evaluation.state == EvaluationState.FINISHED
    rollouts = list(Rollout.objects.filter(evaluation=evaluation).select_related("task"))
    assert len(rollouts) == GAMES
    for rollout in rollouts:
        # The model may well lose, but the pipeline must not fail: no errors of any kind.
        assert rollout.outcome in (RolloutOutcome.PASSED, RolloutOutcome.TASK_FAILURE), (
            rollout.detail
        )
        kinds = list(
            TraceStep.objects.filter(rollout=rollout)
            .order_by("index")
            .values_list("kind", flat=True)
        )
        assert kinds[:3] == ["start", "env_reset", "model_call"]
        assert kinds[-1] == "verdict"
        steps = TraceStep.objects.filter(rollout=rollout, kind="env_step").order_by("index")
        calls = TraceStep.objects.filter(rollout=rollout, kind="model_call")
        assert 1 <= steps.count() <= MAX_STEPS
        assert calls.count() == steps.count(), "one model call per step"
        first_call = calls.order_by("index").first()
        assert first_call.payload["model"] == DEFAULT_MODEL_ALIAS
        assert "Best command number:" in first_call.payload["prompt"]
        assert all(s.payload["observation"]["observation"] for s in steps)
        assert steps.last().payload["done"] is True, "the harness plays until the game ends"
        print(
            f"{rollout.task.key}: {rollout.outcome} score={rollout.score} "
            f"steps={steps.count()} ({rollout.detail})"
        )
    progress = evaluation_progress(evaluation=evaluation)
    assert progress.done == GAMES and progress.score.n == GAMES
    print(f"{GAMES} games in {elapsed:.0f}s, mean score {progress.score.mean:.3f}")
