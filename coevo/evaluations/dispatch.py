"""Sending rollouts to the ``rollouts`` queue: the bottom of the evaluation lifecycle.

The lifecycle (``coevo.evaluations.lifecycle``: stages, early stopping, pause and resume) and
the services above it (create, execute, finish, the watchdog) send through here; this module
knows neither, so the three stack without an import cycle (the import contract
``evaluation-lifecycle-layers`` in pyproject.toml holds it).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone

from coevo.enqueue import task_enqueue
from coevo.evaluations.models import Rollout, RolloutState

ROLLOUT_RUN_TASK = "coevo.evaluations.tasks.rollout_run"


def evaluation_enqueue(
    *,
    evaluation_id: Any,
    stage: int | None = None,
    only_unsent: bool = False,
    rollout_ids: list[Any] | None = None,
) -> int:
    """Send pending rollouts (of one stage, or all; or only those not sent yet; or only
    ``rollout_ids``, in that order) to the ``rollouts`` queue.

    A broker that is down does not lose work: the rollout stays pending without ``enqueued_at``
    and the watchdog sends it again.
    """

    pending = Rollout.objects.filter(evaluation_id=evaluation_id, state=RolloutState.PENDING)
    if stage is not None:
        pending = pending.filter(stage=stage)
    if only_unsent:
        pending = pending.filter(enqueued_at__isnull=True)
    ids = list(pending.values_list("id", flat=True))
    if rollout_ids is not None:
        wanted = set(ids)
        ids = [rollout_id for rollout_id in rollout_ids if rollout_id in wanted]
    sent = 0
    for rollout_id in ids:
        if not rollout_send(rollout_id):
            break
        sent += 1
    return sent


def rollout_retry_sent(*, rollout_id: Any, countdown: float) -> None:
    """Record that a retry of the rollout is on its way, due in ``countdown`` seconds: its
    ``enqueued_at`` is when the message is due, so the watchdog's resend (which counts from
    it) neither cuts the backoff short nor mistakes the message a worker holds for a lost one."""
    Rollout.objects.filter(id=rollout_id, state=RolloutState.PENDING).update(
        enqueued_at=timezone.now() + timedelta(seconds=countdown)
    )


def rollout_send(rollout_id: Any) -> bool:
    """Publish one rollout; False (and a warning) when the broker cannot take it now."""

    def record(task_id: str) -> None:
        Rollout.objects.filter(id=rollout_id).update(
            celery_task_id=task_id, enqueued_at=timezone.now()
        )

    return task_enqueue(
        ROLLOUT_RUN_TASK,
        str(rollout_id),
        queue="rollouts",
        what=f"rollout {rollout_id}",
        later="the watchdog sends it again",
        record=record,
    )
