from django.apps import AppConfig


class PoliciesConfig(AppConfig):
    name = "coevo.policies"
    label = "policies"
