from django.apps import AppConfig


class WebConfig(AppConfig):
    name = "coevo.web"
    label = "web"
