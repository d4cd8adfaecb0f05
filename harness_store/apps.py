from django.apps import AppConfig


class HarnessStoreConfig(AppConfig):
    name = "harness_store"
