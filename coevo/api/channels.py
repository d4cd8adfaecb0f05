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
from coevo.reviews.models import Channel, ChannelMove
from coevo.reviews.selectors import channel_get, channel_history, channel_list_for_project


class ChannelOut(serializers.Serializer):
    name = serializers.SlugField()
    candidate = serializers.CharField(allow_null=True, help_text="SHA; null: never moved")
    policy_version = serializers.CharField(allow_null=True)
    moved_at = serializers.DateTimeField(allow_null=True)
    url = serializers.URLField()


class ChannelMoveOut(serializers.Serializer):
    number = serializers.IntegerField()
    from_candidate = serializers.CharField(allow_null=True)
    to_candidate = serializers.CharField()
    from_policy_version = serializers.CharField(allow_null=True)
    to_policy_version = serializers.CharField(allow_null=True)
    moved_by = serializers.CharField(allow_null=True)
    reason = serializers.CharField()
    tag = serializers.CharField(help_text="The git tag recording this move.")
    created_at = serializers.DateTimeField()


class ChannelDetailOut(ChannelOut):
    history = ChannelMoveOut(many=True, help_text="Newest first.")


_when = serializers.DateTimeField().to_representation


def channel_out(view: ApiView, channel: Channel) -> dict:
    return {
        "name": channel.name,
        "candidate": channel.candidate.sha if channel.candidate else None,
        "policy_version": channel.policy_version.name if channel.policy_version else None,
        "moved_at": _when(channel.moved_at) if channel.moved_at else None,
        "url": view.absolute("api:channel", view.project.slug, channel.name),
    }


def channel_move_out(move: ChannelMove) -> dict:
    return {
        "number": move.number,
        "from_candidate": move.from_candidate.sha if move.from_candidate else None,
        "to_candidate": move.to_candidate.sha,
        "from_policy_version": move.from_policy_version.name if move.from_policy_version else None,
        "to_policy_version": move.to_policy_version.name if move.to_policy_version else None,
        "moved_by": move.moved_by.get_username() if move.moved_by else None,
        "reason": move.reason,
        "tag": move.tag,
        "created_at": _when(move.created_at),
    }


class ChannelListView(ApiView):
    @extend_schema(operation_id="channels_list", responses=ChannelOut(many=True))
    def get(self, request: Request, slug: str) -> Response:
        # A project has a handful of channels: no pagination.
        channels = channel_list_for_project(project=self.project).order_by("name")
        return Response([channel_out(self, channel) for channel in channels])


class ChannelDetailView(ApiView):
    @extend_schema(operation_id="channels_retrieve", responses=ChannelDetailOut)
    def get(self, request: Request, slug: str, name: str) -> Response:
        channel = channel_get(project=self.project, name=name)
        body = channel_out(self, channel)
        body["history"] = [channel_move_out(move) for move in channel_history(channel=channel)]
        return Response(body)


# Relative to projects/<slug:slug>/ (coevo/api/urls.py).
urlpatterns = [
    path("channels/", ChannelListView.as_view(), name="channels"),
    path("channels/<slug:name>/", ChannelDetailView.as_view(), name="channel"),
]
