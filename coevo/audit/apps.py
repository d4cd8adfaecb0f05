from django.apps import AppConfig


class AuditConfig(AppConfig):
    name = "coevo.audit"
    label = "audit"
    verbose_name = "Audit log and webhooks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Register the Celery tasks (the Celery app autodiscovers only ``workers`` and ops;
        # every worker loads the Django apps).
        from coevo.audit import tasks  # noqa: F401
