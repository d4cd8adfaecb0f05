"""Sending Celery tasks by name: the one way services put work on the broker.

A service never imports a task module (tasks sit above services: they take ids and call a
service). It sends the task by its registered name instead, through :func:`task_enqueue`,
which also does what every caller needs: wait for the caller's transaction to commit when
asked, save the task id, and turn a broker that is down into a warning (each caller has a
watchdog or beat job that sends the work again later), never into a failed request.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery import current_app
from django.db import transaction
from kombu.exceptions import OperationalError

logger = logging.getLogger(__name__)


def task_enqueue(
    name: str,
    *args: str,
    queue: str,
    what: str,
    later: str = "beat sends it again",
    on_commit: bool = False,
    record: Callable[[str], None] | None = None,
    **options: Any,
) -> bool:
    """Send the task registered as ``name`` with ``args`` to ``queue``.

    ``what`` names the work in the warning logged when the broker refuses it ("rollout
    <id>"), and ``later`` says who sends it again. ``record`` receives the task id once the
    broker took the message (to save it on the row). ``options`` go to Celery as they are
    (``countdown``, ``soft_time_limit``, ``time_limit``). With ``on_commit`` the message is
    sent once the caller's transaction commits (nothing is sent for a rolled-back change) and
    True is returned; otherwise the result says whether the broker took it now.
    """
    if on_commit:
        transaction.on_commit(
            lambda: task_enqueue(
                name, *args, queue=queue, what=what, later=later, record=record, **options
            )
        )
        return True
    try:
        # current_app is coevo's (coevo/__init__.py creates it first, as the current app).
        result = current_app.send_task(name, args=list(args), queue=queue, **options)
    except Exception as exc:  # kombu's errors differ by transport
        logger.warning("%s: could not send %s to the broker (%s); %s", what, name, exc, later)
        return False
    if record is not None:
        record(result.id or "")
    return True


def broker_ensure(*, timeout_s: float = 2.0) -> None:
    """Raise kombu's OperationalError unless the broker answers now (one try, ``timeout_s``).

    For a request about to create work that is sent on commit: while the broker is down it is
    refused (a 503, nothing created) instead of accepted with its first messages unsent. The
    broker can still fail between this check and the commit; that work is then left to the
    beat jobs that send lost work again.
    """
    options = {
        **(current_app.conf.broker_transport_options or {}),
        # Bounds a broker that accepts connections but does not answer (a stopped process).
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
    }
    conn = current_app.connection_for_write(connect_timeout=timeout_s, transport_options=options)
    try:
        with conn:
            conn.ensure_connection(max_retries=0, timeout=timeout_s)
            # Redis connects lazily: a round trip proves the server answers.
            client = getattr(conn.default_channel, "client", None)
            if client is not None and hasattr(client, "ping"):
                client.ping()
    except OperationalError:
        raise
    except conn.connection_errors + conn.channel_errors as exc:  # redis-py's, on the ping
        raise OperationalError(f"the broker did not answer: {exc}") from exc


def queue_depth(name: str) -> int | None:
    """Messages waiting in the broker's queue ``name`` (None when the broker cannot say)."""
    return broker_queue_depths([name])[name]


def broker_queue_depths(names: list[str], *, timeout_s: float = 5.0) -> dict[str, int | None]:
    """Messages waiting in each queue of ``names``, over one connection; None for a queue the
    broker cannot count, and for all of them when the broker does not answer."""
    depths: dict[str, int | None] = dict.fromkeys(names)
    try:
        with current_app.connection_for_read(connect_timeout=timeout_s) as conn:
            conn.ensure_connection(max_retries=1, timeout=timeout_s)
            channel = conn.default_channel
            for name in names:
                depths[name] = _queue_depth(channel, name)
    except Exception:  # kombu's errors differ by transport
        return dict.fromkeys(names)
    return depths


def _queue_depth(channel: Any, name: str) -> int | None:
    try:
        return channel.queue_declare(queue=name, passive=True).message_count
    except Exception:
        pass
    # Redis and the filesystem transport: a queue no worker declared yet (no binding) is
    # refused by a passive declare, but its size can still be read (0 while it does not exist).
    size = getattr(channel, "_size", None)
    if size is None:
        return None
    try:
        return int(size(name))
    except Exception:
        return None
