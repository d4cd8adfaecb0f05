from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "coevo.accounts"
    verbose_name = "Accounts and API tokens"
