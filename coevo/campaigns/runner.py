"""The campaign runner: one proposal at a time, each step taken under the campaign's row lock.

``campaign_advance`` is idempotent: it looks at where the campaign is (the open proposal and
its evaluations) and takes the next step, so a redelivered task, two workers at once, or the
beat job finding a campaign whose signal was lost all do the right thing at most once.

Proposal 0 is the seed: evaluated on both splits like any other, it is the reference that
search evaluations are paired against and the first "best".

One thing happens outside the lock: a slow proposer's model call (llm-patch). The locked step
marks the campaign as drafting (``drafting_sequence``/``drafting_at``) and hands out a ticket;
the draft is written with no transaction open, then recorded under the lock only if the
campaign still runs and still wants that draft. Alternating campaigns' policy steps are in
``coevo.campaigns.policy_steps``.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from django.db import models, transaction
from django.db.models import Max, Sum
from django.utils import timezone

from coevo.campaigns.models import (
    PROPOSAL_OPEN_STATES,
    Campaign,
    CampaignState,
    Proposal,
    ProposalState,
    ProposerKind,
)
from coevo.campaigns.proposers import Draft, Outcome, proposer_for, proposer_for_proposal
from coevo.campaigns.proposers.base import stage
from coevo.errors import BudgetExceeded, CoevoError
from coevo.evaluations.models import Budget, Evaluation, EvaluationState, Rollout, StageKind
from coevo.evaluations.models import Outcome as RolloutOutcome
from coevo.evaluations.plans import EvaluationPlan
from coevo.evaluations.selectors import evaluation_task_scores
from harness_store.derive import candidate_derive

logger = logging.getLogger(__name__)

# Steps taken in one call at most (invalid proposals cost no evaluation, so several can be
# decided at once); the next signal or beat tick goes on from there.
MAX_STEPS_PER_CALL = 20
# A draft older than this was abandoned (its worker died mid-call): another advance redrafts.
# Above the llm-patch proposer's longest model call (timeout_s, at most the task's time limit).
DRAFT_STALE_S = 600


@dataclasses.dataclass(frozen=True)
class _DraftTicket:
    """A proposal to draft outside the lock: ``_step`` hands it out, ``_draft`` redeems it."""

    sequence: int
    drafting_at: Any


def campaign_advance(*, campaign_id: Any) -> None:
    for _ in range(MAX_STEPS_PER_CALL):
        result = _step(campaign_id)
        if isinstance(result, _DraftTicket):
            result = _draft(campaign_id, result)
        if not result:
            return


def _draft(campaign_id: Any, ticket: _DraftTicket) -> bool:
    """Write the proposal with no lock and no transaction held (a slow proposer's model call
    of minutes must not block pause, stop or the campaign page), then record it under the lock
    if the campaign still wants it: still running, still this draft, nothing recorded since."""
    campaign = Campaign.objects.select_related("seed_candidate", "budget").get(id=campaign_id)
    proposer = proposer_for(campaign=campaign, sequence=ticket.sequence)
    try:
        draft = proposer.propose(history=_search_history(campaign))
    except BaseException:
        _drafting_clear(campaign_id, ticket)  # the next advance may try again at once
        raise
    with transaction.atomic():
        campaign = (
            Campaign.objects.select_for_update()
            .select_related("seed_candidate", "budget")
            .get(id=campaign_id)
        )
        current = (
            campaign.drafting_sequence == ticket.sequence
            and campaign.drafting_at == ticket.drafting_at
        )
        if campaign.state != CampaignState.RUNNING or not current:
            logger.info(
                "campaign %s: draft of proposal %d discarded (campaign %s%s)",
                campaign.id,
                ticket.sequence,
                campaign.state,
                "" if current else ", redrafted elsewhere",
            )
            if current:
                _drafting_clear(campaign_id, ticket)
            return False
        _drafting_clear(campaign_id, ticket)
        return _use_draft(campaign, proposer, ticket.sequence, draft)


def _drafting_clear(campaign_id: Any, ticket: _DraftTicket) -> None:
    Campaign.objects.filter(
        id=campaign_id, drafting_sequence=ticket.sequence, drafting_at=ticket.drafting_at
    ).update(drafting_sequence=None, drafting_at=None, state_detail="")


def _drafting(campaign: Campaign) -> bool:
    """A draft is being written elsewhere (and is not stale)."""
    if campaign.drafting_at is None:
        return False
    return (timezone.now() - campaign.drafting_at).total_seconds() < DRAFT_STALE_S


def _step(campaign_id: Any) -> bool | _DraftTicket:
    """Take one step; True when another may follow at once; a ticket when a slow proposer
    should draft the next proposal outside the lock."""
    with transaction.atomic():
        campaign = (
            Campaign.objects.select_for_update()
            .select_related("seed_candidate", "budget")
            .filter(id=campaign_id)
            .first()
        )
        if campaign is None or campaign.state != CampaignState.RUNNING:
            return False
        proposal = Proposal.objects.filter(
            campaign=campaign, state__in=PROPOSAL_OPEN_STATES
        ).first()
        if proposal is not None:
            return _follow(campaign, proposal)
        if _drafting(campaign):
            return False  # its drafter records the proposal, or it goes stale
        queued = _next_queued(campaign)
        if queued is not None:
            return _start_queued(campaign, queued)
        reason = _stop_rule(campaign)
        if reason:
            _finish(campaign, CampaignState.FINISHED, reason)
            return False
        return _propose(campaign)


# --- stop rules ----------------------------------------------------------------------------


def _stop_rule(campaign: Campaign) -> str:
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
    spent = _budget_spent(campaign.budget)
    if spent:
        return spent
    return ""


def _budget_spent(budget: Budget) -> str:
    budget.refresh_from_db()
    for field, unit in (("rollouts", "rollouts"), ("tokens", "tokens"), ("wall_s", "seconds")):
        limit = getattr(budget, f"limit_{field}")
        used = getattr(budget, f"reserved_{field}") + getattr(budget, f"spent_{field}")
        if limit is not None and used >= limit:
            return f"budget spent: {used:,} of {limit:,} {unit}"
    return ""


def _finish(campaign: Campaign, state: str, reason: str) -> None:
    moved = Campaign.objects.filter(id=campaign.id, state=CampaignState.RUNNING).update(
        state=state, stop_reason=reason, finished_at=timezone.now(), updated_at=timezone.now()
    )
    if moved:
        Proposal.objects.filter(campaign=campaign, state=ProposalState.QUEUED).update(
            state=ProposalState.FAILED,
            state_detail=f"not evaluated: the campaign {state} first ({reason})"[:5000],
            finished_at=timezone.now(),
            updated_at=timezone.now(),
        )
    logger.info("campaign %s %s: %s", campaign.id, state, reason)


# --- proposing -----------------------------------------------------------------------------


def _propose(campaign: Campaign) -> bool | _DraftTicket:
    last = Proposal.objects.filter(campaign=campaign).aggregate(m=Max("sequence"))["m"]
    sequence = 0 if last is None else last + 1
    # Manual submissions queued before the start take sequences from 1: the seed keeps 0.
    if not Proposal.objects.filter(campaign=campaign, kind=ProposerKind.SEED).exists():
        proposal = Proposal.objects.create(
            campaign=campaign,
            sequence=0,
            kind=ProposerKind.SEED,
            candidate=campaign.seed_candidate,
            policy_version=campaign.policy_version,
            state=ProposalState.EVALUATING,
        )
        return _start_search(campaign, proposal)
    if campaign.alternates and campaign.best_candidate_id is not None:
        from coevo.campaigns.policy_steps import next_phase, policy_step_start

        if next_phase(campaign).name == "policy":
            return policy_step_start(campaign, sequence)
    proposer = proposer_for(campaign=campaign, sequence=sequence)
    if proposer.drafts_slowly:
        now = timezone.now()
        Campaign.objects.filter(id=campaign.id).update(
            drafting_sequence=sequence,
            drafting_at=now,
            state_detail=f"proposal {sequence}: the proposer model is writing it",
        )
        return _DraftTicket(sequence=sequence, drafting_at=now)
    draft = proposer.propose(history=_search_history(campaign))
    return _use_draft(campaign, proposer, sequence, draft)


def _use_draft(campaign: Campaign, proposer: Any, sequence: int, draft: Draft) -> bool:
    """Validate and record a draft, then start its evaluation (under the campaign's lock)."""
    if _merge_waits(campaign, draft):
        return False
    if campaign.state_detail:
        Campaign.objects.filter(id=campaign.id).update(state_detail="")
    proposal = _record(campaign, sequence, draft)
    if proposal.state == ProposalState.INVALID:
        proposer.tell(trial_number=draft.trial_number, outcome=Outcome.FAIL, value=None)
        _count_no_improvement(campaign)
        return True
    return _start_search(campaign, proposal)


def _next_queued(campaign: Campaign) -> Proposal | None:
    """The first manual proposal waiting, once the seed (the reference) was evaluated and
    while the budget lasts: queued submissions go ahead of the proposers, first come first."""
    seed = Proposal.objects.filter(campaign=campaign, kind=ProposerKind.SEED).first()
    if seed is None or seed.state in PROPOSAL_OPEN_STATES:
        return None
    queued = (
        Proposal.objects.filter(campaign=campaign, state=ProposalState.QUEUED)
        .order_by("sequence")
        .first()
    )
    if queued is None or _budget_spent(campaign.budget):
        return None
    return queued


def _start_queued(campaign: Campaign, proposal: Proposal) -> bool:
    # Under the campaign lock with no open proposal: the swap cannot race another start.
    Proposal.objects.filter(id=proposal.id, state=ProposalState.QUEUED).update(
        state=ProposalState.PROPOSED,
        policy_version=campaign.active_policy_version,
        updated_at=timezone.now(),
    )
    if campaign.state_detail:
        Campaign.objects.filter(id=campaign.id).update(state_detail="")
    proposal.refresh_from_db()
    return _start_search(campaign, proposal)


def _merge_waits(campaign: Campaign, draft: Draft) -> bool:
    """A merge with no pair to merge, right after another one: nothing was evaluated since, so
    it would fail the same way again. Wait (a manual submission, or a user stopping the
    campaign, ends the wait) instead of recording the same rejection over and over."""
    from coevo.campaigns.proposers.merge import NO_PAIR_REASON

    if draft.kind != ProposerKind.MERGE or not draft.stages:
        return False
    if draft.stages[0]["ok"] or draft.stages[0]["reason"] != NO_PAIR_REASON:
        return False
    last = Proposal.objects.filter(campaign=campaign).order_by("-sequence").first()
    if last is None or last.kind != ProposerKind.MERGE or last.stages[:1] != draft.stages[:1]:
        return False
    detail = f"waiting: the merge proposer has {NO_PAIR_REASON}; submit a candidate or stop it"
    Campaign.objects.filter(id=campaign.id).update(state_detail=detail, updated_at=timezone.now())
    return True


def _search_history(campaign: Campaign) -> list[dict[str, Any]]:
    """What a proposer may see of earlier proposals: candidates with their SEARCH scores, under
    the policy now in use (scores under an earlier policy version do not compare)."""
    from coevo.campaigns.selectors import proposals_under_active_policy

    return [
        {"sha": sha, "search_score": score}
        for sha, score in proposals_under_active_policy(campaign=campaign)
        .filter(search_score__isnull=False, candidate__isnull=False)
        .order_by("sequence")
        .values_list("candidate__sha", "search_score")
    ]


def _record(campaign: Campaign, sequence: int, draft: Draft) -> Proposal:
    """Validate the draft stage by stage, derive its candidate, and write the proposal."""
    stages = list(draft.stages)
    candidate = None
    detail = ""
    if not draft.failed:
        try:
            candidate, created = candidate_derive(
                project=campaign.project,
                parents=draft.parents,
                changes=draft.changes,
                message=f"{draft.message}\n\ncampaign {campaign.name} ({campaign.id}), proposal {sequence}",
                author_name=f"coevo {draft.kind} proposer",
            )
        except CoevoError as exc:
            stages.append(stage("manifest", False, str(exc)))
        else:
            stages.append(stage("manifest", True, "harness.toml validates"))
            if draft.kind == ProposerKind.CONFIG:
                stages.append(
                    stage("imports", True, "code unchanged from the parent (only knob defaults)")
                )
            else:
                # Any other kind may change code: its entrypoint must import in the sandbox.
                stages.append(_imports_stage(candidate))
            if not stages[-1]["ok"]:
                pass  # rejected at imports: no later stage for code that does not load
            elif created:
                stages.append(stage("duplicate", True, "a new tree"))
            else:
                stages.append(
                    stage(
                        "duplicate",
                        False,
                        f"the same tree as candidate {candidate.short_sha}: not evaluated again",
                    )
                )
    failed = next((s for s in stages if not s["ok"]), None)
    if failed:
        detail = f"rejected at the {failed['stage']} stage: {failed['reason']}"
    return Proposal.objects.create(
        campaign=campaign,
        sequence=sequence,
        kind=draft.kind,
        parent_shas=[p.sha for p in draft.parents],
        shown=draft.shown,
        params=draft.params,
        trial_number=draft.trial_number,
        prompt=draft.prompt,
        response=draft.response,
        proposer_tokens=draft.proposer_tokens,
        patch=draft.patch,
        stages=stages,
        state=ProposalState.INVALID if failed else ProposalState.PROPOSED,
        state_detail=detail,
        candidate=candidate,
        policy_version=campaign.active_policy_version,
        finished_at=timezone.now() if failed else None,
    )


def _imports_stage(candidate: Any) -> dict[str, Any]:
    """The candidate's entrypoint imported in the sandbox (workers.import_check): code that
    fails to load is rejected here, before any rollout is spent on it."""
    from workers.import_check import candidate_import_check

    check = candidate_import_check(candidate=candidate)
    return stage("imports", check.ok, check.reason)


# --- evaluating ----------------------------------------------------------------------------


def _start_search(campaign: Campaign, proposal: Proposal) -> bool:
    plan = EvaluationPlan.from_dict(campaign.plan)
    reference = _reference(campaign)
    if reference is None and plan.early_stop:
        plan = dataclasses.replace(plan, early_stop=False)
    evaluation = _create_evaluation(
        campaign, proposal, split=campaign.search_split, plan=plan, reference=reference
    )
    if evaluation is None:
        return False
    Proposal.objects.filter(id=proposal.id).update(
        search_evaluation=evaluation, state=ProposalState.EVALUATING, updated_at=timezone.now()
    )
    return False


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
    from coevo.evaluations.services import evaluation_create

    try:
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
        )
    except BudgetExceeded as exc:
        _end_proposal(campaign, proposal, ProposalState.FAILED, f"not evaluated: {exc}")
        _finish(campaign, CampaignState.FINISHED, f"budget spent: {exc}")
        return None
    except CoevoError as exc:
        _end_proposal(campaign, proposal, ProposalState.FAILED, f"not evaluated: {exc}")
        _finish(campaign, CampaignState.FAILED, f"proposal {proposal.sequence}: {exc}")
        return None


def _follow(campaign: Campaign, proposal: Proposal) -> bool:
    """The open proposal's next step, once its current evaluation is final."""
    if proposal.kind == ProposerKind.POLICY and proposal.search_evaluation_id is None:
        from coevo.campaigns.policy_steps import policy_step_follow

        return policy_step_follow(campaign, proposal)
    if proposal.search_evaluation_id is None:
        # Recorded, but its evaluation was never created (a crash between the two): start it.
        return _start_search(campaign, proposal)
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
    score, tokens = _score(search)
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
        from coevo.campaigns.patterns import failure_patterns_update

        failure_patterns_update(campaign=campaign, evaluation=search)
    if search.state != EvaluationState.FINISHED:
        _end_proposal(
            campaign,
            proposal,
            ProposalState.FAILED,
            f"search evaluation {search.state}: {search.state_detail or search.stop_reason}",
        )
        return True
    if any(not s["ok"] for s in stages):
        _end_proposal(
            campaign,
            proposal,
            ProposalState.INVALID,
            f"rejected at the smoke stage: {stages[-1]['reason']}",
        )
        return True
    if "clearly worse" in search.stop_reason:
        _end_proposal(
            campaign,
            proposal,
            ProposalState.EVALUATED,
            f"not validated: the search evaluation {search.stop_reason}",
            outcome=Outcome.PRUNED,
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
        _end_proposal(
            campaign,
            proposal,
            ProposalState.FAILED,
            f"validation evaluation {validation.state}: {validation.state_detail}",
        )
        return True
    score, tokens = _score(validation)
    Proposal.objects.filter(id=proposal.id).update(
        validation_score=score, tokens_per_task=tokens, updated_at=timezone.now()
    )
    proposal.refresh_from_db()
    _end_proposal(campaign, proposal, ProposalState.EVALUATED, "", outcome=Outcome.COMPLETE)
    return True


def _end_proposal(
    campaign: Campaign,
    proposal: Proposal,
    state: str,
    detail: str,
    *,
    outcome: str = Outcome.FAIL,
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
            from coevo.campaigns.patterns import failure_patterns_check_regressions

            failure_patterns_check_regressions(campaign=campaign)
    if proposal.kind == ProposerKind.SEED:
        return
    if not improved:
        _count_no_improvement(campaign)
    proposer = proposer_for_proposal(campaign=campaign, kind=proposal.kind)
    if proposer is not None:
        proposer.tell(
            trial_number=proposal.trial_number,
            outcome=outcome,
            value=proposal.validation_score if outcome == Outcome.COMPLETE else None,
        )


def _count_no_improvement(campaign: Campaign) -> None:
    campaign.proposals_since_improvement += 1
    campaign.save(update_fields=["proposals_since_improvement", "updated_at"])


def _score(evaluation: Evaluation) -> tuple[float | None, float | None]:
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


__all__ = ["campaign_advance"]
