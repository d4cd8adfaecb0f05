"""Database connections across a worker's tasks: kept, as Django keeps them across requests.

Celery's Django fixup would close every connection before and after each task; with
``CELERY_DB_REUSE_MAX`` set (coevo.settings) it does not, and these handlers do what Django
does around a request instead: close a connection that is past ``CONN_MAX_AGE`` or that saw an
error and no longer answers, and keep the rest. A worker thread then opens one PostgreSQL
connection and uses it for many rollouts, instead of one connection (and one backend process)
per rollout.
"""

from __future__ import annotations

from typing import Any

from celery.signals import task_postrun, task_prerun
from django.db import close_old_connections


@task_prerun.connect
def _before_task(task: Any = None, **_: Any) -> None:
    if not _eager(task):
        close_old_connections()


@task_postrun.connect
def _after_task(task: Any = None, **_: Any) -> None:
    if not _eager(task):
        close_old_connections()


def _eager(task: Any) -> bool:
    """A task run in its caller's thread (``apply()``): the connection is the caller's, maybe
    inside its transaction, and not the worker's to close."""
    return bool(getattr(getattr(task, "request", None), "is_eager", False))
