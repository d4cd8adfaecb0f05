"""API: channels (see docs/api.md, Channels). Included under ``projects/<slug:slug>/``.

Read-only: channels move through promotion (issue 5) or ``manage.py channel_move``.
"""

from __future__ import annotations

from django.urls import path
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from coevo.api.base import ApiView
from coevo.api.fields import MethodField, OutSerializer
from coevo.reviews.models import Channel
from coevo.reviews.selectors import channel_get, channel_history, channel_list_for_project


class ChannelOut(OutSerializer):
    name = serializers.SlugField()
    candidate = serializers.CharField(
        source="candidate.sha", allow_null=True, help_text="SHA; null: never moved"
    )
    policy_version = serializers.CharField(source="policy_version.name", allow_null=True)
    moved_at = serializers.DateTimeField(allow_null=True)
    url = MethodField(serializers.URLField())

    def get_url(self, channel: Channel) -> str:
        return self.view.absolute("api:channel", self.view.project.slug, channel.name)


class ChannelMoveOut(serializers.Serializer):
    number = serializers.IntegerField()
    from_candidate = serializers.CharField(source="from_candidate.sha", allow_null=True)
    to_candidate = serializers.CharField(source="to_candidate.sha")
    from_policy_version = serializers.CharField(source="from_policy_version.name", allow_null=True)
    to_policy_version = serializers.CharField(source="to_policy_version.name", allow_null=True)
    moved_by = serializers.CharField(source="moved_by.get_username", allow_null=True)
    reason = serializers.CharField()
    tag = serializers.CharField(help_text="The git tag recording this move.")
    created_at = serializers.DateTimeField()


class ChannelDetailOut(ChannelOut):
    history = MethodField(ChannelMoveOut(many=True, help_text="Newest first."))

    def get_history(self, channel: Channel) -> list[dict]:
        return ChannelMoveOut(channel_history(channel=channel), many=True).data


class ChannelListView(ApiView):
    @extend_schema(operation_id="channels_list", responses=ChannelOut(many=True))
    def get(self, request: Request, slug: str) -> Response:
        # A project has a handful of channels: no pagination.
        channels = channel_list_for_project(project=self.project).order_by("name")
        return Response(self.out(ChannelOut, channels, many=True))


class ChannelDetailView(ApiView):
    @extend_schema(operation_id="channels_retrieve", responses=ChannelDetailOut)
    def get(self, request: Request, slug: str, name: str) -> Response:
        channel = channel_get(project=self.project, name=name)
        return Response(self.out(ChannelDetailOut, channel))


# Relative to projects/<slug:slug>/ (coevo/api/urls.py).
urlpatterns = [
    path("channels/", ChannelListView.as_view(), name="channels"),
    path("channels/<slug:name>/", ChannelDetailView.as_view(), name="channel"),
]
