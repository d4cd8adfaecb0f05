import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "coevo.settings")

app = Celery("coevo")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["workers", "coevo.ops"])

# Worker start and stop: the heartbeat row and thread, the worker metrics server, log ids per task.
import coevo.ops.heartbeats  # noqa: E402, F401
