"""Trace retention at scale: storage per step, and the time to prune a month of traces by
emptying its partition against deleting the same steps row by row.

1. A database is filled with ``python -m benchmarks.scale`` (``--scale``, seed 0: a year of a busy
   team from 2025-12-01, its steps in monthly partitions of the trace table).
2. Storage: the trace table's bytes (every partition: table, TOAST, indexes) per step.
3. The database is cloned (``CREATE DATABASE … TEMPLATE``). With the cut-off at the end of the
   fill's first month, so that month's partition is the one due:
   - ``partition``: ``traces_prune`` as beat runs it (the month's partition emptied, its kept
     steps written back; the tails of its evaluations in the next month deleted row by row);
   - ``rows``: the same evaluations' steps deleted row by row, in batches, as retention did
     before partitioning, then the ``VACUUM`` that makes their space reusable (it is never
     given back to the file system).
   Reported: wall time, steps, the trace table's size before and after.

    .venv/bin/python benchmarks/trace_retention.py                 # medium (~1/20 of full)
    .venv/bin/python benchmarks/trace_retention.py --scale full    # ~20 minutes of filling

PostgreSQL at 127.0.0.1:5432 (user postgres); the databases ``coevo_retention_<scale>`` and
``…_rows`` are dropped and created again.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
SERVER = "postgres://postgres@127.0.0.1:5432"
# The fill's year starts 2025-12-01: the cut-off at its first month's end.
CUTOFF = datetime(2026, 1, 1, tzinfo=UTC)


def psql(sql: str) -> None:
    subprocess.run(
        ["psql", "-h", "127.0.0.1", "-U", "postgres", "-q", "-v", "ON_ERROR_STOP=1", "-c", sql],
        check=True,
    )


def child(database: str, *args: str) -> str:
    """Run this script's ``--measure`` step (or manage.py, or the scale fill) against
    ``database``."""
    env = {**os.environ, "DATABASE_URL": f"{SERVER}/{database}"}
    done = subprocess.run(
        [sys.executable, *args], env=env, cwd=REPO, check=True, capture_output=True, text=True
    )
    return done.stdout


def trace_bytes(cursor) -> int:
    cursor.execute(
        "SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree('evaluations_tracestep')"
    )
    return int(cursor.fetchone()[0])


def measure(mode: str) -> dict:
    """In this process's database: prune the first month one way, with sizes around it."""
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "coevo.settings")
    django.setup()
    from django.db import connection

    from coevo.evaluations import retention, trace_partitions
    from coevo.evaluations.models import TraceStep

    days = 90
    now = CUTOFF + timedelta(days=days)
    with connection.cursor() as cursor:
        before = trace_bytes(cursor)
    steps_before = TraceStep.objects.count()
    started = time.monotonic()
    if mode == "partition":
        # Its ANALYZE of the whole table (once a month goes) is timed on its own below.
        analyze = trace_partitions.partitions_analyze
        trace_partitions.partitions_analyze = lambda: None
        report = retention.traces_prune(older_than_days=days, now=now)
        result = {"steps": report.steps, "evaluations": report.evaluations,
                  "partitions": list(report.partitions)}  # fmt: skip
        result["seconds"] = time.monotonic() - started
        began = time.monotonic()
        analyze()
        result["analyze_seconds"] = time.monotonic() - began
    else:
        candidates, _ = retention.prunable_evaluations(cutoff=CUTOFF)
        # Only the evaluations the partition run handles (created in the first month).
        candidates = candidates.filter(created_at__lt=CUTOFF)
        steps = evaluations = 0
        for evaluation_id in list(candidates.values_list("id", flat=True)):
            n, _b = retention._evaluation_prune(evaluation_id=evaluation_id, batch_size=2000)
            steps, evaluations = steps + n, evaluations + 1
        result = {"steps": steps, "evaluations": evaluations}
        result["seconds"] = time.monotonic() - started
    with connection.cursor() as cursor:
        result["bytes_after_prune"] = trace_bytes(cursor)
        if mode == "rows":
            began = time.monotonic()
            cursor.execute("VACUUM evaluations_tracestep")
            result["vacuum_seconds"] = time.monotonic() - began
            result["bytes_after_vacuum"] = trace_bytes(cursor)
    result.update(bytes_before=before, steps_before=steps_before,
                  steps_after=TraceStep.objects.count())  # fmt: skip
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", default="medium", choices=("small", "medium", "full"))
    parser.add_argument("--measure", choices=("partition", "rows"), help=argparse.SUPPRESS)
    parser.add_argument("--keep", action="store_true", help="reuse a filled database")
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure)))
        return

    base = f"coevo_retention_{args.scale}"
    clone = f"{base}_rows"
    print(f"trace retention benchmark: {args.scale}; {platform.machine()}, "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")  # fmt: skip
    if not args.keep:
        psql(f"DROP DATABASE IF EXISTS {base}")
        psql(f"CREATE DATABASE {base}")
        child(base, "manage.py", "migrate", "-v0")
        began = time.monotonic()
        child(base, "-m", "benchmarks.scale", "--project", args.scale, "--scale", args.scale)
        print(f"filled in {time.monotonic() - began:.0f} s")
        # What autovacuum would have done by the time a month is pruned, and the retention
        # job's ANALYZE of the partitioned table.
        child(base, "-c", "import os, django; os.environ.setdefault('DJANGO_SETTINGS_MODULE',"
              " 'coevo.settings'); django.setup(); from django.db import connection;"
              " connection.cursor().execute('ANALYZE')")  # fmt: skip
    psql(f"DROP DATABASE IF EXISTS {clone}")
    psql(f"CREATE DATABASE {clone} TEMPLATE {base}")
    stats = child(base, "-c", STATS)
    print(stats.strip())
    # Each clone is pruned once: partition on a second copy, so the filled one stays reusable.
    psql(f"DROP DATABASE IF EXISTS {base}_part")
    psql(f"CREATE DATABASE {base}_part TEMPLATE {base}")
    for mode, database in (("partition", f"{base}_part"), ("rows", clone)):
        result = json.loads(child(database, __file__, "--measure", mode))
        print(f"{mode}: {json.dumps(result)}")


STATS = """
import os, django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "coevo.settings")
django.setup()
from django.db import connection
with connection.cursor() as c:
    c.execute("SELECT count(*) FROM evaluations_tracestep")
    steps = c.fetchone()[0]
    c.execute("SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree('evaluations_tracestep')")
    size = int(c.fetchone()[0])
    c.execute("SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_inherits i"
              " JOIN pg_class c ON c.oid = i.inhrelid"
              " WHERE i.inhparent = 'evaluations_tracestep'::regclass ORDER BY 1")
    months = []
    for name, nbytes in c.fetchall():
        c.execute(f'SELECT count(*) FROM "{name}"')
        months.append((name, nbytes, c.fetchone()[0]))
print(f"trace steps {steps:,}, {size / 2**20:,.1f} MiB: {size / max(steps, 1):,.0f} bytes a step")
for name, nbytes, rows in months:
    if nbytes > 64 * 1024:
        print(f"  {name}: {nbytes / 2**20:,.1f} MiB, {rows:,} steps")
"""


if __name__ == "__main__":
    main()
