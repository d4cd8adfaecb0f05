"""A campaign's stop rules and how it ends (under the campaign's row lock, from the runner)."""

from __future__ import annotations

import logging
from decimal import Decimal

from django.utils import timezone

from coevo.campaigns.models import Campaign, CampaignState, Proposal, ProposalState, ProposerKind
from coevo.campaigns.transitions import campaign_move
from coevo.evaluations.models import Budget

logger = logging.getLogger(__name__)


def stop_rule(campaign: Campaign) -> str:
    # Manual submissions are people's explicit requests, not the proposers' quota.
    # Policy steps have their own quota (alternation.max_policy_steps).
    proposals = Proposal.objects.filter(campaign=campaign).exclude(
        kind__in=[ProposerKind.SEED, ProposerKind.MANUAL, ProposerKind.POLICY]
    )
    if campaign.target_score is not None and (
        campaign.best_validation_score is not None
        and campaign.best_validation_score >= campaign.target_score
    ):
        return (
            f"target reached: validation score {campaign.best_validation_score:.3f} ≥ "
            f"{campaign.target_score:.3f}"
        )
    if proposals.count() >= campaign.max_proposals:
        return f"max proposals reached ({campaign.max_proposals})"
    if campaign.max_candidates is not None:
        made = (
            proposals.filter(candidate__isnull=False).exclude(state=ProposalState.INVALID).count()
        )
        if made >= campaign.max_candidates:
            return f"max candidates reached ({campaign.max_candidates})"
    if campaign.patience is not None and campaign.proposals_since_improvement >= campaign.patience:
        return (
            f"patience exhausted: no validation improvement in the last "
            f"{campaign.proposals_since_improvement} proposal(s)"
        )
    spent = budget_spent(campaign.budget)
    if spent:
        return spent
    return proposer_budget_spent(campaign.budget)


def budget_spent(budget: Budget) -> str:
    budget.refresh_from_db()
    for field, unit in (("rollouts", "rollouts"), ("tokens", "tokens"), ("wall_s", "seconds")):
        limit = getattr(budget, f"limit_{field}")
        used = getattr(budget, f"reserved_{field}") + getattr(budget, f"spent_{field}")
        if limit is not None and used >= limit:
            return f"budget spent: {used:,} of {limit:,} {unit}"
    return _dollars_spent(budget, "usd", "dollar budget spent")


def _dollars_spent(budget: Budget, field: str, what: str) -> str:
    limit = getattr(budget, f"limit_{field}")
    used = Decimal(getattr(budget, f"reserved_{field}")) + Decimal(
        getattr(budget, f"spent_{field}")
    )
    if limit is not None and used >= limit:
        return f"{what}: ${used:,.4f} of ${Decimal(limit):,.4f}"
    return ""


def proposer_budget_spent(budget: Budget) -> str:
    """Checked before each draft (after budget_spent refreshed the budget): a draft is charged
    once written, so the last one may pass the limit, and the reason says by how much."""
    tokens = budget.reserved_proposer_tokens + budget.spent_proposer_tokens
    tokens_limit = budget.limit_proposer_tokens
    if tokens_limit is not None and tokens >= tokens_limit:
        return f"proposer token budget spent: {tokens:,} of {tokens_limit:,} tokens"
    wall_ms = budget.reserved_proposer_wall_ms + budget.spent_proposer_wall_ms
    wall_limit = budget.limit_proposer_wall_ms
    if wall_limit is not None and wall_ms >= wall_limit:
        return (
            f"proposer wall-time budget spent: {wall_ms / 1000:,.1f} of {wall_limit / 1000:,.1f} s"
        )
    return _dollars_spent(budget, "proposer_usd", "proposer dollar budget spent")


def campaign_finish(campaign: Campaign, state: str, reason: str) -> None:
    """Running → ``state`` (finished by a stop rule, or failed), with the reason."""
    move = {CampaignState.FINISHED: "finish", CampaignState.FAILED: "fail"}[state]
    moved = campaign_move(
        campaign_id=campaign.id, move=move, stop_reason=reason, finished_at=timezone.now()
    )
    if moved:
        Proposal.objects.filter(campaign=campaign, state=ProposalState.QUEUED).update(
            state=ProposalState.FAILED,
            state_detail=f"not evaluated: the campaign {state} first ({reason})"[:5000],
            finished_at=timezone.now(),
            updated_at=timezone.now(),
        )
    logger.info("campaign %s %s: %s", campaign.id, state, reason)
