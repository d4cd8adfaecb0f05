"""The campaign runner's decisions, with rollouts finished by hand (no worker)."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from coevo.campaigns.models import CampaignState, Proposal, ProposalState, ProposerKind
from coevo.campaigns.proposers.base import ProposalOutcome
from coevo.campaigns.proposers.config import ConfigProposer, optuna_storage, study_name
from coevo.campaigns.runner import campaign_advance
from coevo.campaigns.services import (
    campaign_create,
    campaign_pause,
    campaign_resume,
    campaign_start,
    campaign_stop,
)
from coevo.errors import InvalidInput, InvalidState
from coevo.evaluations.ledger import BudgetLimits
from harness_store.derive import candidate_derive
from tests.campaigns.support import drive

pytestmark = pytest.mark.django_db(transaction=True)


def make(project, seed, suite, policy_version, **kwargs):
    kwargs.setdefault("max_proposals", 3)
    return campaign_create(
        project=project,
        name="c1",
        seed_candidate=seed,
        policy_version=policy_version,
        suite=suite,
        **kwargs,
    )


def good(proposal) -> bool:
    return proposal.candidate is not None and "good" in proposal.candidate.message


def test_it_refuses_a_strategy_it_cannot_run(project, seed, suite, policy_version):
    with pytest.raises(InvalidInput, match="submitted"):
        make(project, seed, suite, policy_version, strategy=[{"kind": "manual"}])
    with pytest.raises(InvalidInput, match="unknown proposer"):
        make(project, seed, suite, policy_version, strategy=[{"kind": "genetic"}])
    with pytest.raises(InvalidInput, match="not declared"):
        make(
            project,
            seed,
            suite,
            policy_version,
            strategy=[{"kind": "config", "options": {"knobs": ["nope"]}}],
        )


def test_it_returns_the_existing_candidate_for_a_derived_duplicate_tree(project, seed):
    same, created = candidate_derive(
        project=project, parents=[seed], changes={}, message="same", author_name="t"
    )
    assert (same, created) == (seed, False)
    other, created = candidate_derive(
        project=project,
        parents=[seed],
        changes={"notes.txt": b"hi"},
        message="other",
        author_name="t",
    )
    assert created and other.parent_shas == [seed.sha]


def test_it_rejects_duplicate_trees_at_the_duplicate_stage(project, seed, suite, policy_version):
    campaign = make(
        project,
        seed,
        suite,
        policy_version,
        max_proposals=4,
        strategy=[{"kind": "config", "options": {"knobs": ["style"]}}],
    )
    campaign_start(campaign=campaign)
    campaign = drive(campaign, good)

    assert campaign.stop_reason == "max proposals reached (4)"
    proposals = list(campaign.proposals.exclude(kind=ProposerKind.SEED))
    duplicates = [p for p in proposals if p.state == ProposalState.INVALID]
    # Only two trees exist (style=bad is the seed's): at least three of four are duplicates.
    assert len(duplicates) >= 3
    for p in duplicates:
        assert p.stages[-1]["stage"] == "duplicate" and not p.stages[-1]["ok"]
        assert p.search_evaluation_id is None
    study = optuna_storage().get_study_id_from_name(study_name(campaign))
    assert study is not None


def test_it_continues_the_optuna_study_after_a_restart(project, seed, suite, policy_version):
    campaign = make(project, seed, suite, policy_version)
    first = ConfigProposer(campaign, {}).propose(history=[])
    ConfigProposer(campaign, {}).tell(
        trial_number=first.trial_number, outcome=ProposalOutcome.COMPLETE, value=0.5
    )
    # A new object, as after a worker restart, and a trial left RUNNING by a lost transaction.
    orphan = ConfigProposer(campaign, {}).propose(history=[])
    resumed = ConfigProposer(campaign, {}).propose(history=[])

    assert (first.trial_number, orphan.trial_number, resumed.trial_number) == (0, 1, 2)
    states = [t.state.name for t in ConfigProposer(campaign, {}).study.trials]
    assert states == ["COMPLETE", "FAIL", "RUNNING"]
    assert resumed.shown["trials"][0] == {
        "number": 0,
        "params": first.params,
        "state": "COMPLETE",
        "value": 0.5,
    }


def test_it_finishes_at_max_proposals_with_the_best_chosen_on_validation(
    project, seed, suite, policy_version
):
    campaign = make(project, seed, suite, policy_version, max_proposals=3)
    campaign_start(campaign=campaign)
    campaign = drive(campaign, good)
    assert campaign.state == CampaignState.FINISHED
    assert campaign.proposals.exclude(kind=ProposerKind.SEED).count() == 3
    evaluated = campaign.proposals.filter(
        state=ProposalState.EVALUATED, validation_score__isnull=False
    )
    best = max(evaluated, key=lambda p: p.validation_score)
    assert campaign.best_validation_score == best.validation_score
    assert campaign.best_candidate_id == best.candidate_id


def test_it_stops_when_patience_runs_out(project, seed, suite, policy_version):
    campaign = make(project, seed, suite, policy_version, max_proposals=10, patience=2)
    campaign_start(campaign=campaign)
    campaign = drive(campaign, lambda proposal: False)
    assert campaign.stop_reason.startswith("patience exhausted")
    assert campaign.proposals.exclude(kind=ProposerKind.SEED).count() == 2
    assert campaign.best_candidate == seed


def test_it_stops_when_the_target_is_reached(project, seed, suite, policy_version):
    campaign = make(project, seed, suite, policy_version, max_proposals=10, target_score=0.9)
    campaign_start(campaign=campaign)
    campaign = drive(campaign, lambda proposal: True)
    assert campaign.stop_reason.startswith("target reached")
    assert campaign.proposals.count() == 1  # the seed alone reached it


def test_it_finishes_when_the_budget_is_spent(project, seed, suite, policy_version):
    # The seed's search (4) and validation (2) rollouts fit; a proposal's search does not.
    campaign = make(
        project,
        seed,
        suite,
        policy_version,
        max_proposals=10,
        budget_limits=BudgetLimits(rollouts=8),
    )
    campaign_start(campaign=campaign)
    campaign = drive(campaign, lambda proposal: False)
    assert campaign.state == CampaignState.FINISHED
    assert "budget" in campaign.stop_reason
    failed = campaign.proposals.filter(state=ProposalState.FAILED)
    assert [p.state_detail.startswith("not evaluated") for p in failed] == [True]


def test_it_pauses_resumes_and_stops_with_compare_and_swap(project, seed, suite, policy_version):
    campaign = make(project, seed, suite, policy_version)
    with pytest.raises(InvalidState):
        campaign_pause(campaign=campaign)
    campaign_start(campaign=campaign)
    campaign_advance(campaign_id=campaign.id)
    seed_proposal = campaign.proposals.get()
    campaign = campaign_pause(campaign=campaign)
    assert campaign.state == CampaignState.PAUSED
    assert (
        seed_proposal.search_evaluation.__class__.objects.get(
            id=seed_proposal.search_evaluation_id
        ).state
        == "paused"
    )
    campaign_advance(campaign_id=campaign.id)  # paused: nothing happens
    assert campaign.proposals.count() == 1
    with pytest.raises(InvalidState):
        campaign_start(campaign=campaign)
    campaign = campaign_resume(campaign=campaign)
    assert campaign.state == CampaignState.RUNNING
    campaign = campaign_stop(campaign=campaign, reason="stopped by owner")
    assert (campaign.state, campaign.stop_reason) == (CampaignState.STOPPED, "stopped by owner")
    seed_proposal.refresh_from_db()
    assert seed_proposal.state == ProposalState.FAILED
    assert seed_proposal.search_evaluation.state == "cancelled"
    with pytest.raises(InvalidState):
        campaign_resume(campaign=campaign)


def run_beat_watchdog() -> None:
    """The task beat's schedule names, run as the worker runs it (in this process)."""
    from django.conf import settings

    from coevo.celery import app

    app.loader.import_default_modules()  # a worker's autodiscovery, as at its start
    name = settings.CELERY_BEAT_SCHEDULE["rollouts-watchdog"]["task"]
    app.tasks[name].apply(throw=True)


def test_the_watchdog_leaves_a_paused_campaign_paused(project, seed, suite, policy_version):
    from coevo.evaluations.lifecycle import evaluation_pause
    from coevo.evaluations.models import Evaluation, EvaluationState, PauseKind

    campaign = make(project, seed, suite, policy_version)
    campaign_start(campaign=campaign)
    campaign_advance(campaign_id=campaign.id)
    evaluation_id = campaign.proposals.get().search_evaluation_id
    campaign_pause(campaign=campaign)

    run_beat_watchdog()  # the policy server answers: an outage pause would end here
    evaluation = Evaluation.objects.get(id=evaluation_id)
    assert (evaluation.state, evaluation.pause_kind) == (EvaluationState.PAUSED, "campaign")

    # An outage pause ends by itself; a campaign pausing over it takes it over.
    campaign_resume(campaign=campaign)
    assert evaluation_pause(
        evaluation_id=evaluation_id, reason="down", kind=PauseKind.POLICY_OUTAGE
    )
    run_beat_watchdog()
    evaluation.refresh_from_db()
    assert (evaluation.state, evaluation.pause_kind) == (EvaluationState.RUNNING, "")
    assert evaluation_pause(
        evaluation_id=evaluation_id, reason="down", kind=PauseKind.POLICY_OUTAGE
    )
    campaign_pause(campaign=campaign)
    run_beat_watchdog()
    evaluation.refresh_from_db()
    assert (evaluation.state, evaluation.pause_kind) == (EvaluationState.PAUSED, "campaign")
    campaign_resume(campaign=campaign)
    evaluation.refresh_from_db()
    assert (evaluation.state, evaluation.pause_kind) == (EvaluationState.RUNNING, "")


def test_it_creates_one_proposal_when_advanced_twice_at_once(project, seed, suite, policy_version):
    campaign = make(project, seed, suite, policy_version)
    campaign_start(campaign=campaign)
    barrier = threading.Barrier(2)
    errors = []

    def advance():
        try:
            barrier.wait()
            campaign_advance(campaign_id=campaign.id)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=advance) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert Proposal.objects.filter(campaign=campaign).count() == 1
    assert Proposal.objects.get(campaign=campaign).search_evaluation_id is not None
