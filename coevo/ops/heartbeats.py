"""Worker liveness: a heartbeat row per worker, beaten by a daemon thread, and the Celery
signal handlers that start it (with the worker's metrics server) and stop it.

Connected when Django loads ``coevo.ops`` (``OpsConfig.ready``). ``worker_ready`` is sent only
by a real ``celery worker`` process (not by the in-thread test worker), so tests running a
worker in a thread write no heartbeat rows behind other tests' backs.

Liveness through the broker is the other half: ``coevo.ops.selectors.workers_pinging`` asks
every worker over the broker (``inspect().ping()``); the system page shows both.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from celery.signals import task_postrun, task_prerun, worker_ready, worker_shutdown

from coevo.logs import log_context_pop, log_context_push
from coevo.ops.metrics import worker_metrics_server_start, worker_metrics_server_stop
from coevo.ops.models import WorkerHeartbeat

logger = logging.getLogger(__name__)


def worker_heartbeat_record(
    *,
    hostname: str,
    pid: int,
    queues: list[str],
    concurrency: int,
    version: str,
    metrics_port: int | None = None,
    starting: bool = False,
) -> None:
    """Upsert the worker's row. ``starting`` resets started_at and clears stopped_at (a new
    run of that worker name); a plain beat only moves last_seen_at (and the run's details)."""
    from django.utils import timezone

    now = timezone.now()
    details = {
        "pid": pid,
        "queues": sorted(queues),
        "concurrency": concurrency,
        "version": version,
        "metrics_port": metrics_port,
        "last_seen_at": now,
    }
    if starting:
        details.update(started_at=now, stopped_at=None)
        WorkerHeartbeat.objects.update_or_create(hostname=hostname, defaults=details)
        return
    # A beat from a run the row no longer describes (a newer run took the name) does nothing.
    moved = WorkerHeartbeat.objects.filter(hostname=hostname, pid=pid).update(
        last_seen_at=now, stopped_at=None
    )
    if not moved:
        WorkerHeartbeat.objects.get_or_create(
            hostname=hostname, defaults={**details, "started_at": now}
        )


def worker_heartbeat_stop(*, hostname: str, pid: int) -> bool:
    """Mark the worker's run stopped (compare-and-swap on its pid); True when it was."""
    from django.utils import timezone

    now = timezone.now()
    return (
        WorkerHeartbeat.objects.filter(hostname=hostname, pid=pid, stopped_at__isnull=True).update(
            stopped_at=now, last_seen_at=now
        )
        == 1
    )


class HeartbeatThread:
    """Beats every ``interval_s`` until stopped. Each beat opens and closes its own database
    connection: a connection held by an idle daemon thread would outlive a database restart
    (or block a test database from being dropped)."""

    def __init__(self, *, interval_s: float, **identity: Any) -> None:
        self.interval_s = interval_s
        self.identity = identity
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="coevo-heartbeat")

    def start(self) -> None:
        self._beat(starting=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.interval_s + 5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._beat(starting=False)

    def _beat(self, *, starting: bool) -> None:
        from django.db import connection

        try:
            worker_heartbeat_record(**self.identity, starting=starting)
        except Exception:
            logger.exception("worker heartbeat failed (the database is unreachable?)")
        finally:
            connection.close()


_state: dict[str, Any] = {}
_state_lock = threading.Lock()


def coevo_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("coevo")
    except PackageNotFoundError:
        return "dev"


@worker_ready.connect
def _on_worker_ready(sender: Any = None, **_: Any) -> None:
    from django.conf import settings

    consumer = sender
    hostname = getattr(consumer, "hostname", None) or "worker"
    controller = getattr(consumer, "controller", None)
    try:
        queues = list(consumer.app.amqp.queues.consume_from.keys())
    except Exception:
        queues = []
    port = worker_metrics_server_start(
        port=settings.COEVO_WORKER_METRICS_PORT,
        tries=settings.COEVO_WORKER_METRICS_PORTS,
        addr=settings.COEVO_WORKER_METRICS_ADDR,
        token=settings.COEVO_METRICS_TOKEN,
        public=settings.COEVO_METRICS_PUBLIC,
    )
    thread = HeartbeatThread(
        interval_s=settings.COEVO_WORKER_HEARTBEAT_S,
        hostname=hostname,
        pid=os.getpid(),
        queues=queues,
        concurrency=int(getattr(controller, "concurrency", 0) or 0),
        version=coevo_version(),
        metrics_port=port,
    )
    with _state_lock:
        previous = _state.pop("thread", None)
        if previous is not None:
            previous.stop()
        thread.start()
        _state["thread"] = thread
    logger.info("worker %s: heartbeat every %ss", hostname, settings.COEVO_WORKER_HEARTBEAT_S)


@worker_shutdown.connect
def _on_worker_shutdown(**_: Any) -> None:
    from django.db import connection

    with _state_lock:
        thread = _state.pop("thread", None)
    if thread is None:  # a worker this module did not start (the in-thread test worker)
        return
    thread.stop()
    try:
        worker_heartbeat_stop(hostname=thread.identity["hostname"], pid=thread.identity["pid"])
    except Exception:
        logger.exception("could not mark worker %s stopped", thread.identity["hostname"])
    finally:
        connection.close()
    worker_metrics_server_stop()


_task_tokens: dict[str, Any] = {}


@task_prerun.connect
def _on_task_prerun(task: Any = None, task_id: str | None = None, **_: Any) -> None:
    # Pool threads are reused: what a task binds (log_bind) is undone when it ends, so ids do
    # not leak into the next task run on the same thread.
    hostname = getattr(getattr(task, "request", None), "hostname", None)
    if task_id:
        _task_tokens[task_id] = log_context_push(worker=hostname, task_id=task_id)


@task_postrun.connect
def _on_task_postrun(task_id: str | None = None, **_: Any) -> None:
    token = _task_tokens.pop(task_id, None) if task_id else None
    if token is not None:
        log_context_pop(token)
