import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "coevo.settings")

app = Celery("coevo")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["workers"])
