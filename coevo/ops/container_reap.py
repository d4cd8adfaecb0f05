"""A worker's start reaps what dead workers of its machine left on the Docker engine.

A rollout's task container lives as long as its rollout; a worker killed outright (SIGKILL, a
machine's OOM killer) leaves it running, with the verifier's snapshot images. Each object is
labelled with the worker process that made it (workers/containers/engine.py), so the next
worker to start on the machine removes those whose process is gone (``engine_reap``), before it
takes a task. Only with the container backend on; an engine that does not answer is logged and
left: the worker still serves the tasks that need no container.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.signals import worker_process_init, worker_ready
from django.conf import settings

from workers.containers import ContainerUnavailable, Reaped, engine_reap

logger = logging.getLogger(__name__)


def reap_dead_workers() -> Reaped | None:
    """``engine_reap`` when the backend is on; None when it is off or the engine is down."""
    if not settings.COEVO_CONTAINER_BACKEND:
        return None
    try:
        return engine_reap()
    except ContainerUnavailable as exc:
        logger.warning("could not reap dead workers' containers: %s", exc)
        return None


@worker_ready.connect
def _reap_at_ready(**_: Any) -> None:
    reap_dead_workers()


@worker_process_init.connect
def _reap_in_child(**_: Any) -> None:
    # A prefork child replaces one that died (max-tasks-per-child, a crash): what it left.
    reap_dead_workers()
