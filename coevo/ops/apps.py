from django.apps import AppConfig


class OpsConfig(AppConfig):
    name = "coevo.ops"
    verbose_name = "Operations"

    def ready(self) -> None:
        # Worker start and stop: the heartbeat row and thread, the worker metrics server, and
        # log ids per task; database connections kept across tasks, closed when old or broken
        # (Celery signals; every worker loads the Django apps first); the worker's start-up
        # objects frozen out of the garbage collector's full collections; the containers of
        # dead workers reaped.
        from coevo.ops import container_reap, heartbeats, task_connections, worker_gc  # noqa: F401
