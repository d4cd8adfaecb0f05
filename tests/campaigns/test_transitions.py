"""The campaign's one table of moves (coevo/campaigns/transitions.py): each move applies only
from its source states, as a compare-and-swap, and the services go through it."""

from __future__ import annotations

import pytest

from coevo.campaigns.models import CampaignState
from coevo.campaigns.services import campaign_pause, campaign_resume, campaign_start, campaign_stop
from coevo.campaigns.transitions import CAMPAIGN_MOVES, campaign_move
from coevo.errors import InvalidState
from tests.campaigns.test_runner import make

pytestmark = pytest.mark.django_db


def test_every_state_but_pending_is_some_moves_target_and_final_states_have_no_way_out():
    targets = {move.target for move in CAMPAIGN_MOVES.values()}
    assert targets == set(CampaignState) - {CampaignState.PENDING}
    sources = {state for move in CAMPAIGN_MOVES.values() for state in move.sources}
    assert sources == {CampaignState.PENDING, CampaignState.RUNNING, CampaignState.PAUSED}


def test_a_move_from_a_state_it_does_not_list_moves_nothing(project, seed, suite, policy_version):
    campaign = make(project, seed, suite, policy_version)
    assert not campaign_move(campaign_id=campaign.id, move="pause")
    assert not campaign_move(campaign_id=campaign.id, move="finish", stop_reason="x")
    campaign.refresh_from_db()
    assert campaign.state == CampaignState.PENDING
    assert campaign_move(campaign_id=campaign.id, move="start")
    assert not campaign_move(campaign_id=campaign.id, move="start")  # the second racer
    campaign.refresh_from_db()
    assert campaign.state == CampaignState.RUNNING


def test_the_services_follow_the_table(project, seed, suite, policy_version):
    campaign = make(project, seed, suite, policy_version)
    with pytest.raises(InvalidState, match="only a running one pauses"):
        campaign_pause(campaign=campaign)
    assert campaign_start(campaign=campaign).state == CampaignState.RUNNING
    assert campaign_pause(campaign=campaign).state == CampaignState.PAUSED
    with pytest.raises(InvalidState, match="only a pending one starts"):
        campaign_start(campaign=campaign)
    assert campaign_resume(campaign=campaign).state == CampaignState.RUNNING
    stopped = campaign_stop(campaign=campaign, reason="enough")
    assert (stopped.state, stopped.stop_reason) == (CampaignState.STOPPED, "enough")
    with pytest.raises(InvalidState, match="nothing to stop"):
        campaign_stop(campaign=campaign)
    assert not campaign_move(campaign_id=campaign.id, move="resume")
