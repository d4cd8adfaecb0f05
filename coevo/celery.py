"""The Celery app. It knows its configuration and nothing else of coevo: each Django app's
``tasks`` module is found by autodiscovery, and the worker's signal handlers (heartbeats, log
ids) are connected by ``coevo.ops`` when Django loads it (every worker loads the Django apps
before it starts consuming)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "coevo.settings")

app = Celery("coevo")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
