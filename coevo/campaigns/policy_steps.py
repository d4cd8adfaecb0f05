"""A policy step of an alternating campaign, taken by the runner under the campaign's lock.

    export   the best candidate's harness-matched rollouts (search split, current policy)
    train    the configured trainer on that export (coevo/training: a training worker runs it)
    register the adapter it wrote becomes a PolicyVersion whose parent is the current policy
    then     the best candidate is evaluated under the new version like any proposal (search,
             then validation); if it raises the best validation score, the campaign adopts
             the new version and later harness proposals run under it.

Each stage is recorded on the proposal (``stages``) as it ends; a stage that fails ends the
step as invalid, with the reason, and the campaign goes on.
"""

from __future__ import annotations

import logging
from dataclasses import asdict

from django.db.models import Q
from django.utils import timezone

from coevo.campaigns.alternation import (
    Alternation,
    EndedProposal,
    Phase,
    alternation_read,
    phase_of,
)
from coevo.campaigns.evaluating import proposal_end, search_start
from coevo.campaigns.models import Campaign, Proposal, ProposalState, ProposerKind
from coevo.campaigns.proposers.base import stage
from coevo.errors import CoevoError
from coevo.exports.models import ExportState
from coevo.exports.services import trajectory_export_create
from coevo.training.services import training_run_create
from coevo.training.trainers import trainer_get

logger = logging.getLogger(__name__)


def next_phase(campaign: Campaign) -> Phase:
    ended = (
        Proposal.objects.filter(
            campaign=campaign,
            state__in=[ProposalState.EVALUATED, ProposalState.INVALID, ProposalState.FAILED],
        )
        .exclude(kind__in=[ProposerKind.SEED, ProposerKind.MANUAL])
        .order_by("sequence")
        .values_list("kind", "improved")
    )
    steps = [
        EndedProposal(policy=kind == ProposerKind.POLICY, improved=improved)
        for kind, improved in ended
    ]
    return phase_of(alternation=alternation_read(stored=campaign.alternation), steps=steps)


def _alternation(campaign: Campaign) -> Alternation:
    alternation = alternation_read(stored=campaign.alternation)
    if alternation is None:
        raise CoevoError(f"campaign {campaign.id} alternates no policy steps")
    return alternation


def policy_step_start(campaign: Campaign, sequence: int) -> bool:
    """Record the step and create its export (built by a worker; the step waits for it)."""
    best = campaign.best_candidate
    parent = campaign.active_policy_version
    config = _alternation(campaign)
    wanted = config.export
    shown = {
        "export": {
            "candidate": best.sha,
            "policy_version": parent.name,
            "split": campaign.search_split,
            **asdict(wanted),
        }
    }
    proposal = Proposal.objects.create(
        campaign=campaign,
        sequence=sequence,
        kind=ProposerKind.POLICY,
        parent_shas=[best.sha],
        candidate=best,
        shown=shown,
        params={"trainer": config.trainer, "parent_policy": parent.name},
        state=ProposalState.PROPOSED,
    )
    if campaign.state_detail:
        Campaign.objects.filter(id=campaign.id).update(state_detail="")
    try:
        export = trajectory_export_create(
            project=campaign.project,
            format=wanted.format,
            created_by=campaign.created_by,
            splits=[campaign.search_split],
            candidate=best,
            policy_version=parent,
            suite=campaign.suite,
            successful_only=wanted.successful_only,
            min_score=wanted.min_score,
            last_turns=wanted.last_turns,
        )
    except CoevoError as exc:
        return _reject(campaign, proposal, "export", str(exc))
    Proposal.objects.filter(id=proposal.id).update(export=export, updated_at=timezone.now())
    logger.info("campaign %s: policy step %d exporting (%s)", campaign.id, sequence, export.id)
    return False


def policy_step_follow(campaign: Campaign, proposal: Proposal) -> bool:
    """The step's next stage once the current one ended (export → train → evaluate)."""
    if proposal.export_id is None:
        return _reject(campaign, proposal, "export", "the step was recorded without its export")
    if proposal.training_run_id is None:
        return _after_export(campaign, proposal)
    run = proposal.training_run
    if not run.is_final:
        return False
    if run.state != "succeeded":
        return _reject(campaign, proposal, "train", f"training {run.state}: {run.state_detail}")
    stages = [
        *proposal.stages,
        stage("train", True, f"{run.trainer.name} exited 0 in {run.duration_s or 0:.0f} s"),
        stage("register", True, run.state_detail),
    ]
    Proposal.objects.filter(id=proposal.id).update(
        stages=stages, policy_version=run.policy_version, updated_at=timezone.now()
    )
    proposal.refresh_from_db()
    return search_start(campaign, proposal)


def _after_export(campaign: Campaign, proposal: Proposal) -> bool:
    export = proposal.export
    if not export.is_final:
        return False
    if export.state == ExportState.FAILED:
        return _reject(campaign, proposal, "export", f"the export failed: {export.state_detail}")
    if export.rows == 0:
        return _reject(
            campaign,
            proposal,
            "export",
            f"nothing to train on: the best candidate's {export.rollouts} matching rollout(s) "
            "gave no rows (successful_only / min_score filter them all out?)",
        )
    stages = [
        *proposal.stages,
        stage("export", True, f"{export.rows} row(s) from {export.rollouts} rollout(s)"),
    ]
    try:
        config = _alternation(campaign)
        trainer = trainer_get(name=config.trainer)
        run = training_run_create(
            project=campaign.project,
            trainer=trainer,
            export=export,
            parent_policy=campaign.active_policy_version,
            time_limit_s=config.time_limit_s,
            created_by=campaign.created_by,
        )
    except CoevoError as exc:
        Proposal.objects.filter(id=proposal.id).update(stages=stages)
        proposal.refresh_from_db()
        return _reject(campaign, proposal, "train", str(exc))
    Proposal.objects.filter(id=proposal.id).update(
        stages=stages, training_run=run, updated_at=timezone.now()
    )
    return False


def _reject(campaign: Campaign, proposal: Proposal, at: str, reason: str) -> bool:
    stages = [*proposal.stages, stage(at, False, reason)]
    Proposal.objects.filter(id=proposal.id).update(stages=stages)
    proposal.refresh_from_db()
    proposal_end(campaign, proposal, ProposalState.INVALID, f"rejected at the {at} stage: {reason}")
    return True


def campaigns_with_open_step(*, export_id: object = None, run_id: object = None) -> set:
    """Campaigns whose open policy step waits on this export or training run."""
    query = Q()
    if export_id is not None:
        query |= Q(export_id=export_id)
    if run_id is not None:
        query |= Q(training_run_id=run_id)
    return set(
        Proposal.objects.filter(
            query, kind=ProposerKind.POLICY, state=ProposalState.PROPOSED
        ).values_list("campaign_id", flat=True)
    )
