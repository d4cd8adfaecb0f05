"""Reads for operations: the figures behind /metrics and the system page."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import Count, Q, Sum
from django.utils import timezone

from coevo.celery import app
from coevo.enqueue import broker_queue_depths
from coevo.evaluations.models import (
    Budget,
    Evaluation,
    Rollout,
    TraceStep,
)
from coevo.ops.health import policy_probe
from coevo.ops.models import WorkerHeartbeat
from coevo.policies.concurrency import SlotsStatus
from coevo.policies.models import PolicyEndpoint
from coevo.policies.selectors import policy_endpoint_slots
from workers.outcomes import RolloutOutcome


def rollout_counts() -> list[dict[str, Any]]:
    """Rollout rows grouped by (state, outcome, error_kind), with ``n``."""
    return list(
        Rollout.objects.order_by()
        .values("state", "outcome", "error_kind")
        .annotate(n=Count("id"))
        .order_by("state", "outcome", "error_kind")
    )


def evaluation_counts() -> dict[str, int]:
    rows = Evaluation.objects.order_by().values("state").annotate(n=Count("id"))
    return {row["state"]: row["n"] for row in rows}


def queue_names() -> list[str]:
    return [queue.name for queue in settings.CELERY_TASK_QUEUES]


def queue_depths() -> dict[str, int | None]:
    """Messages waiting per declared queue; None for a queue the broker cannot count (or when
    the broker does not answer). One connection, with a short timeout."""
    return broker_queue_depths(queue_names(), timeout_s=settings.COEVO_READYZ_TIMEOUT_S)


def ledger_totals() -> list[dict[str, Any]]:
    """Spent and reserved amounts per project slug, over root budgets only: a budget with a
    parent (an evaluation's inside a campaign's) is already counted in its parent."""
    fields = [f"{kind}_{unit}" for kind in ("spent", "reserved") for unit in _LEDGER_UNITS]
    rows = (
        Budget.objects.filter(parent__isnull=True)
        .order_by()
        .values("project__slug")
        .annotate(**{f"total_{field}": Sum(field) for field in fields})
        .order_by("project__slug")
    )
    return [
        {"project": row["project__slug"], **{f: row[f"total_{f}"] or 0 for f in fields}}
        for row in rows
    ]


_LEDGER_UNITS = ("rollouts", "tokens", "wall_s")


@dataclass(frozen=True)
class WorkerStatus:
    hostname: str
    pid: int
    queues: list[str]
    concurrency: int
    version: str
    metrics_port: int | None
    started_at: datetime
    last_seen_at: datetime
    stopped_at: datetime | None
    age_s: float
    # alive: beat recently; stale: no beat for COEVO_WORKER_STALE_S (died, or cut off from the
    # database); stopped: shut down cleanly.
    state: str
    answers_ping: bool | None = None


def worker_heartbeats(*, pinging: set[str] | None = None) -> list[WorkerStatus]:
    """Every worker that ever beat, newest run first; ``pinging`` (hostnames answering over the
    broker) fills ``answers_ping``."""
    now = timezone.now()
    stale_after = settings.COEVO_WORKER_STALE_S
    result = []
    for row in WorkerHeartbeat.objects.order_by("-last_seen_at"):
        age = max(0.0, (now - row.last_seen_at).total_seconds())
        if row.stopped_at is not None:
            state = "stopped"
        elif age > stale_after:
            state = "stale"
        else:
            state = "alive"
        result.append(
            WorkerStatus(
                hostname=row.hostname,
                pid=row.pid,
                queues=list(row.queues or []),
                concurrency=row.concurrency,
                version=row.version,
                metrics_port=row.metrics_port,
                started_at=row.started_at,
                last_seen_at=row.last_seen_at,
                stopped_at=row.stopped_at,
                age_s=age,
                state=state,
                answers_ping=None if pinging is None else row.hostname in pinging,
            )
        )
    return result


def workers_pinging(*, timeout_s: float | None = None) -> set[str] | None:
    """Hostnames of the workers answering a broadcast ping over the broker within the timeout
    (it always waits the whole timeout: replies are collected until then); None when the broker
    cannot be reached."""
    timeout = settings.COEVO_SYSTEM_PING_TIMEOUT_S if timeout_s is None else timeout_s
    try:
        replies = app.control.inspect(timeout=timeout).ping() or {}
    except Exception:
        return None
    return set(replies)


@dataclass(frozen=True)
class EndpointStatus:
    name: str
    base_url: str
    reachable: bool
    latency_ms: int | None
    error: str
    versions: list[str]
    rollouts_last_hour: int
    policy_errors_last_hour: int
    slots: SlotsStatus


def policy_endpoints_status(*, timeout_s: float | None = None) -> list[EndpointStatus]:
    """Every registered endpoint probed (GET /v1/models), with its last hour of rollouts and
    the policy errors among them."""
    since = timezone.now() - timedelta(hours=1)
    recent = (
        Rollout.objects.filter(finished_at__gte=since)
        .order_by()
        .values("evaluation__policy_version__endpoint_id")
        .annotate(
            n=Count("id"),
            errors=Count("id", filter=Q(outcome=RolloutOutcome.INFRA_ERROR, error_kind="policy")),
        )
    )
    by_endpoint = {row["evaluation__policy_version__endpoint_id"]: row for row in recent}
    result = []
    for endpoint in PolicyEndpoint.objects.prefetch_related("versions").order_by("name"):
        versions = list(endpoint.versions.all())
        probe = policy_probe(endpoint=endpoint, version=versions[0] if versions else None,
                             timeout_s=timeout_s)  # fmt: skip
        stats = by_endpoint.get(endpoint.id, {})
        result.append(
            EndpointStatus(
                name=endpoint.name,
                base_url=endpoint.base_url,
                reachable=probe.ok,
                latency_ms=probe.ms if probe.ok else None,
                error=probe.error,
                versions=[v.name for v in versions],
                rollouts_last_hour=stats.get("n", 0),
                policy_errors_last_hour=stats.get("errors", 0),
                slots=policy_endpoint_slots(endpoint=endpoint),
            )
        )
    return result


_du_cache: dict[str, tuple[float, int | None]] = {}
_du_lock = threading.Lock()


def directory_size(path: str | Path, *, max_age_s: float = 60.0) -> int | None:
    """Bytes used by the files under ``path`` (None when it does not exist). Walking a big
    store takes a while, so a figure is reused for ``max_age_s``."""
    key = str(path)
    with _du_lock:
        cached = _du_cache.get(key)
        if cached is not None and time.monotonic() - cached[0] < max_age_s:
            return cached[1]
    total: int | None = None
    if os.path.isdir(key):
        total = 0
        for root, _dirs, files in os.walk(key):
            for name in files:
                # A file removed while walking (git gc) is skipped.
                with contextlib.suppress(OSError):
                    total += os.lstat(os.path.join(root, name)).st_blocks * 512
    with _du_lock:
        _du_cache[key] = (time.monotonic(), total)
    return total


def trace_storage_bytes() -> int | None:
    """On-disk size of the trace table with its indexes and TOAST, all its partitions
    (PostgreSQL); None elsewhere."""
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree(%s::regclass)",
            [TraceStep._meta.db_table],
        )
        row = cursor.fetchone()
    return int(row[0]) if row and row[0] is not None else None


def store_checks_latest() -> list[Any] | None:
    """The latest harness store check (fsck) per project, when the StoreCheck model exists
    (added by the maintenance work); None when it does not."""
    from django.apps import apps

    try:
        model = apps.get_model("harness_store", "StoreCheck")
    except LookupError:
        return None
    latest: dict[Any, Any] = {}
    try:
        # A savepoint: the model may be deployed before its migration ran.
        with transaction.atomic():
            checks = list(model.objects.select_related("project").order_by("-checked_at")[:500])
    except DatabaseError:
        return None
    for check in checks:
        latest.setdefault(check.project_id, check)
    return sorted(latest.values(), key=lambda c: c.project.slug)
