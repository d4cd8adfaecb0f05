from django.apps import AppConfig


class TrainingConfig(AppConfig):
    name = "coevo.training"
    verbose_name = "Policy training"
