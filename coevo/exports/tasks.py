"""Export tasks (``default`` queue): take an id, call the service; the beat resend job (``ops``)."""

from __future__ import annotations

from celery import shared_task

from coevo.exports import services


@shared_task(
    name=services.TRAJECTORY_EXPORT_BUILD_TASK,
    acks_late=True,
    soft_time_limit=1800,
    time_limit=2160,
)
def trajectory_export_build(export_id: str) -> None:
    services.trajectory_export_build(export_id=export_id)


@shared_task(
    name="coevo.exports.tasks.trajectory_exports_resend", soft_time_limit=120, time_limit=150
)
def trajectory_exports_resend() -> None:
    """Run by beat: exports whose build message was lost are sent again."""
    services.trajectory_exports_resend()
