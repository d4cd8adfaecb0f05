from django.apps import AppConfig


class OpsConfig(AppConfig):
    name = "coevo.ops"
    verbose_name = "Operations"
