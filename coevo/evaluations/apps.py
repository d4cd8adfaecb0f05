from django.apps import AppConfig


class EvaluationsConfig(AppConfig):
    name = "coevo.evaluations"
    label = "evaluations"
