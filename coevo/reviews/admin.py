"""Channels are read-only here: moves go through ``channel_move`` (the ``channel_move``
management command), which keeps the history and the git tags in step."""

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from coevo.reviews.models import Channel, ChannelMove


class ChannelMoveInline(admin.TabularInline):
    model = ChannelMove
    extra = 0
    can_delete = False
    ordering = ["-number"]
    fields = ["number", "from_candidate", "to_candidate", "to_policy_version", "moved_by"]
    readonly_fields = fields + ["reason", "tag", "created_at"]

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Channel)
class ChannelAdmin(admin.ModelAdmin):
    list_display = ["name", "project", "candidate", "policy_version", "moved_at", "generation"]
    list_filter = ["project"]
    search_fields = ["name", "project__slug", "candidate__sha"]
    readonly_fields = ["project", "name", "candidate", "policy_version", "moved_at", "generation"]
    inlines = [ChannelMoveInline]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.is_staff and request.method in ("GET", "HEAD")

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
