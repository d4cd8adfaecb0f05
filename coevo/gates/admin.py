from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from coevo.gates.models import Gate


@admin.register(Gate)
class GateAdmin(admin.ModelAdmin):
    """Read-only: gates are created through the API or the CLI and finished by the engine."""

    list_display = ["id", "project", "candidate", "against", "suite", "state", "verdict"]
    list_filter = ["project", "state", "verdict"]
    search_fields = ["id", "candidate__sha", "against"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.is_staff and request.method in ("GET", "HEAD")
