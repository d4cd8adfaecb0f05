"""Worker heartbeats: the row a real ``celery worker`` process writes and beats, its answer to
a ping over the broker, its metrics port, and the row marked stopped on a clean shutdown."""

from __future__ import annotations

import socket
import time
from datetime import timedelta

import httpx
import pytest
from django.conf import settings
from django.utils import timezone

from coevo.ops.heartbeats import worker_heartbeat_record, worker_heartbeat_stop
from coevo.ops.models import WorkerHeartbeat
from coevo.ops.selectors import worker_heartbeats, workers_pinging
from tests.support.net import free_port
from tests.support.processes import WorkerProcess


def wait_for(predicate, *, timeout_s: float = 45, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.django_db(transaction=True)
def test_it_beats_from_a_real_worker_and_is_marked_stopped_on_shutdown(tmp_path):
    port = free_port()
    worker = WorkerProcess(
        name="hb",
        broker_url=settings.CELERY_BROKER_URL,
        log_dir=tmp_path,
        COEVO_WORKER_HEARTBEAT_S="1",
        COEVO_WORKER_METRICS_PORT=str(port),
        COEVO_WORKER_METRICS_ADDR="127.0.0.1",
        COEVO_METRICS_TOKEN="heartbeat-metrics-token",
    )
    try:
        row = wait_for(
            lambda: WorkerHeartbeat.objects.filter(hostname__startswith="hb@").first(),
            what="the worker's heartbeat row",
        )
        assert row.pid == worker.proc.pid
        assert set(row.queues) == {"rollouts", "default"}
        assert row.concurrency == settings.COEVO_WORKER_CONCURRENCY
        assert row.metrics_port == port and row.stopped_at is None
        first_seen = row.last_seen_at
        wait_for(
            lambda: WorkerHeartbeat.objects.get(id=row.id).last_seen_at > first_seen,
            what="a second beat",
        )
        (status,) = [w for w in worker_heartbeats() if w.hostname == row.hostname]
        assert status.state == "alive"
        # Liveness through the broker, too.
        assert row.hostname in wait_for(
            lambda: (workers_pinging(timeout_s=1.0) or set()) & {row.hostname},
            what="a ping answer",
        )
        body = httpx.get(
            f"http://127.0.0.1:{port}/metrics",
            headers={"Authorization": "Bearer heartbeat-metrics-token"},
            timeout=5,
        ).text
        assert "coevo_worker_rollouts_started_total" in body
    finally:
        worker.stop()
    assert worker.proc.returncode is not None
    row.refresh_from_db()
    assert row.stopped_at is not None, worker.log_tail()
    (status,) = [w for w in worker_heartbeats() if w.hostname == row.hostname]
    assert status.state == "stopped"


@pytest.mark.django_db
def test_it_reports_a_worker_that_stopped_beating_as_stale(settings):
    settings.COEVO_WORKER_STALE_S = 60
    identity = {"queues": ["rollouts"], "concurrency": 4, "version": "1"}
    worker_heartbeat_record(hostname="w@a", pid=10, starting=True, **identity)
    worker_heartbeat_record(hostname="w@b", pid=11, starting=True, **identity)
    WorkerHeartbeat.objects.filter(hostname="w@b").update(
        last_seen_at=timezone.now() - timedelta(seconds=61)
    )
    states = {w.hostname: w.state for w in worker_heartbeats()}
    assert states == {"w@a": "alive", "w@b": "stale"}


@pytest.mark.django_db
def test_it_lets_a_restarted_worker_take_over_its_row():
    identity = {"queues": ["rollouts"], "concurrency": 4, "version": "1"}
    worker_heartbeat_record(hostname="w@a", pid=10, starting=True, **identity)
    assert worker_heartbeat_stop(hostname="w@a", pid=10)
    worker_heartbeat_record(hostname="w@a", pid=20, starting=True, **identity)
    row = WorkerHeartbeat.objects.get(hostname="w@a")
    assert (row.pid, row.stopped_at) == (20, None)
    # The old run's late shutdown does not mark the new run stopped.
    assert not worker_heartbeat_stop(hostname="w@a", pid=10)
    assert WorkerHeartbeat.objects.get(hostname="w@a").stopped_at is None
    assert WorkerHeartbeat.objects.count() == 1


def free_port_pair() -> int:
    """A port P such that P and P + 1 are both free on 127.0.0.1 right now."""
    for _ in range(50):
        port = free_port()
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise AssertionError("no two consecutive free ports")


@pytest.mark.django_db(transaction=True)
def test_two_workers_on_one_host_with_one_metrics_setting_each_serve_metrics(tmp_path):
    port = free_port_pair()
    token = "two-workers-metrics-token"
    workers = [
        WorkerProcess(
            name=name,
            broker_url=settings.CELERY_BROKER_URL,
            log_dir=tmp_path,
            COEVO_WORKER_METRICS_PORT=str(port),
            COEVO_WORKER_METRICS_ADDR="127.0.0.1",
            COEVO_METRICS_TOKEN=token,
        )
        for name in ("mpa", "mpb")
    ]
    try:
        rows = wait_for(
            lambda: (
                (found := list(WorkerHeartbeat.objects.filter(hostname__startswith="mp")))
                and len(found) == 2
                and found
            ),
            timeout_s=90,
            what="both workers' heartbeat rows",
        )
        # The second to start took the next port instead of running without metrics.
        assert sorted(row.metrics_port or 0 for row in rows) == [port, port + 1], [
            w.log_tail() for w in workers
        ]
        for row in rows:
            scrape = httpx.get(
                f"http://127.0.0.1:{row.metrics_port}/metrics",
                headers={"Authorization": f"Bearer {token}"},
                timeout=5,
            )
            assert "coevo_worker_rollouts_started_total" in scrape.text
    finally:
        for worker in workers:
            worker.stop()
