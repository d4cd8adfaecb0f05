"""The campaign pages and actions."""

from __future__ import annotations

import pytest
from django.core.management import call_command

from coevo.campaigns.models import Campaign, CampaignState
from coevo.campaigns.runner import campaign_advance
from coevo.campaigns.services import campaign_create, campaign_start
from tests.campaigns.support import marked_suite, styled_seed

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def campaign(project, tmp_path, policy_version):
    campaign = campaign_create(
        project=project,
        name="paged",
        seed_candidate=styled_seed(project, tmp_path),
        policy_version=policy_version,
        suite=marked_suite(project),
    )
    campaign_start(campaign=campaign)
    campaign_advance(campaign_id=campaign.id)
    return campaign


def test_it_shows_the_campaign_list_and_page(client, owner, campaign):
    client.force_login(owner)
    listing = client.get("/p/demo/campaigns/")
    assert listing.status_code == 200 and b"paged" in listing.content
    page = client.get(f"/p/demo/campaigns/{campaign.id}/")
    assert page.status_code == 200
    assert b'id="campaign-proposals"' in page.content and b"seed" in page.content
    assert b'hx-trigger="every 3s"' in page.content
    partial = client.get(f"/p/demo/campaigns/{campaign.id}/", HTTP_HX_REQUEST="true")
    assert b"<html" not in partial.content and b'id="campaign-live"' in partial.content


def test_it_hides_a_campaign_from_an_outsider(client, outsider, campaign):
    client.force_login(outsider)
    assert client.get(f"/p/demo/campaigns/{campaign.id}/").status_code == 404


def test_it_pauses_and_stops_from_the_page(client, owner, campaign):
    client.force_login(owner)
    client.post(f"/p/demo/campaigns/{campaign.id}/pause/")
    campaign.refresh_from_db()
    assert campaign.state == CampaignState.PAUSED
    client.post(f"/p/demo/campaigns/{campaign.id}/stop/")
    campaign.refresh_from_db()
    assert (campaign.state, campaign.stop_reason) == (CampaignState.STOPPED, "stopped by owner")
    page = client.get(f"/p/demo/campaigns/{campaign.id}/")
    assert b'hx-trigger="every 3s"' not in page.content


def test_it_says_what_each_action_did(client, owner, campaign):
    client.force_login(owner)
    said = []
    for action in ("pause", "resume", "stop"):
        page = client.post(f"/p/demo/campaigns/{campaign.id}/{action}/", follow=True)
        said += [str(m) for m in page.context["messages"]]  # shown on the page it lands on
    assert said == ["Campaign paged paused.", "Campaign paged resumed.", "Campaign paged stopped."]


def test_it_starts_a_campaign_from_the_command_line(project, tmp_path, policy_version):
    seed = styled_seed(project, tmp_path)
    marked_suite(project)
    call_command(
        "campaign_start",
        "--project",
        "demo",
        "--seed",
        seed.sha[:10],
        "--suite",
        "styled",
        "--proposals",
        "2",
    )
    campaign = Campaign.objects.get()
    assert (campaign.state, campaign.max_proposals) == (CampaignState.RUNNING, 2)
