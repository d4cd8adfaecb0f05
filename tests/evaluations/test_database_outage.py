"""A database outage loses no work (issue 40, item 4), on real processes and a PostgreSQL server
of the test's own, stopped and started under them: a rollout that has its result when the
database goes away writes it once it is back (one policy call, not two); a worker that cannot
reach the database holds the one message it took and takes no other (no consume-fail-ack); a
running rollout's heartbeat survives the outage; the evaluation finishes by itself.

The waits themselves (coevo/evaluations/dbwait.py) against a refused connection and a
connection the server ended are at the bottom.
"""

from __future__ import annotations

import os
import time

import pytest
from django.db import OperationalError, connection
from django.utils import timezone

from coevo.enqueue import queue_depth
from coevo.evaluations.dbwait import DatabaseUnavailable, database_retry
from coevo.evaluations.models import (
    EvaluationState,
    Rollout,
    RolloutState,
    TraceStep,
)
from coevo.evaluations.services import evaluation_create, rollout_execute
from coevo.policies.models import PolicyEndpoint
from coevo.suites.models import Split
from tests.conftest import wait_until_final
from tests.support.outages import connection_terminated, database_down
from tests.support.postgres import PostgresCluster, postgres_bin_dir
from workers.outcomes import RolloutOutcome

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

TASKS = 4


@pytest.fixture
def own_postgres():
    """A PostgreSQL server of this test's own (tests/support/postgres.py), started; the test
    calls ``take_over`` once its fixtures have written what it needs."""
    bin_dir = postgres_bin_dir()
    if bin_dir is None and not os.environ.get("CI"):  # under CI, a missing server fails
        pytest.skip(
            "needs PostgreSQL's server binaries (initdb, pg_ctl): apt-get install postgresql"
        )
    cluster = PostgresCluster(bin_dir)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


def waited(condition, *, timeout_s: float, what: str, required: bool = True) -> float:
    """Seconds until ``condition()`` held (polled every 0.2 s); after ``timeout_s`` fails, or
    with ``required=False`` goes on (a pace-setter, not what the test asserts)."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout_s:
            if not required:
                break
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.2)
    return time.monotonic() - started


def calls_for(policy, rollout: Rollout) -> int:
    """Completions the policy server was asked for this rollout's task."""
    prompt = rollout.task.inputs["prompt"]
    return sum(1 for request in policy.requests if prompt in str(request.get("prompt", "")))


def test_a_database_outage_loses_no_finished_rollout_and_no_queued_message(
    celery_processes,
    own_postgres,
    seed_candidate,
    humaneval_suite,
    policy_version,
    scripted_policy,
):
    PolicyEndpoint.objects.filter(id=policy_version.endpoint_id).update(max_concurrency=8)
    own_postgres.take_over()  # from here on, this process and every worker use that server
    scripted_policy.holding = True  # every completion waits for the test's release
    # As deployed: the watchdog on its own worker, beat sending it (every 5 s; heartbeats every
    # second in test processes), and a rollout worker, here of two threads.
    celery_processes.worker("ops", queues="ops")
    celery_processes.beat()
    first = celery_processes.worker("first", COEVO_WORKER_CONCURRENCY="2")
    evaluation = evaluation_create(
        candidate=seed_candidate,
        suite=humaneval_suite,
        split=Split.SEARCH,
        policy_version=policy_version,
        task_limit=TASKS,
        use_cache=False,
    )
    waited(
        lambda: scripted_policy.held_replies == 2, timeout_s=120, what="two rollouts' model calls"
    )
    assert queue_depth("rollouts") == TASKS - 2  # the other two wait in the queue

    own_postgres.stop()
    down_at = time.monotonic()
    # One rollout gets its completion now: it scores it and meets the outage when it records.
    scripted_policy.release(1)
    waited(lambda: scripted_policy.answered, timeout_s=30, what="the released completion")
    waited(
        lambda: "to write rollout" in first.log_path.read_text(errors="replace"),
        timeout_s=20,
        what="the released rollout to wait for the database with its result",
        required=False,
    )
    # A worker with a free thread comes up during the outage: it takes one message (prefetch
    # 1) and must hold it, not fail it at once, acknowledge it and take the next.
    second = celery_processes.worker("second", COEVO_WORKER_CONCURRENCY="1")
    waited(
        lambda: "ready." in second.log_path.read_text(errors="replace"),
        timeout_s=90,
        what="worker second",
    )
    waited(
        lambda: "to claim rollout" in second.log_path.read_text(errors="replace"),
        timeout_s=20,
        what="worker second to take a message",
        required=False,
    )
    time.sleep(3)  # what a worker that acknowledged the failure would take next, it takes now
    depth_during_outage = queue_depth("rollouts")
    # Down 20 s in all, as in the outage issue 40 measured (8 results lost, 36 messages dropped).
    time.sleep(max(0.0, 20 - (time.monotonic() - down_at)))

    own_postgres.start()
    print(f"\nthe database was down {time.monotonic() - down_at:.1f}s")
    connection.close()  # this process's connection died with the server too
    back = timezone.now()
    rollouts = list(Rollout.objects.filter(evaluation=evaluation).select_related("task"))
    answered = scripted_policy.answered[0]["prompt"]
    released = next(r for r in rollouts if r.task.inputs["prompt"] in answered)
    # The other one claimed before the outage is still held at its model call: its heartbeat
    # (coevo/evaluations/services/heartbeats.py) came back with the database.
    held = next(r for r in rollouts if r.started_at and r.started_at < back and r != released)
    waited(
        lambda: Rollout.objects.get(id=held.id).heartbeat_at > back,
        timeout_s=15,
        what="the heartbeat of the rollout still running",
    )
    scripted_policy.release_all()
    waited(
        lambda: Rollout.objects.get(id=released.id).state == RolloutState.DONE,
        timeout_s=90,
        what="the released rollout to be done",
    )
    wait_until_final(evaluation, timeout_s=120)
    released.refresh_from_db()
    evaluation.refresh_from_db()
    written_s = (released.finished_at - back).total_seconds()
    finished_s = (evaluation.finished_at - back).total_seconds()
    print(
        f"the finished rollout's result was written {written_s:.1f}s after the database was "
        f"back; the evaluation finished {finished_s:.1f}s after it; "
        f"{len(scripted_policy.requests)} policy calls for {TASKS} tasks; "
        f"{depth_during_outage} of {TASKS - 2} queued messages still queued during the outage"
    )

    # The result kept through the outage: written by its one attempt, with its one model call
    # and its whole trace (steps recorded while the database was down included).
    assert released.attempts == 1 and calls_for(scripted_policy, released) == 1, (
        f"attempts {released.attempts}, {calls_for(scripted_policy, released)} policy calls: "
        f"the result was lost and computed again ({released.detail})"
    )
    assert released.worker.startswith("first@") and released.model_calls == 1
    assert released.outcome in (RolloutOutcome.PASSED, RolloutOutcome.TASK_FAILURE), released.detail
    kinds = list(
        TraceStep.objects.filter(rollout=released).order_by("attempt", "index")
        .values_list("attempt", "kind")
    )  # fmt: skip
    assert [attempt for attempt, _ in kinds] == [1] * len(kinds)
    assert [kind for _, kind in kinds].count("model_call") == 1
    assert [kind for _, kind in kinds][-1] == "verdict"
    # Every task scored once, by its first attempt, with one policy call each: nothing ran
    # twice, nothing was dropped, nothing ended as an infra error.
    assert evaluation.state == EvaluationState.FINISHED, evaluation.state_detail
    rollouts = list(Rollout.objects.filter(evaluation=evaluation).select_related("task"))
    assert len(rollouts) == TASKS
    for each in rollouts:
        assert each.state == RolloutState.DONE and each.attempts == 1, (each.state, each.detail)
        assert each.outcome in (RolloutOutcome.PASSED, RolloutOutcome.TASK_FAILURE), each.detail
        assert calls_for(scripted_policy, each) == 1
    assert len(scripted_policy.requests) == TASKS
    # The two messages still queued at the outage: the worker that came up took one and held
    # it; the other stayed in the queue (none consumed, failed at once and acknowledged).
    assert depth_during_outage == TASKS - 3, (
        f"{depth_during_outage} messages left in the queue during the outage: the workers "
        "consumed (and dropped) what they could not run"
    )
    assert finished_s <= 30


# --- the waits --------------------------------------------------------------------------------


def test_a_rollout_whose_database_does_not_answer_is_given_up_for_a_retry_not_failed(
    empty_queue, settings, seed_candidate, humaneval_suite, policy_version
):
    evaluation = evaluation_create(
        candidate=seed_candidate,
        suite=humaneval_suite,
        split=Split.SEARCH,
        policy_version=policy_version,
        task_limit=1,
        use_cache=False,
    )
    rollout = Rollout.objects.get(evaluation=evaluation)
    started = time.monotonic()
    settings.COEVO_DB_OUTAGE_WAIT_S = 2
    with (
        database_down(),
        pytest.raises(DatabaseUnavailable, match="COEVO_DB_OUTAGE_WAIT_S is 2"),
    ):
        rollout_execute(rollout_id=rollout.id, worker="w@test")
    assert 2 <= time.monotonic() - started < 10  # it waited, and no longer than its bound
    rollout.refresh_from_db()
    assert rollout.state == RolloutState.PENDING and rollout.attempts == 0  # untouched


def test_a_connection_the_server_ended_is_replaced_and_the_call_made_again():
    calls = []

    def count_rollouts() -> int:
        calls.append(1)
        return Rollout.objects.count()

    with connection_terminated():
        assert database_retry(count_rollouts, what="count rollouts") == 0
    assert len(calls) == 2  # the first failed on the dead connection, the second reconnected


def test_an_error_that_is_not_an_outage_is_raised_at_once():
    calls = []

    def cancelled() -> None:
        calls.append(1)
        with connection.cursor() as cursor:
            cursor.execute("SET statement_timeout = 1; SELECT pg_sleep(1)")

    try:
        # A cancelled query is an OperationalError too (SQLSTATE 57014), but the server is up.
        with pytest.raises(OperationalError) as raised:
            database_retry(cancelled, what="sleep")
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET statement_timeout")
    assert raised.value.__cause__.sqlstate == "57014"
    assert len(calls) == 1
