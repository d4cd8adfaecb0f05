from django.apps import AppConfig


class ReviewsConfig(AppConfig):
    name = "coevo.reviews"
    verbose_name = "Review, channels and promotion"

    def ready(self) -> None:
        # Connect the evaluation_finished receiver, register the Celery tasks (every worker
        # loads the Django apps) and the retention protection of promotion requests.
        from coevo.reviews import receivers, retention, tasks  # noqa: F401
