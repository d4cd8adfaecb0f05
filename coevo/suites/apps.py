from django.apps import AppConfig


class SuitesConfig(AppConfig):
    name = "coevo.suites"
    label = "suites"
