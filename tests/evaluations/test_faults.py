"""Fault tests: real worker processes, killed and restarted; a policy server that goes away;
a Redis that restarts and forgets every message. Each evaluation must still finish with every
(task, epoch) scored exactly once and nothing counted as failed because of the fault.

The watchdog's two jobs (requeue rollouts of dead workers, send lost messages again, resume
evaluations paused for an outage) are called here in the loop, as beat would call them.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import pytest
from django.db import connection

from coevo.celery import app
from coevo.evaluations.models import (
    Evaluation,
    EvaluationState,
    Rollout,
    TraceStep,
)
from coevo.evaluations.services import (
    evaluation_create,
    evaluations_resume_paused,
    rollout_requeue_stale,
    rollout_resend_lost,
)
from coevo.policies.models import PolicyEndpoint
from coevo.suites.models import Split
from tests.evaluations.test_worker import CORRECT_BODIES
from tests.support.openai_server import ScriptedOpenAIServer, ScriptedPolicy
from tests.support.processes import RedisProcess, WorkerProcess
from workers.outcomes import RolloutOutcome

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

TASKS = 10


@pytest.fixture
def slow_policy(settings):
    """A scripted policy that takes a while to answer, so rollouts are in flight when it hurts."""
    policy = ScriptedPolicy(latency_s=1.0)
    policy.rules.extend(CORRECT_BODIES.items())
    server = ScriptedOpenAIServer(policy)
    server.start()
    settings.COEVO_POLICY_URL = server.url
    settings.COEVO_POLICY_MODEL = "scripted"
    yield server
    server.stop()


@pytest.fixture
def policy(slow_policy):
    from coevo.policies.services import policy_version_get_default

    version = policy_version_get_default()
    PolicyEndpoint.objects.filter(id=version.endpoint_id).update(max_concurrency=8)
    return version


@pytest.fixture
def workers(tmp_path, settings):
    started: list[WorkerProcess] = []

    def start(name: str, **env: str) -> WorkerProcess:
        env.setdefault("COEVO_WORKER_CONCURRENCY", "4")
        env.setdefault("COEVO_POLICY_RETRIES", "1")
        env.setdefault("COEVO_ROLLOUT_RETRY_BASE_S", "1")
        worker = WorkerProcess(name=name, broker_url=app.conf.broker_url, log_dir=tmp_path, **env)
        started.append(worker)
        return worker

    app.control.purge()
    yield start
    for worker in started:
        worker.stop()
    connection.close()


def evaluate(candidate, suite, policy) -> Evaluation:
    return evaluation_create(
        candidate=candidate,
        suite=suite,
        split=Split.SEARCH,
        policy_version=policy,
        task_limit=TASKS,
        use_cache=False,
    )


def wait_for(condition, *, timeout_s: float, what: str, watchdog: bool = False) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if watchdog:
            rollout_requeue_stale(stale_after_s=4)
            rollout_resend_lost(unsent_after_s=4)
            evaluations_resume_paused()
        if condition():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def done_count(evaluation: Evaluation) -> int:
    return Rollout.objects.filter(evaluation=evaluation, state="done").count()


def assert_scored_exactly_once(evaluation: Evaluation) -> None:
    evaluation.refresh_from_db()
    assert evaluation.state == EvaluationState.FINISHED, evaluation.state_detail
    rollouts = list(Rollout.objects.filter(evaluation=evaluation).select_related("task"))
    assert len(rollouts) == TASKS
    for rollout in rollouts:
        assert rollout.state == "done"
        assert rollout.outcome in (RolloutOutcome.PASSED, RolloutOutcome.TASK_FAILURE), (
            rollout.task.key,
            rollout.outcome,
            rollout.detail,
        )
        # One verdict, from the attempt that counts.
        verdicts = TraceStep.objects.filter(rollout=rollout, kind="verdict")
        assert list(verdicts.values_list("attempt", flat=True)) == [rollout.attempts]
    passed = {r.task.key for r in rollouts if r.outcome == RolloutOutcome.PASSED}
    # The tasks with scripted correct bodies pass; the others fail on their merits.
    assert passed == {"HumanEval/3", "HumanEval/7"}


def test_a_worker_killed_mid_evaluation_loses_nothing(
    workers, seed_candidate, humaneval_suite, policy
):
    first = workers("first")
    evaluation = evaluate(seed_candidate, humaneval_suite, policy)
    wait_for(
        lambda: Rollout.objects.filter(evaluation=evaluation, state="running").count() >= 2,
        timeout_s=90,
        what="rollouts running on the first worker",
    )
    first.kill()
    killed_running = set(
        Rollout.objects.filter(evaluation=evaluation, state="running").values_list("id", flat=True)
    )
    assert killed_running

    workers("second")
    wait_for(
        lambda: Evaluation.objects.get(id=evaluation.id).is_final,
        timeout_s=180,
        what="the evaluation to finish on the second worker",
        watchdog=True,
    )
    assert_scored_exactly_once(evaluation)
    for rollout in Rollout.objects.filter(id__in=killed_running):
        assert rollout.attempts == 2, "the killed attempt was run again"
        assert rollout.worker.startswith("second@")


# A harness that makes one model call and then works on: told "HANG", for as long as it takes
# the test to kill its worker.
HANGING_AGENT = """
import time


def run(task, ctx):
    ctx.log("asking the policy")
    result = ctx.llm.complete(task["prompt"], max_tokens=16)
    if result.texts[0] == "HANG":
        time.sleep(60)
    return result.texts[0]
"""


def test_a_worker_killed_mid_rollout_leaves_the_attempts_trace(
    workers, tmp_path, project, owner, humaneval_suite, policy, slow_policy
):
    from harness_store.services import candidate_import_directory

    harness = tmp_path / "hanging"
    harness.mkdir()
    (harness / "harness.toml").write_text(
        '[harness]\nname = "hanging"\nentrypoint = "agent:run"\npolicy_api = "completions"\n'
    )
    (harness / "agent.py").write_text(HANGING_AGENT)
    candidate, _ = candidate_import_directory(
        project=project, directory=harness, message="hangs", author_name="T", created_by=owner
    )
    scripted = slow_policy.policy
    # Answered at once: the killed attempt's steps all come within milliseconds of its start,
    # inside any batching interval, so only steps written as they happen survive the kill.
    scripted.latency_s = 0
    scripted.rules.clear()
    scripted.default = "HANG"
    first = workers("first")
    evaluation = evaluation_create(
        candidate=candidate,
        suite=humaneval_suite,
        split=Split.SEARCH,
        policy_version=policy,
        task_limit=1,
        use_cache=False,
    )
    rollout = Rollout.objects.get(evaluation=evaluation)
    wait_for(lambda: scripted.requests, timeout_s=90, what="the first attempt's model call")
    model_call = TraceStep.objects.filter(rollout=rollout, kind="model_call")
    deadline = time.monotonic() + 10
    while not model_call.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    first.kill()  # its harness is asleep, the model call answered

    scripted.default = "    return None\n"
    workers("second")
    wait_for(
        lambda: Evaluation.objects.get(id=evaluation.id).is_final,
        timeout_s=120,
        what="the rollout to be re-run and finished",
        watchdog=True,
    )
    rollout.refresh_from_db()
    assert rollout.state == "done" and rollout.attempts == 2, rollout.detail
    assert rollout.outcome in (RolloutOutcome.PASSED, RolloutOutcome.TASK_FAILURE), rollout.detail
    assert len(scripted.requests) == 2
    steps = TraceStep.objects.filter(rollout=rollout).order_by("attempt", "index")
    assert list(steps.values_list("attempt", "index", "kind")) == [
        # The killed attempt, up to its death: it called the policy, and was answered.
        (1, 0, "start"),
        (1, 1, "log"),
        (1, 2, "model_call"),
        (2, 0, "start"),
        (2, 1, "log"),
        (2, 2, "model_call"),
        (2, 3, "answer"),
        (2, 4, "verdict"),
    ]
    assert steps.get(attempt=1, kind="model_call").payload["completion"] == "HANG"
    assert steps.get(attempt=2, kind="answer").payload["answer"] == "    return None\n"


def test_a_policy_outage_pauses_the_evaluation_and_fails_no_task(
    workers, seed_candidate, humaneval_suite, policy, slow_policy, settings
):
    settings.COEVO_INFRA_PAUSE_THRESHOLD = 2
    workers("outage", COEVO_INFRA_PAUSE_THRESHOLD="2")
    evaluation = evaluate(seed_candidate, humaneval_suite, policy)
    wait_for(lambda: done_count(evaluation) >= 2, timeout_s=90, what="two rollouts done")
    slow_policy.stop()
    wait_for(
        lambda: Evaluation.objects.get(id=evaluation.id).state == EvaluationState.PAUSED,
        timeout_s=90,
        what="the evaluation to pause",
    )
    evaluation.refresh_from_db()
    assert "policy outages" in evaluation.state_detail
    assert not Rollout.objects.filter(
        evaluation=evaluation, outcome=RolloutOutcome.INFRA_ERROR
    ).exists()

    slow_policy.start()
    wait_for(
        lambda: Evaluation.objects.get(id=evaluation.id).is_final,
        timeout_s=180,
        what="the evaluation to resume and finish",
        watchdog=True,
    )
    assert_scored_exactly_once(evaluation)


@contextmanager
def publishing_to(broker_url: str):
    """Point this process's Celery app at another broker (and back)."""
    old = app.conf.broker_url
    app.conf.broker_url = broker_url
    app._pool = None
    app.amqp._producer_pool = None
    try:
        yield
    finally:
        app.conf.broker_url = old
        app._pool = None
        app.amqp._producer_pool = None


@pytest.mark.parametrize("appendonly", [False, True], ids=["back-empty", "back-with-its-aof"])
def test_a_redis_restart_mid_evaluation_loses_no_rollout(
    tmp_path, workers, seed_candidate, humaneval_suite, policy, appendonly
):
    """Back empty, the queued messages are gone (resent); back with its append-only file (the
    config docker-compose.yml ships), the policy slots held at the stop come back too, and
    used to stop every rollout for the leases' 26 minutes: now they end within one lease."""
    redis_server = RedisProcess(tmp_path, appendonly=appendonly)
    redis_server.start()
    try:
        with publishing_to(redis_server.url):
            worker = workers("redis", COEVO_REDIS_URL=redis_server.url)
            evaluation = evaluate(seed_candidate, humaneval_suite, policy)
            wait_for(lambda: done_count(evaluation) >= 2, timeout_s=90, what="two rollouts done")
            redis_server.stop()  # without its AOF, every queued message is gone
            time.sleep(2)
            redis_server.start()
            wait_for(
                lambda: Evaluation.objects.get(id=evaluation.id).is_final,
                timeout_s=120,
                what="the evaluation to finish after the restart",
                watchdog=True,
            )
            assert worker.proc.poll() is None, worker.log_tail()
            assert_scored_exactly_once(evaluation)
    finally:
        redis_server.stop()
