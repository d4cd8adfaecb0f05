"""Recovery in seconds (issue 40, items 2 and 3), on real processes: beat's housekeeping runs on
its own queue and worker while every rollout thread is busy; a killed worker's rollout runs
again within 30 s; a message the broker lost is sent again within seconds; a rollout that
heartbeats without progress is ended; one UPDATE beats all of a process's rollouts."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import redis
from django.conf import settings as django_settings
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from coevo.celery import app
from coevo.evaluations.models import (
    Evaluation,
    Rollout,
    RolloutState,
    TraceStep,
)
from coevo.evaluations.services import (
    rollout_claim,
    rollout_end_stuck,
    rollout_progress_bound_s,
    rollout_requeue_stale,
    rollout_resend_lost,
)
from coevo.evaluations.services import watchdog as watchdog_service
from coevo.evaluations.services.heartbeats import RolloutHeartbeats
from coevo.evaluations.tasks import rollouts_watchdog
from harness_store.services import candidate_import_directory
from tests.conftest import wait_until_final
from tests.support.factories import evaluate_search as evaluate
from workers.outcomes import RolloutOutcome

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]


@pytest.fixture(autouse=True)
def _empty_queue(empty_queue):
    """Rollouts these tests send and never run do not reach the next test's worker."""


# Sleeps through the test: its worker's only thread stays busy.
SLEEPING_AGENT = "import time\n\n\ndef run(task, ctx):\n    time.sleep(600)\n"
# One model call; told "HANG", it sleeps until the test kills its worker.
HANGING_AGENT = """
import time


def run(task, ctx):
    result = ctx.llm.complete(task["prompt"], max_tokens=16)
    if result.texts[0] == "HANG":
        time.sleep(600)
    return result.texts[0]
"""
# Makes progress all along: a log line (a trace step) every 0.3 s.
LOGGING_AGENT = """
import time


def run(task, ctx):
    for i in range(300):
        ctx.log(f"step {i}")
        time.sleep(0.3)
    return "    pass\\n"
"""


def harness(tmp_path, project, owner, name: str, source: str):
    directory = tmp_path / name
    directory.mkdir()
    (directory / "harness.toml").write_text(
        f'[harness]\nname = "{name}"\nentrypoint = "agent:run"\npolicy_api = "completions"\n'
    )
    (directory / "agent.py").write_text(source)
    candidate, _ = candidate_import_directory(
        project=project, directory=directory, message=name, author_name="T", created_by=owner
    )
    return candidate


def waited(condition, *, timeout_s: float, what: str) -> float:
    """Seconds until ``condition()`` held (polled every 0.2 s); fails after ``timeout_s``."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.2)
    return time.monotonic() - started


def running_on(evaluation: Evaluation, prefix: str) -> Rollout | None:
    return Rollout.objects.filter(
        evaluation=evaluation, state=RolloutState.RUNNING, worker__startswith=prefix
    ).first()


def test_beats_watchdog_runs_on_the_ops_worker_while_every_rollout_thread_is_busy(
    celery_processes, tmp_path, project, owner, humaneval_suite, policy_version
):
    # The rollout worker as deployed (rollouts and default), with its one thread taken.
    celery_processes.worker("busy", COEVO_WORKER_CONCURRENCY="1")
    celery_processes.worker("ops", queues="ops")
    candidate = harness(tmp_path, project, owner, "sleeper", SLEEPING_AGENT)
    evaluation = evaluate(candidate, humaneval_suite, policy_version, tasks=2)
    waited(lambda: running_on(evaluation, "busy@"), timeout_s=90, what="the busy rollout")
    busy = running_on(evaluation, "busy@")
    # The other one was claimed by a worker that died an hour ago.
    dead = Rollout.objects.get(evaluation=evaluation, state=RolloutState.PENDING)
    assert rollout_claim(rollout_id=dead.id, worker="dead@elsewhere")
    Rollout.objects.filter(id=dead.id).update(heartbeat_at=timezone.now() - timedelta(hours=1))

    celery_processes.beat(COEVO_WATCHDOG_INTERVAL_S="1")
    waited(
        lambda: "stopped heartbeating" in Rollout.objects.get(id=dead.id).detail,
        timeout_s=60,
        what="beat's watchdog to requeue the dead worker's rollout",
    )

    dead.refresh_from_db()
    assert dead.state == RolloutState.PENDING  # sent again: it waits for a free rollout thread
    busy.refresh_from_db()
    assert busy.state == RolloutState.RUNNING and busy.attempts == 1  # busy all along


def test_a_killed_workers_rollout_runs_again_within_30_seconds(
    celery_processes, tmp_path, project, owner, humaneval_suite, policy_version, scripted_policy
):
    # Production's timings: the worker's heartbeat, beat's interval and the stale bound are the
    # settings' defaults (the test processes' default heartbeat is 1 s).
    defaults = {"COEVO_HEARTBEAT_S": str(django_settings.COEVO_HEARTBEAT_S)}
    celery_processes.worker("ops", queues="ops", **defaults)
    celery_processes.beat(**defaults)
    first = celery_processes.worker("first", **defaults)
    scripted_policy.default = "HANG"
    candidate = harness(tmp_path, project, owner, "hanging", HANGING_AGENT)
    evaluation = evaluate(candidate, humaneval_suite, policy_version)
    rollout = Rollout.objects.get(evaluation=evaluation)
    waited(
        lambda: running_on(evaluation, "first@") and scripted_policy.requests,
        timeout_s=90,
        what="the first attempt's model call",
    )
    second = celery_processes.worker("second", **defaults)
    waited(lambda: "ready." in second.log_path.read_text(), timeout_s=60, what="worker second")

    first.kill()  # mid-rollout: its harness asleep, the model call answered
    scripted_policy.default = "    return None\n"
    rerun_s = waited(
        lambda: (
            running_on(evaluation, "second@") or Evaluation.objects.get(id=evaluation.id).is_final
        ),
        timeout_s=90,
        what="the rollout to run again on the second worker",
    )

    print(f"\nthe killed worker's rollout ran again {rerun_s:.1f}s after the kill")
    assert rerun_s <= 30, f"re-run {rerun_s:.1f}s after the kill"
    wait_until_final(evaluation)
    rollout.refresh_from_db()
    assert rollout.state == RolloutState.DONE and rollout.attempts == 2
    assert rollout.outcome == RolloutOutcome.TASK_FAILURE and rollout.worker.startswith("second@")


def test_a_message_the_broker_lost_is_sent_again_within_seconds(
    request, seed_candidate, humaneval_suite, policy_version
):
    broker = redis.Redis.from_url(app.conf.broker_url)
    evaluation = evaluate(seed_candidate, humaneval_suite, policy_version)
    waited(lambda: broker.llen("rollouts") == 1, timeout_s=10, what="the rollout's message")
    broker.delete("rollouts")  # what a broker restarted empty does to it
    lost = time.monotonic()
    request.getfixturevalue("celery_worker_thread")  # an idle worker

    def done() -> bool:
        # Beat's watchdog, at beat's interval (run here, where the test can time it).
        if time.monotonic() >= done.next_run:
            rollouts_watchdog()
            done.next_run = time.monotonic() + django_settings.COEVO_WATCHDOG_INTERVAL_S
        return Evaluation.objects.get(id=evaluation.id).is_final

    done.next_run = 0.0
    waited(done, timeout_s=60, what="the lost rollout to be sent again and run")

    recovered_s = time.monotonic() - lost
    print(f"\nthe lost message's rollout finished {recovered_s:.1f}s after the message was lost")
    assert recovered_s <= 20
    rollout = Rollout.objects.get(evaluation=evaluation)
    assert rollout.state == RolloutState.DONE and rollout.attempts == 1


def test_a_retry_waiting_out_its_backoff_is_not_taken_for_a_lost_message(
    celery_worker_thread, seed_candidate, humaneval_suite, policy_version, scripted_policy, settings
):
    # One 503 and no client retries: an infra error, retried after an 8 s backoff (the worker
    # holds the retry's message meanwhile; the queue is empty).
    scripted_policy.fail_next = 1
    settings.COEVO_POLICY_RETRIES = 0
    settings.COEVO_ROLLOUT_RETRY_BASE_S = 8
    evaluation = evaluate(seed_candidate, humaneval_suite, policy_version)
    rollout = Rollout.objects.get(evaluation=evaluation)
    waited(
        lambda: Rollout.objects.filter(id=rollout.id, state="pending", attempts=1).exists(),
        timeout_s=60,
        what="the first attempt's infra error",
    )
    failed_at = timezone.now()

    for _ in range(4):
        assert rollout_resend_lost(unsent_after_s=1) == 0
        time.sleep(1)
    wait_until_final(evaluation)

    rollout.refresh_from_db()
    assert rollout.attempts == 2 and rollout.outcome == RolloutOutcome.TASK_FAILURE
    assert rollout.started_at - failed_at >= timedelta(seconds=7)  # the backoff held


def test_a_rollout_heartbeating_without_progress_past_the_bound_is_run_again(
    celery_processes, tmp_path, project, owner, seed_candidate, humaneval_suite, policy_version,
    scripted_policy,
):  # fmt: skip
    # A model call that never returns within the test: the rollout's thread waits on it, its
    # worker's heartbeat thread beats on.
    scripted_policy.latency_s = 600
    worker = celery_processes.worker(
        "stuck",
        COEVO_WORKER_CONCURRENCY="2",
        COEVO_POLICY_TIMEOUT_S="600",
        COEVO_POLICY_RETRIES="0",
    )
    stuck_evaluation = evaluate(seed_candidate, humaneval_suite, policy_version)
    logging = harness(tmp_path, project, owner, "logging", LOGGING_AGENT)
    working_evaluation = evaluate(logging, humaneval_suite, policy_version)
    stuck = Rollout.objects.get(evaluation=stuck_evaluation)
    working = Rollout.objects.get(evaluation=working_evaluation)
    waited(
        lambda: scripted_policy.requests and TraceStep.objects.filter(rollout=working).count() >= 2,
        timeout_s=90,
        what="the stuck model call and the working rollout's first steps",
    )
    time.sleep(4)

    stuck.refresh_from_db()
    assert stuck.state == RolloutState.RUNNING
    assert timezone.now() - stuck.heartbeat_at < timedelta(seconds=3)  # alive, by its heartbeat
    # Within the real bound (a slow model call is allowed its slowest) nothing is ended.
    assert rollout_end_stuck(no_progress_s=rollout_progress_bound_s()) == (0, 0)
    assert rollout_end_stuck(no_progress_s=3) == (1, 0)

    stuck.refresh_from_db()
    assert stuck.state == RolloutState.PENDING and stuck.attempts == 1
    assert "made no progress" in stuck.detail and "kept heartbeating" in stuck.detail
    working.refresh_from_db()
    assert working.state == RolloutState.RUNNING and working.attempts == 1
    # The stuck attempt's worker no longer beats for it.
    beaten_at = stuck.heartbeat_at
    time.sleep(2.5)
    stuck.refresh_from_db()
    assert stuck.heartbeat_at == beaten_at
    worker.kill()


def test_its_progress_bound_covers_the_wall_time_and_a_slowest_model_call(settings):
    settings.COEVO_ROLLOUT_WALL_S = 900
    settings.COEVO_HARNESS_ENV_BUILD_TIMEOUT_S = 600
    settings.COEVO_WORKSPACE_VERIFIER_TIMEOUT_S = 600
    settings.COEVO_POLICY_SLOT_WAIT_S = 900
    settings.COEVO_POLICY_TIMEOUT_S = 300
    settings.COEVO_POLICY_RETRIES = 4
    assert rollout_progress_bound_s() == 900 + 600 + 600 + (900 + 300 * 5) + 60


def test_it_does_not_blame_workers_for_a_database_restart(
    monkeypatch, seed_candidate, humaneval_suite, policy_version
):
    evaluation = evaluate(seed_candidate, humaneval_suite, policy_version)
    rollout = Rollout.objects.get(evaluation=evaluation)
    assert rollout_claim(rollout_id=rollout.id, worker="live@host")
    Rollout.objects.filter(id=rollout.id).update(
        heartbeat_at=timezone.now() - timedelta(seconds=30)
    )
    started_at = watchdog_service._database_started_at()
    assert started_at is not None and started_at < timezone.now()  # PostgreSQL's own answer

    # PostgreSQL came back 5 s ago: no worker could beat while it was down.
    monkeypatch.setattr(
        watchdog_service, "_database_started_at", lambda: timezone.now() - timedelta(seconds=5)
    )
    assert rollout_requeue_stale(stale_after_s=20) == (0, 0)
    # Up for longer than the bound: a heartbeat that old is a dead worker's.
    monkeypatch.setattr(
        watchdog_service, "_database_started_at", lambda: timezone.now() - timedelta(seconds=25)
    )
    assert rollout_requeue_stale(stale_after_s=20) == (1, 0)


def test_one_update_beats_all_of_a_processes_rollouts(
    seed_candidate, humaneval_suite, policy_version
):
    evaluation = evaluate(seed_candidate, humaneval_suite, policy_version, tasks=4)
    rollouts = [rollout_claim(rollout_id=r.id, worker="w") for r in evaluation.rollouts.all()]
    heartbeats = RolloutHeartbeats(thread=False)
    cancelled = {r.id: heartbeats.register(rollout_id=r.id, attempt=r.attempts) for r in rollouts}

    with CaptureQueriesContext(connection) as queries:
        assert heartbeats.beat() == 4
    assert len(queries) == 1 and queries[0]["sql"].startswith("UPDATE")

    # One is taken from its worker (cancelled, or requeued and claimed again): told at once.
    taken = rollouts[0]
    Rollout.objects.filter(id=taken.id).update(attempts=taken.attempts + 1)
    with CaptureQueriesContext(connection) as queries:
        assert heartbeats.beat() == 3
    assert len(queries) == 2  # the UPDATE, and which rows it missed
    assert cancelled[taken.id].is_set()
    assert not any(cancelled[r.id].is_set() for r in rollouts[1:])
    with CaptureQueriesContext(connection) as queries:
        assert heartbeats.beat() == 3  # no longer beaten for
    assert len(queries) == 1


def test_two_deliveries_racing_claim_a_rollout_once(
    seed_candidate, humaneval_suite, policy_version
):
    evaluation = evaluate(seed_candidate, humaneval_suite, policy_version)
    rollout = Rollout.objects.get(evaluation=evaluation)
    start = threading.Barrier(8)
    claimed = []

    def deliver(n: int) -> None:
        try:
            start.wait()
            claimed.append(rollout_claim(rollout_id=rollout.id, worker=f"w{n}"))
        finally:
            connection.close()

    threads = [threading.Thread(target=deliver, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sum(1 for c in claimed if c is not None) == 1
    rollout.refresh_from_db()
    assert rollout.state == RolloutState.RUNNING and rollout.attempts == 1
