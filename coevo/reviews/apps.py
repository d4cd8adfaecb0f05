from django.apps import AppConfig


class ReviewsConfig(AppConfig):
    name = "coevo.reviews"
    verbose_name = "Review, channels and promotion"

    def ready(self) -> None:
        # Connect the evaluation_finished receiver and the retention protection of promotion
        # requests (Celery finds the tasks by autodiscovery).
        from coevo.reviews import receivers, retention  # noqa: F401
