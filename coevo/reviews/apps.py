from django.apps import AppConfig


class ReviewsConfig(AppConfig):
    name = "coevo.reviews"
    verbose_name = "Review, channels and promotion"
