from django.apps import AppConfig


class MatricesConfig(AppConfig):
    name = "coevo.matrices"
    label = "matrices"
    verbose_name = "Compatibility matrices"
