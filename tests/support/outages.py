"""Dependencies made unavailable for real, within one test: PostgreSQL, Redis (the cache) and
the broker pointed at a port nothing listens on, or a live PostgreSQL connection terminated by
the server. Each puts everything back when it ends."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from django.db import connections

from coevo.celery import app
from tests.support.net import free_port


def closed_url(scheme: str = "redis") -> str:
    """A URL of ``scheme`` on a local port nothing listens on (connections are refused)."""
    return f"{scheme}://127.0.0.1:{free_port()}/0"


def cache_down(settings) -> None:
    """The default cache on a Redis that refuses connections (``settings``: pytest-django's
    fixture, which puts CACHES back after the test)."""
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": closed_url(),
        }
    }


@contextmanager
def database_down(alias: str = "default") -> Iterator[None]:
    """This thread's connection of ``alias`` pointed at a closed port, as when PostgreSQL is
    stopped: every query raises the OperationalError psycopg raises for a refused connection.
    Needs a test without a wrapping transaction (``transactional_db``)."""
    connection = connections[alias]
    original = connection.settings_dict
    connection.close()
    # Only this wrapper's copy: other threads' connections keep the real port.
    connection.settings_dict = {**original, "HOST": "127.0.0.1", "PORT": str(free_port())}
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict = original


@contextmanager
def connection_terminated(alias: str = "default") -> Iterator[None]:
    """Have PostgreSQL end this thread's open connection of ``alias`` (as a server restart or
    a failover does): its next query fails. Whatever the test did, the broken connection is
    closed at the end, so the next test connects afresh."""
    connection = connections[alias]
    connection.ensure_connection()
    backend_pid = connection.connection.info.backend_pid
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    with psycopg.connect(**params, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [backend_pid])
    try:
        yield
    finally:
        connection.close()


def _drop_broker_pools() -> None:
    # Connections already open keep their URL: the next send must open one from the setting.
    app._pool = None
    app.amqp._producer_pool = None


@contextmanager
def broker_down() -> Iterator[str]:
    """coevo's Celery app sends to a broker that refuses connections (yields its URL)."""
    url = closed_url()
    previous = os.environ.get("CELERY_BROKER_WRITE_URL")
    # Celery reads the environment before its settings for this one.
    os.environ["CELERY_BROKER_WRITE_URL"] = url
    _drop_broker_pools()
    try:
        yield url
    finally:
        if previous is None:
            os.environ.pop("CELERY_BROKER_WRITE_URL", None)
        else:
            os.environ["CELERY_BROKER_WRITE_URL"] = previous
        _drop_broker_pools()
