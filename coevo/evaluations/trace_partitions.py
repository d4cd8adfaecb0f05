"""The trace table's monthly partitions (PostgreSQL): how a month of traces goes in one step.

Trace steps are nearly all of the database's bytes, and deleting them row by row is slow and
leaves dead tuples for VACUUM. On PostgreSQL the table is partitioned by range of the steps'
``created_at`` (migration evaluations 0010), one partition a month, named ``…_y2026m12``:

- ``…_legacy``: the rows from before the migration, ``FROM (MINVALUE)`` to the first month
  boundary after it (attached, not copied: upgrading rewrites nothing);
- one partition a month, created ``MONTHS_AHEAD`` months ahead by ``partitions_ensure`` (the
  daily retention job runs it, also with retention off);
- ``…_default``: a step whose month has no partition (the job did not run for months) lands
  here rather than failing; ``partitions_ensure`` moves such rows into the month it creates.

Retention (``coevo.evaluations.retention``) empties a monthly partition once its whole month is
older than the cut-off: the steps it must keep (of protected, unfinished or recently ended
evaluations) are copied aside, the partition is truncated (its disk space is freed at once, no
dead tuples) and they are written back; the partition is then marked pruned with a comment.
Only steps outside the monthly partitions (legacy, default) and the stragglers of evaluations
that span a month boundary are deleted row by row.

Uniqueness of (rollout, attempt, index) is enforced per ``created_at`` (PostgreSQL requires
the partition key in every unique index): the writer numbers steps itself and never writes one
twice, so the constraint was a safety net; the index still serves every trace read.

Elsewhere (SQLite, the embedded default) the table is a plain table and everything here is a
no-op: ``partitioned()`` is False.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db import connection, transaction
from django.db.models import QuerySet
from django.utils import timezone

from coevo.evaluations.models import Evaluation, Rollout, TraceStep

logger = logging.getLogger(__name__)

TABLE = TraceStep._meta.db_table
LEGACY = f"{TABLE}_legacy"
DEFAULT = f"{TABLE}_default"
MONTHS_AHEAD = 2
PRUNED_COMMENT = "coevo: pruned"
# How long a prune waits for a lock on a partition before giving up until its next run: a lock
# request that waits blocks every later reader of that partition behind it.
LOCK_TIMEOUT = "10s"

_BOUND = re.compile(r"FOR VALUES FROM \((MINVALUE|'[^']+')\) TO \((MAXVALUE|'[^']+')\)")


@dataclass(frozen=True)
class TracePartition:
    name: str
    lo: datetime | None  # None: unbounded below (the legacy partition) or the default
    hi: datetime | None  # None: the default partition
    pruned: bool

    @property
    def monthly(self) -> bool:
        return self.lo is not None and self.hi is not None


def partitioned() -> bool:
    """Whether the trace table is partitioned (PostgreSQL after migration evaluations 0010)."""
    if connection.vendor != "postgresql":
        return False
    with connection.cursor() as cursor:
        cursor.execute("SELECT relkind FROM pg_class WHERE oid = %s::regclass", [TABLE])
        row = cursor.fetchone()
    return row is not None and row[0] == "p"


def partitions() -> list[TracePartition]:
    """The trace table's partitions, oldest first (the default partition last)."""
    if not partitioned():
        return []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid), obj_description(c.oid)"
            " FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = %s::regclass",
            [TABLE],
        )
        rows = cursor.fetchall()
    found = []
    for name, bound, comment in rows:
        pruned = (comment or "").startswith(PRUNED_COMMENT)
        if bound == "DEFAULT":
            found.append(TracePartition(name, None, None, pruned))
            continue
        match = _BOUND.fullmatch(bound)
        if match is None:
            raise ValueError(f"trace partition {name}: unexpected bound {bound!r}")
        found.append(TracePartition(name, _bound(match[1]), _bound(match[2]), pruned))
    # The default partition (no bound) sorts last.
    return sorted(found, key=lambda p: (p.hi is None, p.hi or datetime.max.replace(tzinfo=UTC)))


def _bound(text: str) -> datetime | None:
    if text in ("MINVALUE", "MAXVALUE"):
        return None
    return datetime.fromisoformat(text.strip("'")).astimezone(UTC)


def month_start(moment: datetime, *, months: int = 0) -> datetime:
    """The first instant (UTC) of ``moment``'s month, ``months`` months on."""
    utc = moment.astimezone(UTC)
    index = utc.year * 12 + utc.month - 1 + months
    return datetime(index // 12, index % 12 + 1, 1, tzinfo=UTC)


def month_name(lo: datetime) -> str:
    return f"{TABLE}_y{lo.year:04d}m{lo.month:02d}"


def partitions_ensure(
    *,
    now: datetime | None = None,
    months_ahead: int = MONTHS_AHEAD,
    since: datetime | None = None,
) -> list[str]:
    """Create the monthly partitions from ``now``'s month (or ``since``'s, to write steps of
    the past, as the benchmarks' scale fill does) to ``months_ahead`` months on, those a legacy
    partition does not cover; returns the names created. Steps of such a month that fell into the
    default partition move into the new one."""
    if not partitioned():
        return []
    now = now or timezone.now()
    existing = partitions()
    legacy_hi = max((p.hi for p in existing if p.lo is None and p.hi is not None), default=None)
    names = {p.name for p in existing}
    created = []
    first = month_start(min(since, now) if since is not None else now)
    last = month_start(now, months=months_ahead)
    while first <= last:
        lo, hi = first, month_start(first, months=1)
        first = hi
        if month_name(lo) in names or (legacy_hi is not None and lo < legacy_hi):
            continue
        _partition_create(lo, hi, has_default=DEFAULT in names)
        created.append(month_name(lo))
        logger.info("trace table: partition %s created", month_name(lo))
    return created


def _partition_create(lo: datetime, hi: datetime, *, has_default: bool) -> None:
    name = month_name(lo)
    with transaction.atomic(), connection.cursor() as cursor:
        moved = 0
        if has_default:
            # Attaching the range scans the default partition for rows of it: hold it still.
            cursor.execute(f'LOCK TABLE "{DEFAULT}" IN ACCESS EXCLUSIVE MODE')
            cursor.execute(
                f'SELECT count(*) FROM "{DEFAULT}" WHERE created_at >= %s AND created_at < %s',
                [lo, hi],
            )
            moved = cursor.fetchone()[0]
            if moved:
                cursor.execute(
                    f'CREATE TEMP TABLE coevo_moved ON COMMIT DROP AS SELECT * FROM "{DEFAULT}"'
                    " WHERE created_at >= %s AND created_at < %s",
                    [lo, hi],
                )
                cursor.execute(
                    f'DELETE FROM "{DEFAULT}" WHERE created_at >= %s AND created_at < %s', [lo, hi]
                )
        cursor.execute(
            f'CREATE TABLE "{name}" PARTITION OF "{TABLE}" FOR VALUES FROM (%s) TO (%s)', [lo, hi]
        )
        if moved:
            cursor.execute(f'INSERT INTO "{name}" SELECT * FROM coevo_moved')
            cursor.execute("DROP TABLE coevo_moved")
            logger.warning(
                "trace table: %d steps moved from the default partition into %s", moved, name
            )


def partitions_analyze() -> None:
    """ANALYZE the trace table as a whole. Autovacuum analyzes each partition but never a
    partitioned table itself, and without its statistics the planner guesses at every join
    from rollouts to steps (measured: a hash join over every partition, 10× slower)."""
    if partitioned():
        with connection.cursor() as cursor:
            cursor.execute(f'ANALYZE "{TABLE}"')


# pg_try_advisory_lock key of the retention run: two runs at once would deadlock on a partition.
_PRUNE_LOCK_KEY = 0x636F65766F5452  # "coevoTR"


@contextmanager
def prune_lock() -> Iterator[bool]:
    """Hold the retention run's lock (PostgreSQL: a session advisory lock); yields whether this
    run got it. Elsewhere there is nothing to hold."""
    if connection.vendor != "postgresql":
        yield True
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [_PRUNE_LOCK_KEY])
        locked = cursor.fetchone()[0]
    try:
        yield locked
    finally:
        if locked:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [_PRUNE_LOCK_KEY])


@dataclass(frozen=True)
class PartitionPrune:
    steps: int  # steps removed
    bytes: int  # disk bytes freed (table, TOAST and indexes)
    kept: int  # steps written back (of evaluations retention keeps)
    # Prunable evaluations that began and ended within the month: every step of theirs was here.
    whole: tuple[Any, ...] = ()


def partition_prune(partition: TracePartition, *, prunable: QuerySet[Evaluation]) -> PartitionPrune:
    """Empty one monthly partition of every step of a ``prunable`` evaluation (a queryset
    annotated with ``ended_at``, as retention's), keeping the rest, and mark it pruned. One transaction: writers to this partition (none but deletes: steps are
    written in the month they happen) wait from the start, readers only while it is truncated."""
    if not partition.monthly:
        raise ValueError(f"{partition.name} is not a monthly partition")
    name = partition.name
    going_sql, going_params = prunable.values("id").query.sql_with_params()
    rollouts = Rollout._meta.db_table
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        cursor.execute("SET LOCAL work_mem = '256MB'")
        # TRUNCATE refuses a table with deferred foreign-key checks pending in this transaction
        # (only when called inside a larger one): run them now, and defer again at the end.
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute(f'LOCK TABLE "{name}" IN SHARE MODE')
        cursor.execute("SELECT pg_total_relation_size(%s::regclass)", [name])
        size_before = cursor.fetchone()[0]
        cursor.execute(f'SELECT count(*) FROM "{name}"')
        before = cursor.fetchone()[0]
        cursor.execute(
            # An anti-join (NOT IN over a large subquery would not be hashed).
            f'CREATE TEMP TABLE coevo_kept ON COMMIT DROP AS SELECT s.* FROM "{name}" s'
            f' JOIN "{rollouts}" r ON r.id = s.rollout_id'
            f" WHERE NOT EXISTS (SELECT 1 FROM ({going_sql}) g WHERE g.id = r.evaluation_id)",
            going_params,
        )
        kept = cursor.rowcount
        whole = tuple(
            prunable.filter(
                created_at__gte=partition.lo, created_at__lt=partition.hi, ended_at__lt=partition.hi
            ).values_list("id", flat=True)
        )
        cursor.execute(f'LOCK TABLE "{name}" IN ACCESS EXCLUSIVE MODE')
        cursor.execute(f'TRUNCATE "{name}"')
        cursor.execute(f'INSERT INTO "{name}" SELECT * FROM coevo_kept')
        # Dropped now, not at commit: inside an outer transaction a second prune would meet it.
        cursor.execute("DROP TABLE coevo_kept")
        cursor.execute("SET CONSTRAINTS ALL DEFERRED")
        stamp = timezone.now().strftime("%Y-%m-%d %H:%M")
        cursor.execute(f"COMMENT ON TABLE \"{name}\" IS '{PRUNED_COMMENT} {stamp} UTC'")
        cursor.execute("SELECT pg_total_relation_size(%s::regclass)", [name])
        size_after = cursor.fetchone()[0]
    result = PartitionPrune(before - kept, max(size_before - size_after, 0), kept, whole)
    logger.info(
        "trace table: partition %s pruned: %d steps removed, %d kept, %d bytes freed",
        name,
        result.steps,
        result.kept,
        result.bytes,
    )
    return result
