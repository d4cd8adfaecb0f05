"""A worker waits out a database outage with the work in hand, instead of failing it.

A rollout's database writes are few (its claim, trace batches, its finish) and its work is
expensive (policy calls, a sandbox): failing a rollout because PostgreSQL restarted throws
that work away, and failing its task acknowledges a message nobody ran. So a worker that
meets an outage waits, holding what it has, and carries on when the database answers again.

What an outage is comes from ``coevo.outages.outage_of``: the exception's type and
SQLSTATE, never its message. A deadlock or a cancelled query is not one, and is raised at
once as before.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import suppress
from typing import TypeVar

from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connection

from coevo.outages import Dependency, outage_of

logger = logging.getLogger(__name__)

T = TypeVar("T")

# The first pause, doubled up to the last. Capped at a few seconds so the work lands within
# seconds of the database's return: well inside the watchdog's grace after a restart
# (COEVO_ROLLOUT_STALE_S), so a rollout waiting here is never taken for a dead one.
FIRST_PAUSE_S = 0.5
MAX_PAUSE_S = 5.0


class DatabaseUnavailable(Exception):
    """The database did not answer for the whole wait: the caller gives the work up for now
    (a task retries later)."""


def database_down(exc: BaseException) -> bool:
    """Whether ``exc`` says PostgreSQL cannot be reached (refused, dropped, shutting down)."""
    return isinstance(exc, OperationalError | InterfaceError) and (
        outage_of(exc) is Dependency.DATABASE
    )


def database_connection_drop() -> None:
    """Close this thread's broken connection, so that the next query connects afresh."""
    # Closing a connection the server already dropped can fail too; it is gone either way.
    with suppress(DatabaseError):
        connection.close()


def database_retry(call: Callable[[], T], *, what: str, max_wait_s: float | None = None) -> T:
    """``call()``, called again while the database is down, with a growing pause in between,
    for at most ``max_wait_s`` (``COEVO_DB_OUTAGE_WAIT_S``); then DatabaseUnavailable.

    ``what`` ends "waiting for the database to …" in the log. ``call`` must be safe to call
    again after a connection lost in the middle of it (a compare-and-swap, a write that finds
    its own earlier landing). Inside a transaction nothing is retried: the transaction is
    lost with its connection, and only its owner can start it again.
    """
    bound_s = settings.COEVO_DB_OUTAGE_WAIT_S if max_wait_s is None else max_wait_s
    started = time.monotonic()
    pause = FIRST_PAUSE_S
    failures = 0
    while True:
        try:
            result = call()
        except (OperationalError, InterfaceError) as exc:
            if not database_down(exc) or connection.in_atomic_block:
                raise
            database_connection_drop()
            waited = time.monotonic() - started
            if waited >= bound_s:
                raise DatabaseUnavailable(
                    f"the database did not answer for {waited:.0f}s (COEVO_DB_OUTAGE_WAIT_S is "
                    f"{bound_s:g}) while waiting to {what}: {type(exc).__name__}"
                ) from exc
            if failures == 0:
                logger.warning(
                    "the database is unreachable (%s: %s); waiting for it (at most %gs) to %s",
                    type(exc).__name__,
                    (str(exc).strip().splitlines() or [""])[0][:200],
                    bound_s,
                    what,
                )
            failures += 1
            time.sleep(min(pause, max(bound_s - waited, 0.0)))
            pause = min(pause * 2, MAX_PAUSE_S)
            continue
        if failures:
            logger.warning(
                "the database answered again after %.1fs; went on to %s",
                time.monotonic() - started,
                what,
            )
        return result
