from django.apps import AppConfig


class CampaignsConfig(AppConfig):
    name = "coevo.campaigns"
    label = "campaigns"
    verbose_name = "Evolution campaigns"

    def ready(self) -> None:
        # Connect the evaluation_finished receiver (Celery finds the tasks by autodiscovery).
        from coevo.campaigns import receivers  # noqa: F401
