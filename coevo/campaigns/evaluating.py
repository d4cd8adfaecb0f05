"""Following a proposal through its evaluations (search, then validation) and ending it:
scores, the smoke stage, the best candidate and policy, what the proposer is told. Called by
the runner and the policy steps under the campaign's row lock."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from django.db import models
from django.db.models import Sum
from django.utils import timezone

from coevo.campaigns.models import (
    PROPOSAL_OPEN_STATES,
    Campaign,
    CampaignState,
    Proposal,
    ProposalState,
    ProposerKind,
)
from coevo.campaigns.patterns import failure_patterns_check_regressions, failure_patterns_update
from coevo.campaigns.proposers import ProposalOutcome, proposer_for_proposal
from coevo.campaigns.proposers.base import stage
from coevo.campaigns.stop_rules import campaign_finish
from coevo.errors import BudgetExceeded, CoevoError
from coevo.evaluations.models import Evaluation, EvaluationState, Rollout, StageKind
from coevo.evaluations.plans import EvaluationPlan
from coevo.evaluations.selectors import evaluation_task_scores
from coevo.evaluations.services import evaluation_create
from workers.outcomes import RolloutOutcome

logger = logging.getLogger(__name__)


def search_start(campaign: Campaign, proposal: Proposal) -> bool:
    plan, reference = _search_plan(campaign)
    evaluation = _create_evaluation(
        campaign, proposal, split=campaign.search_split, plan=plan, reference=reference
    )
    if evaluation is None:
        return False
    _search_started(proposal, evaluation)
    return False


def search_evaluation_create(*, campaign: Campaign, proposal: Proposal, paced: bool) -> Evaluation:
    """The proposal's search evaluation as search_start makes it (paired against the same
    reference, early-stopped the same way), for a race that paces it; raises what
    evaluation_create raises (BudgetExceeded: nothing reserved) for the race to decide."""
    plan, reference = _search_plan(campaign)
    evaluation = _evaluation_of(
        campaign, proposal, split=campaign.search_split, plan=plan, reference=reference, paced=paced
    )
    _search_started(proposal, evaluation)
    return evaluation


def _search_plan(campaign: Campaign) -> tuple[EvaluationPlan, Evaluation | None]:
    plan = EvaluationPlan.from_dict(campaign.plan)
    reference = _reference(campaign)
    if reference is None and plan.early_stop:
        plan = dataclasses.replace(plan, early_stop=False)
    return plan, reference


def _search_started(proposal: Proposal, evaluation: Evaluation) -> None:
    Proposal.objects.filter(id=proposal.id).update(
        search_evaluation=evaluation, state=ProposalState.EVALUATING, updated_at=timezone.now()
    )


def _start_validation(campaign: Campaign, proposal: Proposal) -> bool:
    evaluation = _create_evaluation(
        campaign, proposal, split=campaign.validation_split, plan=EvaluationPlan(), reference=None
    )
    if evaluation is None:
        return False
    Proposal.objects.filter(id=proposal.id).update(
        validation_evaluation=evaluation, updated_at=timezone.now()
    )
    return False


def _reference(campaign: Campaign) -> Evaluation | None:
    """What search evaluations are paired against: the seed's, or, once a policy step was
    adopted, that step's (the best candidate under the policy now in use)."""
    active = campaign.active_policy_version
    baseline = (
        Proposal.objects.filter(
            campaign=campaign,
            kind__in=[ProposerKind.SEED, ProposerKind.POLICY],
            search_evaluation__isnull=False,
        )
        .filter(models.Q(policy_version=active) | models.Q(policy_version__isnull=True))
        .order_by("-sequence")
        .first()
    )
    if baseline is None:
        return None
    evaluation = baseline.search_evaluation
    return evaluation if evaluation.state == EvaluationState.FINISHED else None


def _create_evaluation(
    campaign: Campaign,
    proposal: Proposal,
    *,
    split: str,
    plan: EvaluationPlan,
    reference: Evaluation | None,
) -> Evaluation | None:
    try:
        return _evaluation_of(campaign, proposal, split=split, plan=plan, reference=reference)
    except BudgetExceeded as exc:
        proposal_end(campaign, proposal, ProposalState.FAILED, f"not evaluated: {exc}")
        campaign_finish(campaign, CampaignState.FINISHED, f"budget spent: {exc}")
        return None
    except CoevoError as exc:
        proposal_end(campaign, proposal, ProposalState.FAILED, f"not evaluated: {exc}")
        campaign_finish(campaign, CampaignState.FAILED, f"proposal {proposal.sequence}: {exc}")
        return None


def _evaluation_of(
    campaign: Campaign,
    proposal: Proposal,
    *,
    split: str,
    plan: EvaluationPlan,
    reference: Evaluation | None,
    paced: bool = False,
) -> Evaluation:
    return evaluation_create(
        candidate=proposal.candidate,
        suite=campaign.suite,
        split=split,
        policy_version=proposal.policy_version or campaign.active_policy_version,
        epochs=campaign.epochs,
        seed=campaign.seed,
        plan=plan,
        reference=reference,
        parent_budget=campaign.budget,
        created_by=campaign.created_by,
        paced=paced,
    )


def proposal_follow(campaign: Campaign, proposal: Proposal) -> bool:
    """The open proposal's next step, once its current evaluation is final (a policy step's
    stages before its evaluation are ``policy_steps.policy_step_follow``'s)."""
    if proposal.search_evaluation_id is None:
        # Recorded, but its evaluation was never created (a crash between the two): start it.
        return search_start(campaign, proposal)
    if proposal.validation_evaluation_id is None:
        search = Evaluation.objects.get(id=proposal.search_evaluation_id)
        if not search.is_final:
            return False
        return _search_done(campaign, proposal, search)
    validation = Evaluation.objects.get(id=proposal.validation_evaluation_id)
    if not validation.is_final:
        return False
    return _validation_done(campaign, proposal, validation)


def _search_done(campaign: Campaign, proposal: Proposal, search: Evaluation) -> bool:
    score, tokens = evaluation_score(search)
    stages = list(proposal.stages)
    smoke = search.stages.filter(kind=StageKind.SMOKE).first()
    if proposal.kind != ProposerKind.SEED:
        if smoke is None:
            stages.append(stage("smoke", True, "the plan has no smoke stage"))
        elif smoke.state == "failed":
            stages.append(stage("smoke", False, _smoke_reason(search, smoke)))
        elif smoke.state == "passed":
            stages.append(
                stage("smoke", True, f"{smoke.tasks} smoke rollout(s) without harness error")
            )
    Proposal.objects.filter(id=proposal.id).update(
        search_score=score, tokens_per_task=tokens, stages=stages, updated_at=timezone.now()
    )
    proposal.refresh_from_db()
    if search.state == EvaluationState.FINISHED:
        failure_patterns_update(campaign=campaign, evaluation=search)
    if search.state != EvaluationState.FINISHED:
        proposal_end(
            campaign,
            proposal,
            ProposalState.FAILED,
            f"search evaluation {search.state}: {search.state_detail or search.stop_reason}",
        )
        return True
    if any(not s["ok"] for s in stages):
        proposal_end(
            campaign,
            proposal,
            ProposalState.INVALID,
            f"rejected at the smoke stage: {stages[-1]['reason']}",
        )
        return True
    if "clearly worse" in search.stop_reason:
        proposal_end(
            campaign,
            proposal,
            ProposalState.EVALUATED,
            f"not validated: the search evaluation {search.stop_reason}",
            outcome=ProposalOutcome.PRUNED,
        )
        return True
    return _start_validation(campaign, proposal)


def _smoke_reason(search: Evaluation, smoke: Any) -> str:
    """The smoke stage's verdict with the first harness error's own words (what crashed)."""
    crashed = (
        Rollout.objects.filter(
            evaluation=search, stage=smoke.index, outcome=RolloutOutcome.HARNESS_ERROR
        )
        .order_by("finished_at")
        .values_list("detail", flat=True)
        .first()
    )
    return f"{smoke.reason}: {crashed[:500]}" if crashed else smoke.reason


def _validation_done(campaign: Campaign, proposal: Proposal, validation: Evaluation) -> bool:
    if validation.state != EvaluationState.FINISHED:
        proposal_end(
            campaign,
            proposal,
            ProposalState.FAILED,
            f"validation evaluation {validation.state}: {validation.state_detail}",
        )
        return True
    score, tokens = evaluation_score(validation)
    Proposal.objects.filter(id=proposal.id).update(
        validation_score=score, tokens_per_task=tokens, updated_at=timezone.now()
    )
    proposal.refresh_from_db()
    proposal_end(campaign, proposal, ProposalState.EVALUATED, "", outcome=ProposalOutcome.COMPLETE)
    return True


def proposal_end(
    campaign: Campaign,
    proposal: Proposal,
    state: str,
    detail: str,
    *,
    outcome: str = ProposalOutcome.FAIL,
) -> None:
    moved = Proposal.objects.filter(id=proposal.id, state__in=PROPOSAL_OPEN_STATES).update(
        state=state,
        state_detail=detail[:5000],
        finished_at=timezone.now(),
        updated_at=timezone.now(),
    )
    if not moved:
        return
    improved = False
    if state == ProposalState.EVALUATED and proposal.validation_score is not None:
        best = campaign.best_validation_score
        improved = best is None or proposal.validation_score > best
        if improved:
            Proposal.objects.filter(id=proposal.id).update(improved=True)
            campaign.best_candidate = proposal.candidate
            campaign.best_validation_score = proposal.validation_score
            campaign.best_policy_version = proposal.policy_version
            campaign.proposals_since_improvement = 0
            fields = [
                "best_candidate",
                "best_validation_score",
                "best_policy_version",
                "proposals_since_improvement",
                "updated_at",
            ]
            if proposal.kind == ProposerKind.POLICY:
                # Adopted: later proposals are evaluated under the new policy version.
                campaign.current_policy_version = proposal.policy_version
                fields.append("current_policy_version")
            campaign.save(update_fields=fields)

            failure_patterns_check_regressions(campaign=campaign)
    if proposal.kind == ProposerKind.SEED:
        return
    if not improved:
        count_no_improvement(campaign)
    proposer = proposer_for_proposal(campaign=campaign, kind=proposal.kind)
    if proposer is not None:
        proposer.tell(
            trial_number=proposal.trial_number,
            outcome=outcome,
            value=proposal.validation_score if outcome == ProposalOutcome.COMPLETE else None,
        )


def count_no_improvement(campaign: Campaign) -> None:
    campaign.proposals_since_improvement += 1
    campaign.save(update_fields=["proposals_since_improvement", "updated_at"])


def evaluation_score(evaluation: Evaluation) -> tuple[float | None, float | None]:
    """Mean per-task score and policy tokens per task (None when nothing was scored)."""
    scores = evaluation_task_scores(evaluation_id=evaluation.id)
    if not scores:
        return None, None
    mean = sum(sum(v) / len(v) for v in scores.values()) / len(scores)
    tokens = Rollout.objects.filter(evaluation=evaluation).aggregate(
        p=Sum("prompt_tokens"), c=Sum("completion_tokens")
    )
    total = (tokens["p"] or 0) + (tokens["c"] or 0)
    return mean, total / len(scores)
