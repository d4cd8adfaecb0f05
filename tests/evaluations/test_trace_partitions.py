"""The trace table's monthly partitions (coevo.evaluations.trace_partitions) and retention over
them: a month whose whole range is past the cut-off is emptied at once (truncated, its kept steps
written back), what retention keeps survives it, and evaluations wait for their month.

The test database's partitions are the migration's on an empty table: this month and the next
two, and the default. These tests live in the future months (a step's month is its
``created_at``, moved there by an UPDATE) and prune with ``now`` far enough ahead."""

from __future__ import annotations

import importlib
import secrets
from datetime import datetime, timedelta
from types import SimpleNamespace

import pytest
from django.db import connection, transaction
from django.utils import timezone

from coevo.evaluations import trace_partitions
from coevo.evaluations.models import (
    Evaluation,
    EvaluationState,
    Rollout,
    RolloutState,
    TraceStep,
)
from coevo.evaluations.retention import protect_evaluations, traces_prune
from coevo.evaluations.trace_partitions import month_name, month_start
from coevo.evaluations.traces import TraceWriter, trace_page
from coevo.suites.models import Split
from tests.evaluations.test_retention import registry  # noqa: F401 (a fixture)
from tests.evaluations.test_traces import FakeStep
from workers.outcomes import RolloutOutcome

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="partitions are PostgreSQL's"),
]

NOW = timezone.now()
MONTH_A = month_start(NOW, months=1)  # a partition of its own from the migration
MONTH_B = month_start(NOW, months=2)
MONTH_C = month_start(NOW, months=3)
# Retention of 90 days run on this day prunes MONTH_A (wholly past the cut-off), not MONTH_B.
PRUNE_DAY = MONTH_B + timedelta(days=91)
# The months that run empties: this one (where the other tests' steps are) and MONTH_A.
DUE = (month_name(month_start(NOW)), month_name(MONTH_A))


@pytest.fixture
def make_evaluation(seed_candidate, humaneval_suite, policy_version):
    tasks = list(humaneval_suite.tasks.filter(split=Split.SEARCH).order_by("position")[:2])

    def make(
        *, created: datetime, ended: datetime | None, state=EvaluationState.FINISHED, steps=3
    ) -> Evaluation:
        evaluation = Evaluation.objects.create(
            project=seed_candidate.project,
            candidate=seed_candidate,
            policy_version=policy_version,
            suite=humaneval_suite,
            split=Split.SEARCH,
            state=state,
            finished_at=ended,
        )
        Evaluation.objects.filter(id=evaluation.id).update(created_at=created, updated_at=created)
        for task in tasks:
            rollout = Rollout.objects.create(
                evaluation=evaluation,
                task=task,
                seed=1,
                state=RolloutState.DONE,
                outcome=RolloutOutcome.PASSED,
                score=1.0,
                attempts=1,
            )
            with TraceWriter(rollout_id=rollout.id, attempt=1) as writer:
                for i in range(steps):
                    # Incompressible: the freed bytes show on disk.
                    pad = secrets.token_hex(1500)
                    writer.add(FakeStep("log", {"message": f"step {i}", "pad": pad}))
        # Written in their month: the UPDATE moves the rows into that month's partition.
        TraceStep.objects.filter(rollout__evaluation=evaluation).update(created_at=created)
        evaluation.refresh_from_db()
        return evaluation

    return make


@pytest.fixture
def rollout_with_steps(make_evaluation):
    evaluation = make_evaluation(created=NOW, ended=None, steps=2)
    rollout = evaluation.rollouts.order_by("task__position").first()
    ids = sorted(
        TraceStep.objects.filter(rollout__evaluation=evaluation).values_list("id", flat=True)
    )
    return rollout, ids


def steps_of(evaluation: Evaluation) -> int:
    return TraceStep.objects.filter(rollout__evaluation=evaluation).count()


def rows_in(table: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(f'SELECT count(*) FROM "{table}"')
        return cursor.fetchone()[0]


def by_name() -> dict[str, trace_partitions.TracePartition]:
    return {p.name: p for p in trace_partitions.partitions()}


def test_the_migration_partitions_the_trace_table_by_month():
    assert trace_partitions.partitioned()
    found = by_name()
    # An empty table at migration: no legacy partition.
    assert trace_partitions.LEGACY not in found
    for lo in (month_start(NOW), MONTH_A, MONTH_B):
        partition = found[month_name(lo)]
        assert partition.monthly and partition.lo == lo and not partition.pruned
    default = found[trace_partitions.DEFAULT]
    assert (default.lo, default.hi) == (None, None)


def test_the_migration_attaches_a_table_with_steps_as_it_is(rollout_with_steps):
    """Upgrading: the table with its rows becomes the legacy partition, nothing copied, and new
    steps carry on numbering after the last one."""
    migration = importlib.import_module("coevo.evaluations.migrations.0010_trace_partitions")
    rollout, ids = rollout_with_steps
    with transaction.atomic(), connection.cursor() as cursor:
        # The table as migration 0001 made it, with the rows, in a schema of its own.
        cursor.execute("CREATE SCHEMA coevo_upgrade")
        cursor.execute(
            "CREATE TABLE coevo_upgrade.evaluations_tracestep ("
            " id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, attempt smallint NOT NULL"
            " CHECK (attempt >= 0), index integer NOT NULL, kind varchar(32) NOT NULL,"
            " payload jsonb NOT NULL, prompt_tokens integer NOT NULL,"
            " completion_tokens integer NOT NULL, latency_ms integer NOT NULL,"
            " created_at timestamptz NOT NULL, rollout_id uuid NOT NULL"
            " REFERENCES evaluations_rollout (id) DEFERRABLE INITIALLY DEFERRED,"
            " payload_zlib bytea,"
            " CONSTRAINT trace_step_unique_index UNIQUE (rollout_id, attempt, index))"
        )
        cursor.execute(
            "INSERT INTO coevo_upgrade.evaluations_tracestep SELECT * FROM evaluations_tracestep"
        )
        cursor.execute("SET LOCAL search_path TO coevo_upgrade, public")
        # ALTER TABLE refuses a table with this transaction's foreign-key checks pending.
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        migration.partition(None, SimpleNamespace(connection=connection))

        cursor.execute(
            "SELECT relkind FROM pg_class WHERE oid = 'coevo_upgrade.evaluations_tracestep'::regclass"
        )
        assert cursor.fetchone()[0] == "p"
        cursor.execute("SELECT id FROM coevo_upgrade.evaluations_tracestep_legacy ORDER BY id")
        assert [row[0] for row in cursor.fetchall()] == ids
        cursor.execute(
            "INSERT INTO coevo_upgrade.evaluations_tracestep (attempt, index, kind, payload,"
            " prompt_tokens, completion_tokens, latency_ms, created_at, rollout_id)"
            " VALUES (2, 0, 'log', '{}', 0, 0, 0, now() + interval '40 days', %s) RETURNING id",
            [rollout.id],
        )
        assert cursor.fetchone()[0] == max(ids) + 1
        cursor.execute("SELECT count(*) FROM coevo_upgrade.evaluations_tracestep")
        assert cursor.fetchone()[0] == len(ids) + 1
        # Run again, it changes nothing.
        migration.partition(None, SimpleNamespace(connection=connection))
        transaction.set_rollback(True)


def test_ensure_creates_the_months_ahead_and_moves_strays_from_the_default(make_evaluation):
    month_d = month_start(NOW, months=4)
    stray = make_evaluation(created=month_d + timedelta(days=3), ended=None, steps=2)
    assert rows_in(trace_partitions.DEFAULT) == 4

    created = trace_partitions.partitions_ensure(now=month_d)
    assert created == [month_name(month_d), month_name(month_start(NOW, months=5)),
                       month_name(month_start(NOW, months=6))]  # fmt: skip
    assert rows_in(trace_partitions.DEFAULT) == 0 and rows_in(month_name(month_d)) == 4
    assert steps_of(stray) == 4
    assert trace_partitions.partitions_ensure(now=month_d) == []


def test_a_past_month_goes_at_once_and_what_retention_keeps_survives_it(
    make_evaluation,
    registry,  # noqa: F811
):
    old = make_evaluation(created=MONTH_A + timedelta(days=2), ended=MONTH_A + timedelta(days=3))
    protected = make_evaluation(
        created=MONTH_A + timedelta(days=4), ended=MONTH_A + timedelta(days=5)
    )
    running = make_evaluation(
        created=MONTH_A + timedelta(days=6), ended=None, state=EvaluationState.RUNNING
    )
    protect_evaluations(lambda: Evaluation.objects.filter(id=protected.id).values("id"))
    partition = month_name(MONTH_A)
    assert rows_in(partition) == 18

    report = traces_prune(older_than_days=90, now=PRUNE_DAY)

    assert report.partitions == DUE
    assert (report.evaluations, report.steps) == (1, 6) and report.bytes > 0
    assert "2 monthly partitions emptied" in report.describe()
    assert steps_of(old) == 0 and steps_of(protected) == 6 and steps_of(running) == 6
    assert rows_in(partition) == 12 and by_name()[partition].pruned
    old.refresh_from_db()
    assert old.traces_pruned_at is not None
    # The kept steps are whole and read as before.
    rollout = protected.rollouts.order_by("task__position").first()
    page = trace_page(rollout=rollout)
    assert [s.payload["message"] for s in page.steps] == ["step 0", "step 1", "step 2"]

    # Idempotent: the month is not emptied again (its kept steps stay), nothing more goes.
    again = traces_prune(older_than_days=90, now=PRUNE_DAY)
    assert (again.partitions, again.steps) == ((), 0) and rows_in(partition) == 12


def test_an_evaluation_waits_for_its_month_and_a_tail_in_a_later_month_goes_with_it(
    make_evaluation,
):
    # Ended before the cut-off, but its month (B) is not wholly past it: it waits.
    waiting = make_evaluation(
        created=MONTH_B + timedelta(days=1), ended=MONTH_B + timedelta(days=1)
    )
    # Created in A, its last steps in B: emptying A leaves a tail, deleted row by row.
    spanning = make_evaluation(
        created=MONTH_A + timedelta(days=27), ended=MONTH_B + timedelta(hours=1)
    )
    tail = spanning.rollouts.order_by("task__position").last()
    TraceStep.objects.filter(rollout=tail).update(created_at=MONTH_B + timedelta(minutes=5))

    report = traces_prune(older_than_days=90, now=PRUNE_DAY)
    assert report.partitions == DUE
    assert steps_of(spanning) == 0 and steps_of(waiting) == 6
    waiting.refresh_from_db()
    assert waiting.traces_pruned_at is None

    later = traces_prune(older_than_days=90, now=MONTH_C + timedelta(days=91))
    assert later.partitions == (month_name(MONTH_B),) and steps_of(waiting) == 0
    waiting.refresh_from_db()
    assert waiting.traces_pruned_at is not None


def test_the_dry_run_names_the_months_and_changes_nothing(make_evaluation):
    old = make_evaluation(created=MONTH_A + timedelta(days=2), ended=MONTH_A + timedelta(days=3))
    dry = traces_prune(older_than_days=90, now=PRUNE_DAY, dry_run=True)
    assert dry.partitions == DUE and (dry.evaluations, dry.steps) == (1, 6)
    assert "Would free 6 trace steps" in dry.describe()
    assert steps_of(old) == 6 and not by_name()[month_name(MONTH_A)].pruned


def test_a_sealed_held_out_run_behind_a_channel_keeps_its_traces(make_evaluation, seed_candidate):
    from coevo.reviews.services import channel_get_or_create, channel_move

    held_out = make_evaluation(
        created=MONTH_A + timedelta(days=2), ended=MONTH_A + timedelta(days=3)
    )
    Evaluation.objects.filter(id=held_out.id).update(split=Split.HELDOUT)
    channel = channel_get_or_create(project=seed_candidate.project, name="production")
    channel_move(channel=channel, candidate=seed_candidate, policy_version=None, moved_by=None)

    report = traces_prune(older_than_days=90, now=PRUNE_DAY)
    assert report.partitions == DUE and report.protected == 1
    assert steps_of(held_out) == 6


def test_a_second_run_while_one_holds_the_lock_does_nothing(make_evaluation):
    import psycopg

    old = make_evaluation(created=MONTH_A + timedelta(days=2), ended=MONTH_A + timedelta(days=3))
    settings_dict = connection.settings_dict
    other = psycopg.connect(
        host=settings_dict["HOST"], port=settings_dict["PORT"] or 5432,
        user=settings_dict["USER"], dbname=settings_dict["NAME"], autocommit=True,
    )  # fmt: skip
    try:
        other.execute("SELECT pg_advisory_lock(%s)", [trace_partitions._PRUNE_LOCK_KEY])
        report = traces_prune(older_than_days=90, now=PRUNE_DAY)
        assert (report.partitions, report.steps) == ((), 0) and steps_of(old) == 6
        # Released here, not by closing: the server drops a closed session's locks only once
        # its backend has exited, which a loaded machine may not have done by the next line.
        other.execute("SELECT pg_advisory_unlock(%s)", [trace_partitions._PRUNE_LOCK_KEY])
    finally:
        other.close()
    assert traces_prune(older_than_days=90, now=PRUNE_DAY).steps == 6
