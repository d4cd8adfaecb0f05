from django.apps import AppConfig


class TrainingConfig(AppConfig):
    name = "coevo.training"
    verbose_name = "Policy training"

    def ready(self) -> None:
        # Register the Celery tasks (the Celery app autodiscovers only ``workers``).
        from coevo.training import tasks  # noqa: F401
