from django.contrib import admin

from coevo.policies.models import PolicyEndpoint, PolicyVersion


@admin.register(PolicyEndpoint)
class PolicyEndpointAdmin(admin.ModelAdmin):
    """Operators size ``max_concurrency`` to what the server sustains (workers honour it)."""

    list_display = ["name", "base_url", "kind", "max_concurrency"]
    list_editable = ["max_concurrency"]


@admin.register(PolicyVersion)
class PolicyVersionAdmin(admin.ModelAdmin):
    list_display = ["name", "served_name", "base_model", "endpoint"]
    list_filter = ["endpoint"]
