"""An evaluation executed end to end by a real Celery worker over the real Redis broker."""

from __future__ import annotations

import time

from coevo.evaluations.models import (
    Evaluation,
    EvaluationState,
    Rollout,
    TraceStep,
)
from coevo.evaluations.selectors import evaluation_progress
from coevo.evaluations.services import evaluation_create
from coevo.evaluations.tasks import rollout_run
from coevo.suites.models import Split, Task
from tests.conftest import wait_until_final
from workers.outcomes import RolloutOutcome

CORRECT_BODIES = {
    # Known-correct completions for two of the first four search-split problems.
    "def filter_by_substring": "    return [s for s in strings if substring in s]\n",
    "def below_zero": (
        "    balance = 0\n    for op in operations:\n        balance += op\n"
        "        if balance < 0:\n            return True\n    return False\n"
    ),
}


def evaluate(candidate, suite, policy_version, *, tasks: int) -> Evaluation:
    """An evaluation of the first ``tasks`` search-split tasks (enqueued on commit)."""
    return evaluation_create(
        candidate=candidate,
        suite=suite,
        split=Split.SEARCH,
        policy_version=policy_version,
        task_limit=tasks,
    )


def search_tasks(suite, n: int) -> list[Task]:
    return list(Task.objects.filter(suite=suite, split=Split.SEARCH).order_by("position")[:n])


def test_it_runs_an_evaluation_end_to_end_on_a_real_worker(
    celery_worker_thread, seed_candidate, humaneval_suite, policy_version, scripted_policy
):
    scripted_policy.rules.extend(CORRECT_BODIES.items())
    tasks = search_tasks(humaneval_suite, 4)

    evaluation = evaluate(seed_candidate, humaneval_suite, policy_version, tasks=4)
    wait_until_final(evaluation)

    assert evaluation.state == EvaluationState.FINISHED
    rollouts = list(Rollout.objects.filter(evaluation=evaluation).select_related("task"))
    assert len(rollouts) == 4
    assert {r.task_id for r in rollouts} == {t.id for t in tasks}
    expected_passes = {
        t.key for t in tasks if any(sig in t.inputs["prompt"] for sig in CORRECT_BODIES)
    }
    assert expected_passes == {"HumanEval/3", "HumanEval/7"}
    assert {r.task.key for r in rollouts if r.outcome == RolloutOutcome.PASSED} == expected_passes
    for rollout in rollouts:
        assert rollout.state == "done" and rollout.attempts == 1
        assert rollout.celery_task_id
        kinds = list(TraceStep.objects.filter(rollout=rollout).values_list("kind", flat=True))
        assert kinds == ["start", "model_call", "answer", "verdict"]
    progress = evaluation_progress(evaluation=evaluation)
    assert progress.done == 4 and progress.passed == len(expected_passes)
    assert progress.total_tokens > 0
    assert progress.score.interval is not None


def test_it_does_a_redelivered_rollout_only_once(
    celery_worker_thread, seed_candidate, humaneval_suite, policy_version
):
    evaluation = evaluate(seed_candidate, humaneval_suite, policy_version, tasks=1)
    rollout = Rollout.objects.get(evaluation=evaluation)
    # The broker delivers the same message again (acks_late after a lost ack, say).
    rollout_run.apply_async(args=[str(rollout.id)], queue="rollouts")
    rollout_run.apply_async(args=[str(rollout.id)], queue="rollouts")
    wait_until_final(evaluation)
    time.sleep(1)  # let the extra deliveries be consumed

    rollout.refresh_from_db()
    assert rollout.attempts == 1
    assert TraceStep.objects.filter(rollout=rollout, kind="model_call").count() == 1


def test_it_retries_an_infra_error_and_never_scores_it(
    celery_worker_thread, seed_candidate, humaneval_suite, policy_version, scripted_policy, settings
):
    # The server is up (it lists its models) but every completion fails: not an outage, so the
    # attempts are used up and the rollout ends unscored.
    scripted_policy.fail_next = 10**6
    settings.COEVO_POLICY_RETRIES = 0
    settings.COEVO_ROLLOUT_MAX_ATTEMPTS = 2
    settings.COEVO_ROLLOUT_RETRY_BASE_S = 0
    evaluation = evaluate(seed_candidate, humaneval_suite, policy_version, tasks=1)
    wait_until_final(evaluation)

    rollout = Rollout.objects.get(evaluation=evaluation)
    assert rollout.outcome == RolloutOutcome.INFRA_ERROR
    assert rollout.error_kind == "policy"
    assert rollout.attempts == 2
    assert rollout.score is None
    assert set(TraceStep.objects.filter(rollout=rollout).values_list("attempt", flat=True)) == {
        1,
        2,
    }
    progress = evaluation_progress(evaluation=evaluation)
    assert progress.infra_errors == 1
    assert progress.score.n == 0 and progress.score.mean is None
    assert evaluation.state == EvaluationState.FAILED
    assert "resume" in evaluation.state_detail


def test_it_keeps_going_after_a_crashing_harness(
    celery_worker_thread, project, humaneval_suite, policy_version, tmp_path
):
    from harness_store.services import candidate_import_directory

    harness = tmp_path / "crashy"
    harness.mkdir()
    (harness / "harness.toml").write_text('[harness]\nname = "crashy"\nentrypoint = "agent:run"\n')
    (harness / "agent.py").write_text("def run(task, ctx):\n    raise RuntimeError('nope')\n")
    candidate, _ = candidate_import_directory(
        project=project, directory=harness, message="crashes", author_name="t"
    )
    evaluation = evaluate(candidate, humaneval_suite, policy_version, tasks=3)
    wait_until_final(evaluation)

    outcomes = list(Rollout.objects.filter(evaluation=evaluation).values_list("outcome", "detail"))
    assert outcomes == [(RolloutOutcome.HARNESS_ERROR, "the harness raised RuntimeError: nope")] * 3
    progress = evaluation_progress(evaluation=evaluation)
    assert progress.harness_errors == 3 and progress.score.mean == 0.0


def test_it_requeues_a_rollout_whose_worker_died_and_finishes_it(
    transactional_db, request, seed_candidate, humaneval_suite, policy_version
):
    from datetime import timedelta

    from django.utils import timezone

    from coevo.evaluations.services import rollout_claim, rollout_requeue_stale

    evaluation = evaluate(seed_candidate, humaneval_suite, policy_version, tasks=1)
    # A worker claimed the rollout and died: running, its heartbeat an hour old.
    rollout = Rollout.objects.get(evaluation=evaluation)
    assert rollout_claim(rollout_id=rollout.id, worker="dead@elsewhere")
    Rollout.objects.filter(id=rollout.id).update(heartbeat_at=timezone.now() - timedelta(hours=1))
    request.getfixturevalue("celery_worker_thread")  # a live worker (its queue starts empty)

    assert rollout_requeue_stale(stale_after_s=600) == (1, 0)
    wait_until_final(evaluation)

    rollout.refresh_from_db()
    assert rollout.state == "done" and rollout.attempts == 2
    assert rollout.outcome == RolloutOutcome.TASK_FAILURE
    assert rollout.worker != "dead@elsewhere"


def test_it_gives_up_a_stale_rollout_with_no_attempts_left(
    transactional_db, seed_candidate, humaneval_suite, policy_version, settings
):
    from datetime import timedelta

    from django.utils import timezone

    from coevo.evaluations.services import rollout_claim, rollout_requeue_stale

    settings.COEVO_ROLLOUT_MAX_ATTEMPTS = 1
    evaluation = evaluate(seed_candidate, humaneval_suite, policy_version, tasks=1)
    rollout = Rollout.objects.get(evaluation=evaluation)
    assert rollout_claim(rollout_id=rollout.id, worker="dead@elsewhere")
    Rollout.objects.filter(id=rollout.id).update(heartbeat_at=timezone.now() - timedelta(hours=1))

    assert rollout_requeue_stale(stale_after_s=600) == (0, 1)

    rollout = Rollout.objects.get(evaluation=evaluation)
    assert rollout.outcome == RolloutOutcome.INFRA_ERROR
    assert "stopped heartbeating" in rollout.detail
    assert rollout.error_kind == "worker_lost"
    evaluation.refresh_from_db()
    # Unscored work: the evaluation failed, and can be resumed to run just that rollout.
    assert evaluation.state == EvaluationState.FAILED


def test_it_ignores_the_late_result_of_an_attempt_the_watchdog_gave_up_on(
    transactional_db, seed_candidate, humaneval_suite, policy_version
):
    from coevo.evaluations.services import rollout_finish

    evaluation = evaluate(seed_candidate, humaneval_suite, policy_version, tasks=1)
    stale = Rollout.objects.get(evaluation=evaluation)
    stale.attempts = 1
    # Attempt 2 (after a requeue) is now the one running.
    Rollout.objects.filter(id=stale.id).update(state="running", attempts=2)

    assert (
        rollout_finish(rollout=stale, outcome=RolloutOutcome.PASSED, score=1.0, detail="late")
        is False
    )

    stale.refresh_from_db()
    assert stale.state == "running" and stale.outcome == ""


def test_it_runs_rollouts_without_access_to_the_harness_store_disk(
    celery_worker_thread, seed_candidate, humaneval_suite, policy_version, scripted_policy, settings
):
    import shutil

    scripted_policy.rules.extend(CORRECT_BODIES.items())
    # A worker on another machine has the database but not the store's repositories.
    shutil.rmtree(settings.COEVO_HARNESS_STORE_DIR)

    evaluation = evaluate(seed_candidate, humaneval_suite, policy_version, tasks=4)
    wait_until_final(evaluation)

    outcomes = Rollout.objects.filter(evaluation=evaluation).values_list("outcome", flat=True)
    assert sorted(outcomes) == ["passed", "passed", "task_failure", "task_failure"]
