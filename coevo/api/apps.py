from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "coevo.api"
    verbose_name = "REST API"
