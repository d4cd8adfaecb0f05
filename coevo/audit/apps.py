from django.apps import AppConfig


class AuditConfig(AppConfig):
    name = "coevo.audit"
    label = "audit"
    verbose_name = "Audit log and webhooks"
    default_auto_field = "django.db.models.BigAutoField"
