"""Trace retention: delete the trace bodies of old evaluations, keep their results.

What goes: the TraceStep rows (model requests and responses, observations, logs: nearly all
of the database's bytes) of evaluations that are final and finished more than
COEVO_TRACE_RETENTION_DAYS ago. What stays: the evaluation, its stages and its Rollout rows
(outcome, score, error kind, tokens, latency, detail), so every score, comparison and chart
still works; ``Evaluation.traces_pruned_at`` records that the bodies are gone (the trace viewer
says so).

What is never pruned: evaluations of a *protected* candidate and *protected* evaluations.
Protection is a registry, so that each app that comes to reference candidates or evaluations
(promotion requests, trajectory exports, …) declares it where its models live::

    from coevo.evaluations.retention import protect_candidates

    @protect_candidates
    def _exported_candidates():
        # a queryset of candidate ids (None when the app has nothing to protect)
        return TrajectoryExport.objects.values("candidate_id")

Candidates on a channel (now or in its history) are registered by ``coevo.reviews``. Rollouts
that a protected evaluation reused from the cache keep their traces too: those traces are where the
protected evaluation's results came from.

On PostgreSQL the trace table is partitioned by month (``coevo.evaluations.trace_partitions``)
and a month goes at once: when a monthly partition's whole month is older than the cut-off, it
is truncated, with the steps retention keeps written back. An evaluation created in a month
whose partition is not pruned yet waits for it (so traces go at the end of the month in which
they turn COEVO_TRACE_RETENTION_DAYS old); the rest (the steps from before partitioning, steps
in the default partition, the tails of evaluations that span a month boundary) are deleted row
by row.

The row-by-row part deletes in batches, each its own short transaction, and marks an
evaluation pruned only once its last batch is gone: it is idempotent and safe to interrupt
(the next run finishes the job). Protection is checked again just before each evaluation is
pruned, and again inside each partition's transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count, F, Func, IntegerField, Q, QuerySet, Sum, TextField, Value
from django.db.models.functions import Cast, Coalesce
from django.utils import timezone

from coevo.evaluations import trace_partitions
from coevo.evaluations.models import EVALUATION_FINAL_STATES, Evaluation, Rollout, TraceStep

logger = logging.getLogger(__name__)

BATCH_SIZE = 2000

# Each returns a queryset of ids (``.values("…_id")`` of one column), or None.
ProtectedIds = Callable[[], QuerySet | None]
_protected_candidates: list[ProtectedIds] = []
_protected_evaluations: list[ProtectedIds] = []


def protect_candidates(fn: ProtectedIds) -> ProtectedIds:
    """Register a source of candidate ids whose evaluations retention must keep whole."""
    if fn not in _protected_candidates:
        _protected_candidates.append(fn)
    return fn


def protect_evaluations(fn: ProtectedIds) -> ProtectedIds:
    """Register a source of evaluation ids whose traces retention must keep."""
    if fn not in _protected_evaluations:
        _protected_evaluations.append(fn)
    return fn


def protected_evaluations() -> QuerySet[Evaluation]:
    """Evaluations retention keeps: of protected candidates, protected themselves, or the
    cache source of a rollout of either."""
    condition = Q(pk__in=[])
    for source in _protected_candidates:
        ids = source()
        if ids is not None:
            condition |= Q(candidate_id__in=_ids(ids))
    for source in _protected_evaluations:
        ids = source()
        if ids is not None:
            condition |= Q(id__in=_ids(ids))
    direct = Evaluation.objects.filter(condition)
    reused_sources = Rollout.objects.filter(
        evaluation__in=direct.values("id"), reused_from__isnull=False
    ).values("reused_from__evaluation_id")
    return Evaluation.objects.filter(Q(id__in=direct.values("id")) | Q(id__in=reused_sources))


def _ids(queryset: QuerySet) -> list[Any] | QuerySet:
    """The ids of a one-column queryset, without its NULLs (a nullable foreign key yields
    them; ``x NOT IN (…, NULL)`` is never true, so one NULL reaching a NOT IN would silently
    make everything prunable or nothing). A union cannot be filtered, so it is read into a
    list: protected ids are few."""
    if queryset.query.combinator:
        rows = (next(iter(row.values())) if isinstance(row, dict) else row for row in queryset)
        values = (row[0] if isinstance(row, tuple) else row for row in rows)
        return [value for value in values if value is not None]
    column = queryset.query.values_select[0] if queryset.query.values_select else "pk"
    return queryset.exclude(**{f"{column}__isnull": True})


@dataclass(frozen=True)
class PruneReport:
    dry_run: bool
    cutoff: datetime | None  # None: retention is off (COEVO_TRACE_RETENTION_DAYS=0)
    evaluations: int
    steps: int
    bytes: int
    protected: int  # old, final evaluations kept because something references them
    # Monthly partitions of the trace table emptied (PostgreSQL); their bytes are disk bytes.
    partitions: tuple[str, ...] = ()

    def describe(self) -> str:
        if self.cutoff is None:
            return "Trace retention is off (COEVO_TRACE_RETENTION_DAYS=0): nothing pruned."
        verb = "Would free" if self.dry_run else "Freed"
        months = (
            f" ({len(self.partitions)} monthly partitions emptied: {', '.join(self.partitions)})"
            if self.partitions
            else ""
        )
        return (
            f"{verb} {self.steps} trace steps ({_human_bytes(self.bytes)}) of "
            f"{self.evaluations} evaluations finished before {self.cutoff:%Y-%m-%d %H:%M} UTC"
            f"{months}; {self.protected} protected evaluations kept."
        )


def _human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


class _OctetLength(Func):
    """Bytes of a text or binary value (SQLite has no OCTET_LENGTH: measure it as a blob)."""

    function = "OCTET_LENGTH"
    output_field = IntegerField()

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        return self.as_sql(compiler, connection, template="LENGTH(CAST(%(expressions)s AS BLOB))")


def _step_sizes(steps: QuerySet[TraceStep]) -> tuple[int, int]:
    """(steps, bytes of their payloads: the JSON text plus the compressed body, if any)."""
    totals = steps.aggregate(
        n=Count("id"),
        size=Sum(
            _OctetLength(Cast("payload", TextField()))
            + Coalesce(_OctetLength(F("payload_zlib")), Value(0))
        ),
    )
    return totals["n"] or 0, totals["size"] or 0


def prunable_evaluations(
    *, cutoff: datetime, waiting: Sequence[trace_partitions.TracePartition] = ()
) -> tuple[QuerySet[Evaluation], int]:
    """(evaluations whose traces may go, how many old final ones are protected instead).

    An evaluation pruned, then resumed and finished again, is prunable again: its new
    rollouts' traces are newer than its ``traces_pruned_at``. One created in a ``waiting``
    (monthly, not yet pruned) partition's month waits for that partition to be emptied.
    """
    old = Evaluation.objects.annotate(ended_at=Coalesce("finished_at", "updated_at")).filter(
        Q(traces_pruned_at__isnull=True) | Q(traces_pruned_at__lt=F("ended_at")),
        state__in=EVALUATION_FINAL_STATES,
        ended_at__lt=cutoff,
    )
    for partition in waiting:
        old = old.exclude(created_at__gte=partition.lo, created_at__lt=partition.hi)
    protected = protected_evaluations().values("id")
    return old.exclude(id__in=protected), old.filter(id__in=protected).count()


def traces_prune(
    *,
    older_than_days: int | None = None,
    dry_run: bool = False,
    batch_size: int = BATCH_SIZE,
    now: datetime | None = None,
) -> PruneReport:
    """Delete (or, with ``dry_run``, measure) the trace steps retention lets go."""
    days = settings.COEVO_TRACE_RETENTION_DAYS if older_than_days is None else older_than_days
    if not dry_run:
        # Also with retention off: steps of a month without a partition would pile up in the
        # default partition.
        trace_partitions.partitions_ensure(now=now)
    if days <= 0:
        return PruneReport(dry_run, None, 0, 0, 0, 0)
    cutoff = (now or timezone.now()) - timedelta(days=days)
    monthly = [p for p in trace_partitions.partitions() if p.monthly and not p.pruned]
    due = [p for p in monthly if p.hi is not None and p.hi <= cutoff]
    waiting = [p for p in monthly if p not in due]
    names = tuple(p.name for p in due)
    if dry_run:
        candidates, protected = prunable_evaluations(cutoff=cutoff, waiting=waiting)
        steps, size = _step_sizes(TraceStep.objects.filter(rollout__evaluation__in=candidates))
        return PruneReport(True, cutoff, candidates.count(), steps, size, protected, names)
    evaluations = steps = size = 0
    with trace_partitions.prune_lock() as locked:
        if not locked:
            logger.warning("trace retention: another run holds the lock; this one does nothing")
            return PruneReport(False, cutoff, 0, 0, 0, 0)
        whole: list[Any] = []
        for partition in due:
            # Protection is read inside the partition's transaction (the subquery).
            emptied = trace_partitions.partition_prune(
                partition, prunable=prunable_evaluations(cutoff=cutoff)[0]
            )
            steps, size = steps + emptied.steps, size + emptied.bytes
            # Their steps are gone with the month: marked at once, no row-by-row look.
            whole.extend(emptied.whole)
            evaluations += _mark_pruned(emptied.whole)
        candidates, protected = prunable_evaluations(cutoff=cutoff, waiting=waiting)
        candidates = candidates.exclude(id__in=whole)
        for evaluation_id in list(candidates.values_list("id", flat=True)):
            # Checked again: a promotion or export may have come to reference it meanwhile.
            if not prunable_evaluations(cutoff=cutoff)[0].filter(id=evaluation_id).exists():
                continue
            n, b = _evaluation_prune(evaluation_id=evaluation_id, batch_size=batch_size)
            evaluations, steps, size = evaluations + 1, steps + n, size + b
        if due:
            # Monthly, when a month went: the planner's view of the whole table changed.
            trace_partitions.partitions_analyze()
    report = PruneReport(False, cutoff, evaluations, steps, size, protected, names)
    logger.info("trace retention: %s", report.describe())
    return report


def _mark_pruned(evaluation_ids: Sequence[Any]) -> int:
    """Record that these evaluations' trace bodies are gone; returns how many were marked.
    Compare-and-swap on the final state: a resumed evaluation keeps its new traces unmarked."""
    if not evaluation_ids:
        return 0
    return Evaluation.objects.filter(
        id__in=evaluation_ids, state__in=EVALUATION_FINAL_STATES
    ).update(traces_pruned_at=timezone.now())


def _evaluation_prune(*, evaluation_id: Any, batch_size: int) -> tuple[int, int]:
    """Delete one evaluation's trace steps in batches, then mark it pruned."""
    steps = size = 0
    # No ordering: the default one (rollout, then its task) joins the tasks and sorts for nothing.
    mine = TraceStep.objects.filter(rollout__evaluation_id=evaluation_id).order_by()
    while True:
        ids = list(mine.values_list("id", flat=True)[:batch_size])
        if not ids:
            break
        batch = TraceStep.objects.filter(id__in=ids)
        n, b = _step_sizes(batch)
        batch.delete()
        steps, size = steps + n, size + b
    _mark_pruned([evaluation_id])
    logger.info("evaluation %s: pruned %d trace steps (%d bytes)", evaluation_id, steps, size)
    return steps, size
