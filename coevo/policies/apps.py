from django.apps import AppConfig


class PoliciesConfig(AppConfig):
    name = "coevo.policies"
    label = "policies"

    def ready(self) -> None:
        # Register the Celery tasks (the Celery app autodiscovers only ``workers``).
        from coevo.policies import tasks  # noqa: F401
