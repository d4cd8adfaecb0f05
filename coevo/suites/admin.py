from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from coevo.suites.models import Suite


@admin.register(Suite)
class SuiteAdmin(admin.ModelAdmin):
    """Read-only: suites are written by imports, and an evaluated suite must stay as it was."""

    list_display = ("name", "version", "kind", "project", "content_hash", "created_at")
    list_filter = ("kind",)
    search_fields = ("name", "content_hash")
    readonly_fields = (
        "project",
        "name",
        "kind",
        "version",
        "content_hash",
        "split_seed",
        "scorer",
    )
    fields = (*readonly_fields, "description")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and obj.is_used:
            return False
        return super().has_delete_permission(request, obj)

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        # The bulk "delete selected" action deletes through a queryset, past the per-object
        # check above; deleting one unused suite at a time is still possible.
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions
