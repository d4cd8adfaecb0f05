"""A dependency that is down (PostgreSQL, Redis, the broker) is a 503 with ``Retry-After``,
never a 500.

``outage_of`` is the one classification: it tells "the server could not reach a dependency"
apart from a bug, from the exception's type and, for PostgreSQL, its SQLSTATE (never from its
message). Two places translate it, each for its own kind of response: ``OutageMiddleware``
for pages (a small page that touches nothing: no session, no user, no database) and the API's
exception handler (``coevo.api.exceptions``: its JSON error). Both log the outage at WARNING
through ``outage_warning``, at most once a minute per dependency and process: an outage hits
every request, and a traceback per request would bury whatever else the log says.

What a client is told names the dependency and nothing more: no traceback, no host, no URL.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from enum import StrEnum

import psycopg
import redis
from django.db import InterfaceError
from django.db import OperationalError as DatabaseOperationalError
from django.http import HttpRequest, HttpResponse
from django.template.loader import render_to_string
from kombu.exceptions import OperationalError as BrokerOperationalError

logger = logging.getLogger(__name__)

# Seconds a client is asked to wait. Short: the outages this covers (a restart, a failover)
# last seconds, and a load balancer or CI client retries sooner than a person would.
RETRY_AFTER_S = 5

# At most one warning per dependency this often (per process); the next one counts the rest.
WARN_EVERY_S = 60.0


class Dependency(StrEnum):
    DATABASE = "database"
    # The Redis at COEVO_REDIS_URL, spoken to directly: the cache (API rate limits, login
    # throttle) and the policy slots. Usually the broker's server too, but reached otherwise.
    REDIS = "redis"
    BROKER = "broker"


_MESSAGES = {
    Dependency.DATABASE: "The database is unavailable right now",
    Dependency.REDIS: "Redis (the cache) is unavailable right now",
    Dependency.BROKER: "The task broker is unavailable right now, so no work can be queued",
}

# PostgreSQL's SQLSTATEs for "this connection is gone or cannot be made": class 08
# (connection exception) and the server shutting down or starting up. Other class 57 codes
# (57014 query_canceled) and 40P01 (deadlock) are OperationalErrors too, but not outages.
_CONNECTION_LOST = frozenset({"57P01", "57P02", "57P03"})


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """The exception, then what it was raised from or while handling, outermost first."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _database_down(exc: BaseException) -> bool:
    if isinstance(exc, InterfaceError):
        return True  # Django's or psycopg's "connection already closed"
    if not isinstance(exc, DatabaseOperationalError):
        return False
    cause = exc.__cause__
    if not isinstance(cause, psycopg.OperationalError):
        return False  # SQLite's "database is locked", or anything not from psycopg
    # No SQLSTATE: the client failed (connection refused, server closed the connection).
    state = cause.sqlstate
    return state is None or state.startswith("08") or state in _CONNECTION_LOST


def outage_of(exc: BaseException) -> Dependency | None:
    """The dependency whose unavailability raised ``exc``, or None when ``exc`` is not an
    outage (a bug, bad input, a query PostgreSQL refused)."""
    for link in _chain(exc):
        if _database_down(link):
            return Dependency.DATABASE
        # kombu raises its OperationalError from the transport's own error: the broker.
        if isinstance(link, BrokerOperationalError):
            return Dependency.BROKER
        # ConnectionError covers a refused or dropped connection and a Redis still loading
        # its data (BusyLoadingError); TimeoutError, one that stopped answering.
        if isinstance(link, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)):
            return Dependency.REDIS
    return None


def outage_message(dependency: Dependency) -> str:
    """What a client is told: which dependency, and when to try again."""
    return f"{_MESSAGES[dependency]}; try again in {RETRY_AFTER_S} seconds."


class _Warnings:
    """Per key, one warning every ``WARN_EVERY_S``; the ones in between are counted."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def due(self, key: str) -> int | None:
        """None while ``key`` was warned about recently; else how many were held back."""
        now = time.monotonic()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < WARN_EVERY_S:
                self._held[key] = self._held.get(key, 0) + 1
                return None
            self._last[key] = now
            return self._held.pop(key, 0)


_warnings = _Warnings()


def outage_warning(
    dependency: Dependency, what: str, exc: BaseException, *, example: str = ""
) -> None:
    """Log that ``what`` happens because ``dependency`` is down, at most once a minute per
    dependency and ``what`` (a constant phrase: "pages answer 503"); ``example`` names the
    request that hit it this time. The exception is named in one line (the log filter masks
    credentials)."""
    held = _warnings.due(f"{dependency}:{what}")
    if held is None:
        return
    first_line = (str(exc).strip().splitlines() or [""])[0][:300]
    logger.warning(
        "%s unavailable: %s (%s: %s)%s%s",
        dependency,
        what,
        type(exc).__name__,
        first_line,
        f", e.g. {example}" if example else "",
        f"; {held} more since the last warning" if held else "",
    )


def mark_logged(response: HttpResponse) -> HttpResponse:
    """Keep Django's request logger from logging this 503 at ERROR once per request (its
    documented flag for a response already logged): ``outage_warning`` logged it."""
    response._has_been_logged = True  # type: ignore[attr-defined]
    return response


def outage_page(dependency: Dependency) -> HttpResponse:
    """The dashboard's 503: a page rendered without the request (no context processors, so
    no session, user or database is touched while the database may be the thing down)."""
    body = render_to_string("outage.html", {"message": outage_message(dependency)})
    response = HttpResponse(body, status=503)
    response["Retry-After"] = str(RETRY_AFTER_S)
    return mark_logged(response)


class OutageMiddleware:
    """Pages (and every other view outside the API) answer 503 instead of 500 while a
    dependency is down. Last in MIDDLEWARE, so its ``process_exception`` is asked first."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        dependency = outage_of(exception)
        if dependency is None:
            return None  # a bug: Django's 500, logged with its traceback
        outage_warning(
            dependency, "pages answer 503", exception, example=f"{request.method} {request.path}"
        )
        return outage_page(dependency)
