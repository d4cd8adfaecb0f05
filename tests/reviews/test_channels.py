"""Channels: moves keep an append-only history, refuse a stale view, and tag the repository."""

from __future__ import annotations

import git
import pytest
from django.core.management import CommandError, call_command

from coevo.errors import InvalidInput, InvalidState
from coevo.projects.services import project_get_or_create
from coevo.reviews.models import Channel, ChannelMove
from coevo.reviews.selectors import (
    channel_get,
    channel_history,
    channel_holder,
    channel_list_for_project,
)
from coevo.reviews.services import channel_get_or_create, channel_move
from harness_store.services import project_repo
from tests.support.factories import make_member

pytestmark = pytest.mark.django_db


def tags(project) -> dict[str, str]:
    repo = git.Repo(project_repo(project=project).path)
    return {tag.name: tag.commit.hexsha for tag in repo.tags}


def test_it_records_each_move_and_tags_it(project, owner, seed_candidate, child_candidate):
    channel = channel_get_or_create(project=project, name="production")
    assert channel_holder(project=project, name="production") is None

    first = channel_move(
        channel=channel, candidate=seed_candidate, policy_version=None, moved_by=owner
    )
    second = channel_move(
        channel=channel,
        candidate=child_candidate,
        policy_version=None,
        moved_by=owner,
        reason="  gate passed  ",
    )

    assert channel_holder(project=project, name="production") == child_candidate
    channel.refresh_from_db()
    assert channel.generation == 2 and channel.moved_at is not None
    history = list(channel_history(channel=channel))
    assert history == [second, first]  # newest first
    assert (first.from_candidate, first.to_candidate) == (None, seed_candidate)
    assert (second.from_candidate, second.to_candidate) == (seed_candidate, child_candidate)
    assert second.reason == "gate passed" and second.moved_by == owner
    assert tags(project) == {
        "channels/production/0001": seed_candidate.sha,
        "channels/production/0002": child_candidate.sha,
        "production": child_candidate.sha,
    }
    assert second.tag == "channels/production/0002"


def test_it_refuses_a_move_prepared_on_a_stale_channel(
    project, owner, seed_candidate, child_candidate
):
    channel = channel_get_or_create(project=project, name="production")
    stale = Channel.objects.get(id=channel.id)
    channel_move(channel=channel, candidate=seed_candidate, policy_version=None, moved_by=owner)

    with pytest.raises(InvalidState, match="moved while this move was prepared"):
        channel_move(channel=stale, candidate=child_candidate, policy_version=None, moved_by=owner)

    assert channel_holder(project=project, name="production") == seed_candidate
    assert ChannelMove.objects.filter(channel=channel).count() == 1
    assert "channels/production/0002" not in tags(project)


def test_it_keeps_the_history_append_only(project, owner, seed_candidate):
    channel = channel_get_or_create(project=project, name="staging")
    move = channel_move(
        channel=channel, candidate=seed_candidate, policy_version=None, moved_by=owner
    )
    move.reason = "rewritten"
    with pytest.raises(InvalidState):
        move.save()
    with pytest.raises(InvalidState):
        move.delete()


def test_it_refuses_a_candidate_of_another_project(project, owner, seed_candidate):
    other = project_get_or_create(slug="other", name="Other")
    channel = channel_get_or_create(project=other, name="production")
    with pytest.raises(InvalidInput, match="another project"):
        channel_move(channel=channel, candidate=seed_candidate, policy_version=None, moved_by=owner)


@pytest.mark.parametrize("name", ["Production", "channels", "", "a/b", "-x"])
def test_it_refuses_bad_channel_names(project, name):
    with pytest.raises(InvalidInput):
        channel_get_or_create(project=project, name=name)


def test_it_creates_a_channel_once(project):
    first = channel_get_or_create(project=project, name="production")
    assert channel_get_or_create(project=project, name="production") == first
    assert list(channel_list_for_project(project=project)) == [first]
    assert channel_get(project=project, name="production") == first


def test_the_command_moves_a_channel(project, owner, seed_candidate, capsys):
    call_command(
        "channel_move",
        "--project",
        project.slug,
        "--channel",
        "production",
        "--candidate",
        seed_candidate.sha[:8],
        "--user",
        owner.username,
        "--reason",
        "first release",
    )

    assert "move 1" in capsys.readouterr().out
    assert channel_holder(project=project, name="production") == seed_candidate
    move = ChannelMove.objects.get()
    assert move.moved_by == owner and move.reason == "first release"


def test_the_command_explains_an_unknown_candidate(project):
    with pytest.raises(CommandError, match="No candidate"):
        call_command(
            "channel_move", "--project", project.slug, "--channel", "production", "--candidate",
            "deadbeef",
        )  # fmt: skip


def test_it_lets_only_admins_create_channels_and_refuses_unknown_ones(client, project, owner):
    from django.urls import reverse

    from coevo.projects.models import Role
    from coevo.reviews.models import Channel
    from coevo.reviews.services import channel_for_request

    # A typo in a promotion request never makes a new channel; the standard ones always exist.
    with pytest.raises(InvalidInput, match="ask a project admin"):
        channel_for_request(project=project, name="canary")
    assert channel_for_request(project=project, name="staging").name == "staging"

    researcher = make_member(project, "res", Role.RESEARCHER)
    url = reverse("web:channel_create", args=[project.slug])
    client.force_login(researcher)
    assert client.post(url, {"name": "canary"}).status_code == 403
    client.force_login(owner)
    assert client.post(url, {"name": "canary"}).status_code == 302
    assert channel_for_request(project=project, name="canary").name == "canary"
    assert Channel.objects.filter(project=project, name="canary").count() == 1
