from django.apps import AppConfig


class GatesConfig(AppConfig):
    name = "coevo.gates"
    verbose_name = "Merge gates"

    def ready(self) -> None:
        # Connect the evaluation_finished receiver (Celery finds the tasks by autodiscovery).
        from coevo.gates import receivers  # noqa: F401
