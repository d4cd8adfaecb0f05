"""Policy tasks (run by beat, on the ``ops`` queue): endpoint health and idle adapter unloading."""

from __future__ import annotations

import logging

from celery import shared_task

from coevo.policies import services

logger = logging.getLogger(__name__)


@shared_task(
    name="coevo.policies.tasks.policy_endpoints_check", soft_time_limit=120, time_limit=150
)
def policy_endpoints_check() -> None:
    """Mark endpoints healthy or not from ``GET /v1/models``; unload idle LoRA adapters."""
    services.policy_endpoints_check()
    unloaded = services.policy_adapters_unload_idle()
    if unloaded:
        logger.info("unloaded %d idle adapter(s): %s", len(unloaded), ", ".join(unloaded))
