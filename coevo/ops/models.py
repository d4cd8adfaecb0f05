from django.db import models

from coevo.db import TimeStampedModel


class WorkerHeartbeat(TimeStampedModel):
    """One row per Celery worker (by hostname, e.g. ``worker@host``), written on start and then
    every COEVO_WORKER_HEARTBEAT_S by a thread of the worker; ``stopped_at`` is set on a clean
    shutdown. A row whose ``last_seen_at`` is old and never stopped is a worker that died.

    The same hostname restarting (a new pid) takes over its row, so the table holds one row per
    worker name, not per run.
    """

    hostname = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    queues = models.JSONField(default=list)
    concurrency = models.PositiveIntegerField(default=0)
    version = models.CharField(max_length=64, blank=True)
    metrics_port = models.PositiveIntegerField(null=True, blank=True)
    started_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["hostname"]
        constraints = [
            models.UniqueConstraint(fields=["hostname"], name="ops_worker_heartbeat_hostname"),
        ]

    def __str__(self) -> str:
        return self.hostname
