"""Channel reads."""

from __future__ import annotations

from django.db.models import QuerySet

from coevo.errors import NotFound
from coevo.projects.models import Project
from coevo.reviews.models import Channel, ChannelMove
from harness_store.models import Candidate


def channel_list_for_project(*, project: Project) -> QuerySet[Channel]:
    return Channel.objects.filter(project=project).select_related("candidate", "policy_version")


def channel_get(*, project: Project, name: str) -> Channel:
    channel = channel_list_for_project(project=project).filter(name=name).first()
    if channel is None:
        raise NotFound(f"No channel {name!r} in project {project.slug}.")
    return channel


def channel_holder(*, project: Project, name: str) -> Candidate | None:
    """The candidate the channel points at; None for an empty or unknown channel."""
    channel = channel_list_for_project(project=project).filter(name=name).first()
    return channel.candidate if channel else None


def channel_history(*, channel: Channel) -> QuerySet[ChannelMove]:
    """The channel's moves, newest first."""
    return ChannelMove.objects.filter(channel=channel).select_related(
        "from_candidate",
        "to_candidate",
        "from_policy_version",
        "to_policy_version",
        "moved_by",
    )
