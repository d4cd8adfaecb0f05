"""Manual proposals: a human's or CI's commit submitted to a campaign."""

from __future__ import annotations

import pytest

from coevo.campaigns.models import CampaignState, ProposalState, ProposerKind
from coevo.campaigns.runner import campaign_advance
from coevo.campaigns.services import (
    campaign_start,
    campaign_stop,
    campaign_submit_candidate,
)
from coevo.errors import InvalidInput, InvalidState
from coevo.projects.services import project_get_or_create
from tests.campaigns.merge_support import drive_tasks, human_commit, make_campaign, passing
from tests.campaigns.support import AGENT, styled_seed

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_evaluates_submissions_first_come_first_ahead_of_the_proposers(
    project, seed, suite, policy_version, owner
):
    campaign = make_campaign(
        project,
        seed,
        suite,
        policy_version,
        max_proposals=1,
        strategy=[{"kind": "config", "options": {"knobs": ["style"]}}],
    )
    campaign_start(campaign=campaign)
    campaign_advance(campaign_id=campaign.id)  # the seed's evaluation starts
    first = human_commit(project, seed, {"notes/first.txt": b"1\n"}, "human first")
    second = human_commit(project, seed, {"notes/second.txt": b"2\n"}, "human second")

    one = campaign_submit_candidate(campaign=campaign, candidate=first, submitted_by=owner)
    two = campaign_submit_candidate(campaign=campaign, candidate=second, submitted_by=owner)

    assert (one.state, two.state) == (ProposalState.QUEUED, ProposalState.QUEUED)
    assert (one.sequence, two.sequence) == (1, 2) and one.kind == ProposerKind.MANUAL
    assert [s["stage"] for s in one.stages] == ["applies", "manifest", "imports", "duplicate"]
    assert all(s["ok"] for s in one.stages)
    assert one.parent_shas == [seed.sha] and one.params == {"submitted_by": owner.username}

    campaign = drive_tasks(campaign, passing({"human first": {"s0", "v0"}, "human second": {"s1"}}))

    assert campaign.state == CampaignState.FINISHED
    # Manual submissions are no part of the proposers' quota (max_proposals=1).
    assert campaign.stop_reason == "max proposals reached (1)"
    proposals = list(campaign.proposals.order_by("sequence"))
    assert [p.kind for p in proposals] == ["seed", "manual", "manual", "config"]
    one, two, config = proposals[1:]
    assert one.state == two.state == ProposalState.EVALUATED
    assert one.search_score == 0.25 and one.validation_score == 0.5
    # Evaluated in submission order, both before the config proposal was even drafted.
    assert one.search_evaluation.created_at < two.search_evaluation.created_at < config.created_at
    assert campaign.best_candidate == first


def test_it_waits_for_the_seed_when_submitted_before_the_start(
    project, seed, suite, policy_version, owner
):
    campaign = make_campaign(project, seed, suite, policy_version, max_proposals=1)
    submitted = human_commit(project, seed, {"notes/early.txt": b"e\n"}, "human early")

    proposal = campaign_submit_candidate(campaign=campaign, candidate=submitted, submitted_by=None)
    assert proposal.sequence == 1 and proposal.state == ProposalState.QUEUED
    assert proposal.params == {"submitted_by": "an anonymous caller"}

    campaign_start(campaign=campaign)
    campaign_advance(campaign_id=campaign.id)
    seed_proposal = campaign.proposals.get(kind=ProposerKind.SEED)
    assert seed_proposal.sequence == 0 and seed_proposal.state == ProposalState.EVALUATING
    proposal.refresh_from_db()
    assert proposal.state == ProposalState.QUEUED

    drive_tasks(campaign, passing({}))
    proposal.refresh_from_db()
    assert proposal.state == ProposalState.EVALUATED


def test_it_rejects_code_that_does_not_import_and_duplicate_trees(
    project, seed, suite, policy_version, owner
):
    campaign = make_campaign(project, seed, suite, policy_version)
    broken = human_commit(
        project, seed, {"agent.py": (AGENT + "\nimport no_such_module_here\n").encode()}, "broken"
    )

    rejected = campaign_submit_candidate(campaign=campaign, candidate=broken, submitted_by=owner)

    assert rejected.state == ProposalState.INVALID and rejected.finished_at
    assert rejected.stages[-1]["stage"] == "imports" and not rejected.stages[-1]["ok"]
    assert "no_such_module_here" in rejected.stages[-1]["reason"]
    assert rejected.state_detail.startswith("rejected at the imports stage")

    as_seed = campaign_submit_candidate(campaign=campaign, candidate=seed, submitted_by=owner)
    assert as_seed.state == ProposalState.INVALID
    assert as_seed.stages[-1] == {
        "stage": "duplicate",
        "ok": False,
        "reason": "the seed's own tree: it is evaluated as proposal 0",
    }
    fresh = human_commit(project, seed, {"notes/x.txt": b"x\n"}, "fresh")
    assert (
        campaign_submit_candidate(campaign=campaign, candidate=fresh, submitted_by=owner).state
        == ProposalState.QUEUED
    )
    again = campaign_submit_candidate(campaign=campaign, candidate=fresh, submitted_by=owner)
    assert again.state == ProposalState.INVALID
    assert again.stages[-1]["stage"] == "duplicate" and "proposal #" in again.stages[-1]["reason"]

    campaign_start(campaign=campaign)
    drive_tasks(campaign, passing({}))
    for invalid in (rejected, as_seed, again):
        invalid.refresh_from_db()
        assert invalid.state == ProposalState.INVALID and invalid.search_evaluation_id is None


def test_it_refuses_a_candidate_of_another_project_or_an_ended_campaign(
    project, seed, suite, policy_version, owner, tmp_path
):
    campaign = make_campaign(project, seed, suite, policy_version)
    other_project = project_get_or_create(slug="other", name="Other")
    (tmp_path / "other").mkdir()
    stranger = styled_seed(other_project, tmp_path / "other")
    with pytest.raises(InvalidInput, match="another project"):
        campaign_submit_candidate(campaign=campaign, candidate=stranger, submitted_by=owner)

    queued = campaign_submit_candidate(
        campaign=campaign,
        candidate=human_commit(project, seed, {"n.txt": b"n\n"}, "queued"),
        submitted_by=owner,
    )
    campaign_stop(campaign=campaign)
    queued.refresh_from_db()
    assert queued.state == ProposalState.FAILED
    assert "campaign stopped" in queued.state_detail
    with pytest.raises(InvalidState, match="is stopped"):
        campaign_submit_candidate(
            campaign=campaign,
            candidate=human_commit(project, seed, {"m.txt": b"m\n"}, "late"),
            submitted_by=owner,
        )
