"""A worker keeps its database connection from one task to the next (Celery's Django fixup
would close it around every task: one new PostgreSQL connection per rollout), and still
replaces one that is past CONN_MAX_AGE, as Django does between requests."""

from __future__ import annotations

import time

import pytest
from django.db import connection

from coevo.celery import app

pytestmark = pytest.mark.django_db(transaction=True)

SEEN: list[int] = []


@app.task(name="tests.ops.backend_pid")
def backend_pid(expire: bool = False) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        SEEN.append(cursor.fetchone()[0])
    if expire:  # as if CONN_MAX_AGE had passed since it connected
        connection.close_at = time.monotonic() - 1


def _run(**kwargs) -> int:
    before = len(SEEN)
    backend_pid.delay(**kwargs)
    deadline = time.monotonic() + 30
    while len(SEEN) == before:
        assert time.monotonic() < deadline, "the worker did not run the task"
        time.sleep(0.05)
    return SEEN[-1]


def test_a_worker_reuses_its_connection_across_tasks(celery_worker_thread, settings):
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL backend ids")
    first = _run()
    assert _run() == first
    assert _run(expire=True) == first  # used until the task ended...
    assert _run() != first  # ...then replaced before the next one
