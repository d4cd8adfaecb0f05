"""A worker keeps its database connection from one task to the next (Celery's Django fixup
would close it around every task: one new PostgreSQL connection per rollout), and still
replaces one that is past CONN_MAX_AGE, as Django does between requests."""

from __future__ import annotations

import time

import pytest
from django.db import connection

from coevo.celery import app

pytestmark = pytest.mark.django_db(transaction=True)

SEEN: list[
    object
] = []  # the driver's connection each task ran on (kept alive: compared by identity)


@app.task(name="tests.ops.connection_used")
def connection_used(expire: bool = False) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    SEEN.append(connection.connection)
    if expire:  # as if CONN_MAX_AGE had passed since it connected
        connection.close_at = time.monotonic() - 1


def _run(**kwargs) -> object:
    before = len(SEEN)
    connection_used.delay(**kwargs)
    deadline = time.monotonic() + 30
    while len(SEEN) == before:
        assert time.monotonic() < deadline, "the worker did not run the task"
        time.sleep(0.05)
    return SEEN[-1]


def test_a_worker_reuses_its_connection_across_tasks(celery_worker_thread, settings):
    first = _run()
    assert _run() is first
    assert _run(expire=True) is first  # used until the task ended...
    assert _run() is not first  # ...then replaced before the next one
