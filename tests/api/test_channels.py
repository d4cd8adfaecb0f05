"""GET channels and a channel with its history (read scope, project members only)."""

from __future__ import annotations

import pytest

from coevo.reviews.services import channel_get_or_create, channel_move
from tests.api.conftest import assert_error

BASE = "/api/v1/projects/demo/channels/"


@pytest.fixture
def production(project, owner, seed_candidate, child_candidate):
    channel = channel_get_or_create(project=project, name="production")
    channel_move(channel=channel, candidate=seed_candidate, policy_version=None, moved_by=owner)
    channel.refresh_from_db()
    channel_move(
        channel=channel,
        candidate=child_candidate,
        policy_version=None,
        moved_by=owner,
        reason="gate passed",
    )
    channel_get_or_create(project=project, name="staging")
    return channel


def test_it_lists_channels_with_their_holders(make_client, viewer, production, child_candidate):
    body = make_client(viewer, ["read"]).get(BASE).json()

    assert [c["name"] for c in body] == ["production", "staging"]
    prod, staging = body
    assert prod["candidate"] == child_candidate.sha and prod["moved_at"]
    assert prod["url"].endswith("/api/v1/projects/demo/channels/production/")
    assert staging["candidate"] is None and staging["moved_at"] is None


def test_it_shows_a_channels_history_newest_first(
    make_client, viewer, production, seed_candidate, child_candidate, owner
):
    body = make_client(viewer, ["read"]).get(f"{BASE}production/").json()

    assert body["candidate"] == child_candidate.sha
    assert [m["number"] for m in body["history"]] == [2, 1]
    latest = body["history"][0]
    assert latest["from_candidate"] == seed_candidate.sha
    assert latest["to_candidate"] == child_candidate.sha
    assert latest["moved_by"] == owner.username and latest["reason"] == "gate passed"
    assert latest["tag"] == "channels/production/0002"


def test_it_answers_404_for_unknown_channels_and_outsiders(
    make_client, viewer, outsider, production
):
    assert_error(make_client(viewer, ["read"]).get(f"{BASE}nope/"), 404, "not_found")
    outsider_client = make_client(outsider, ["read"])
    assert_error(outsider_client.get(BASE), 404, "not_found")
    assert_error(outsider_client.get(f"{BASE}production/"), 404, "not_found")


def test_it_refuses_writes_and_tokenless_requests(make_client, owner, production):
    from rest_framework.test import APIClient

    assert_error(make_client(owner).post(BASE, {}, format="json"), 403, "scope_missing")
    assert_error(APIClient().get(BASE), 401, "not_authenticated")
