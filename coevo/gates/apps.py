from django.apps import AppConfig


class GatesConfig(AppConfig):
    name = "coevo.gates"
    verbose_name = "Merge gates"

    def ready(self) -> None:
        # Connect the evaluation_finished receiver and register the Celery tasks (the Celery
        # app autodiscovers only ``workers``; every worker loads the Django apps).
        from coevo.gates import receivers, tasks  # noqa: F401
