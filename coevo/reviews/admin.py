"""Channels and promotion requests are read-only here: moves go through ``channel_move`` (the
``channel_move`` management command), which keeps the history and the git tags in step, and
decisions through the promotion pages (two-person rule, audit)."""

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from coevo.reviews.models import Approval, Channel, ChannelMove, PromotionRequest, ReviewComment


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


class _ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ApprovalInline(_ReadOnlyInline):
    model = Approval
    fields = readonly_fields = ["reviewer", "decision", "comment", "created_at"]


class ReviewCommentInline(_ReadOnlyInline):
    model = ReviewComment
    fields = readonly_fields = ["author", "body", "created_at"]


@admin.register(PromotionRequest)
class PromotionRequestAdmin(admin.ModelAdmin):
    list_display = ["id", "project", "channel", "candidate", "state", "requester", "created_at"]
    list_filter = ["state", "project"]
    search_fields = ["id", "candidate__sha", "project__slug", "requester__username"]
    exclude = ["evidence"]  # large; the promotion page shows it
    readonly_fields = [
        "project",
        "channel",
        "candidate",
        "policy_version",
        "suite",
        "epochs",
        "seed",
        "requester",
        "state",
        "state_detail",
        "holder_candidate",
        "holder_policy_version",
        "holder_generation",
        "campaign",
        "candidate_evaluation",
        "holder_evaluation",
        "heldout_looks_project",
        "heldout_looks_campaign",
        "required_approvals",
        "channel_move",
        "evidence_at",
        "decided_at",
    ]
    inlines = [ApprovalInline, ReviewCommentInline]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.is_staff and request.method in ("GET", "HEAD")

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
