"""Driving a campaign with per-task verdicts, and deriving candidates as a human would."""

from __future__ import annotations

from collections.abc import Callable

from coevo.campaigns.models import PROPOSAL_OPEN_STATES, Campaign, Proposal
from coevo.campaigns.runner import campaign_advance
from coevo.campaigns.services import campaign_create
from coevo.evaluations.models import (
    Evaluation,
    Rollout,
    RolloutState,
)
from coevo.evaluations.plans import EvaluationPlan
from coevo.evaluations.services import rollout_claim, rollout_finish
from harness_store.derive import candidate_derive
from harness_store.models import CandidateOrigin
from workers.outcomes import RolloutOutcome

# (outcome, detail) for a task of a proposal; the score follows the outcome.
# (outcome, detail) or (outcome, detail, error kind): the kind as the raise site gives it.
Verdict = Callable[[Proposal, Rollout], tuple[str, ...]]


def make_campaign(project, seed, suite, policy_version, **kwargs) -> Campaign:
    kwargs.setdefault("max_proposals", 3)
    # No staging: every task of the split runs, so per-task results are complete.
    kwargs.setdefault("plan", EvaluationPlan())
    return campaign_create(
        project=project,
        name="c",
        seed_candidate=seed,
        policy_version=policy_version,
        suite=suite,
        **kwargs,
    )


def human_commit(project, parent, changes: dict[str, bytes | None], message: str):
    candidate, created = candidate_derive(
        project=project,
        parents=[parent],
        changes=changes,
        message=message,
        author_name="A Human",
        origin=CandidateOrigin.MANUAL,
    )
    assert created
    return candidate


def finish_rollouts(proposal: Proposal, evaluation: Evaluation, verdict: Verdict) -> None:
    for rollout in Rollout.objects.filter(
        evaluation=evaluation, state=RolloutState.PENDING
    ).select_related("task"):
        if not rollout.enqueued_at:
            continue
        claimed = rollout_claim(rollout_id=rollout.id, worker="test")
        if claimed is None:
            continue
        outcome, detail, *kind = verdict(proposal, rollout)
        rollout_finish(
            rollout=claimed,
            outcome=outcome,
            error_kind=kind[0] if kind else "",
            score=1.0 if outcome == RolloutOutcome.PASSED else 0.0,
            detail=detail,
            answer="yes" if outcome == RolloutOutcome.PASSED else "no",
            prompt_tokens=5,
        )


def drive_tasks(campaign: Campaign, verdict: Verdict, max_rounds: int = 80) -> Campaign:
    """Advance until the campaign ends or waits (no open proposal after an advance)."""
    for _ in range(max_rounds):
        campaign_advance(campaign_id=campaign.id)
        campaign.refresh_from_db()
        if campaign.is_final:
            return campaign
        proposal = Proposal.objects.filter(
            campaign=campaign, state__in=PROPOSAL_OPEN_STATES
        ).first()
        if proposal is None:
            return campaign  # waiting for something outside the runner
        for evaluation_id in (proposal.search_evaluation_id, proposal.validation_evaluation_id):
            if evaluation_id:
                finish_rollouts(proposal, Evaluation.objects.get(id=evaluation_id), verdict)
    raise AssertionError(f"campaign still {campaign.state} after {max_rounds} rounds")


def passing(solved: dict[str, set[str]]) -> Verdict:
    """A verdict from ``{candidate message: task keys it solves}`` (others fail alike)."""

    def verdict(proposal: Proposal, rollout: Rollout) -> tuple[str, str]:
        subject = proposal.candidate.subject if proposal.candidate else ""
        tasks = next((keys for name, keys in solved.items() if subject.startswith(name)), set())
        if rollout.task.key in tasks:
            return RolloutOutcome.PASSED, "the answer equals the expected value"
        return RolloutOutcome.TASK_FAILURE, "the answer 'no' is not the expected value"

    return verdict
