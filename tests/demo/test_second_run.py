"""A second `coevo demo` in the same home (issue 38: its campaign refused its first proposals as
duplicates of the first run's candidates): it goes on from the first campaign's best candidate
with a new sampler seed, says so, and its proposals are evaluated. The demo's campaigns are
driven as the worker would leave them (tests/campaigns/support.drive, no rollout run): a
candidate whose ``order`` default is ``"priority"`` wins its games, any other loses (the naive
seed's ``"game"`` order wins nothing with Gemma either)."""

from __future__ import annotations

import tomllib

import pytest

from coevo.campaigns.models import Proposal, ProposalState, ProposerKind
from coevo.campaigns.proposers.config import optuna_storages_close
from coevo.demo.campaign import campaign_status, demo_campaign
from coevo.demo.campaign_start import DEFAULT_SEED
from coevo.demo.run import DemoOptions
from harness_store.selectors import candidate_read_file
from tests.campaigns.support import drive

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_queue")]

# As `coevo demo` runs it with its default options, on the smallest slice.
DEFAULTS = DemoOptions()


@pytest.fixture(autouse=True)
def _close_optuna_storages():
    yield
    optuna_storages_close()


def priority_wins(proposal: Proposal) -> bool:
    manifest = tomllib.loads(
        candidate_read_file(candidate=proposal.candidate, path="harness.toml").decode()
    )
    return manifest["knobs"]["order"]["default"] == "priority"


def run_campaign(project, owner):
    """What one `coevo demo` run makes of its campaign, with the demo's default seed option."""
    return demo_campaign(
        project=project,
        user=owner,
        games=1,
        max_steps=4,
        proposals=DEFAULTS.campaign_proposals,
        seed=DEFAULTS.campaign_seed,
    )


def refused_as_duplicates(campaign) -> list[str]:
    return [
        proposal.state_detail
        for proposal in campaign.proposals.exclude(kind=ProposerKind.SEED).order_by("sequence")
        if any(stage["stage"] == "duplicate" and not stage["ok"] for stage in proposal.stages)
    ]


def test_a_second_run_goes_on_from_the_first_runs_best_with_a_new_seed(
    project, owner, policy_version, capsys
):
    first = drive(run_campaign(project, owner), priority_wins)
    said_first = capsys.readouterr().out
    assert first.seed == DEFAULT_SEED
    assert first.best_candidate_id != first.seed_candidate_id, "the first run found nothing"

    second = run_campaign(project, owner)
    said = capsys.readouterr().out
    second = drive(second, priority_wins)

    assert refused_as_duplicates(second) == []
    proposals = second.proposals.exclude(kind=ProposerKind.SEED).order_by("sequence")
    assert len(proposals) == DEFAULTS.campaign_proposals
    assert proposals[0].state != ProposalState.INVALID
    # Where it started, with which seed, and why, in the demo's output.
    assert second.seed_candidate_id == first.best_candidate_id
    assert second.seed not in (first.seed, None)
    assert f"goes on from {first.name!r}" in said
    assert f"best candidate {first.best_candidate.short_sha} (100.0% validation there)" in said
    assert f"seed {second.seed}, one no earlier campaign here used" in said
    # It starts at the first run's best: its seed proposal is that candidate, and it wins.
    assert second.best_validation_score == 1.0
    assert "the first demo campaign in this project: from the naive seed" in said_first


def test_an_explicit_seed_used_before_is_kept_and_said_to_repeat_its_draws(
    project, owner, policy_version, capsys
):
    first = drive(run_campaign(project, owner), priority_wins)
    capsys.readouterr()

    second = demo_campaign(
        project=project, user=owner, games=1, max_steps=4, proposals=1, seed=first.seed
    )

    assert second.seed == first.seed
    assert second.seed_candidate_id == first.best_candidate_id
    said = capsys.readouterr().out
    assert f"seed {first.seed}, as asked, although {first.name!r} used it" in said
    assert "leave out --campaign-seed for a new seed" in said


def test_the_status_says_nothing_is_evaluated_before_the_seeds_validation(
    project, owner, policy_version
):
    campaign = run_campaign(project, owner)

    assert "best validation: nothing evaluated on validation yet" in campaign_status(campaign)
    assert "0.0%" not in campaign_status(campaign)

    campaign = drive(campaign, lambda proposal: False)
    assert "best validation 0.0% (the seed)" in campaign_status(campaign)
