from django.apps import AppConfig


class CampaignsConfig(AppConfig):
    name = "coevo.campaigns"
    label = "campaigns"
    verbose_name = "Evolution campaigns"

    def ready(self) -> None:
        # Connect the evaluation_finished receiver and register the Celery tasks (the Celery
        # app autodiscovers only some packages; every worker loads the Django apps).
        from coevo.campaigns import receivers, tasks  # noqa: F401
