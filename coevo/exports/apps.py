from django.apps import AppConfig


class ExportsConfig(AppConfig):
    name = "coevo.exports"
    verbose_name = "Trajectory exports"

    def ready(self) -> None:
        # Register the Celery task (the Celery app autodiscovers only ``workers``) and the
        # retention protection of the evaluations exports were built from.
        from coevo.exports import retention, tasks  # noqa: F401
