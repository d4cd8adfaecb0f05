"""The campaign runner: one proposal at a time, each step taken under the campaign's row lock.

``campaign_advance`` is idempotent: it looks at where the campaign is (the open proposal and
its evaluations) and takes the next step, so a redelivered task, two workers at once, or the
beat job finding a campaign whose signal was lost all do the right thing at most once.

Proposal 0 is the seed: evaluated on both splits like any other, it is the reference that
search evaluations are paired against and the first "best".

One thing happens outside the lock: a slow proposer's model call (llm-patch). The locked step
marks the campaign as drafting (``drafting_sequence``/``drafting_at``) and hands out a ticket;
the draft is written with no transaction open, then recorded under the lock only if the
campaign still runs and still wants that draft. Every written draft's proposer tokens and wall
time are charged to the campaign's budget as proposer units (a discarded one too: the model was
paid). Alternating campaigns' policy steps are in
``coevo.campaigns.policy_steps``.

With ``batch_size`` N > 1, a round drafts N proposals from the same history: fast proposers'
in the locked step, one after the other; slow ones in parallel, one ``campaign_draft`` task
each, with a ticket each in ``drafting_batch`` (the same tickets: redeemed by ``_draft``, stale
after ``DRAFT_STALE_S`` and then redrafted). Once every draft of the round is recorded, its valid
proposals are raced on the search split (``coevo.campaigns.racing``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from coevo.campaigns.evaluating import count_no_improvement, proposal_follow, search_start
from coevo.campaigns.import_checks import candidate_import_check
from coevo.campaigns.models import (
    PROPOSAL_OPEN_STATES,
    Campaign,
    CampaignState,
    Proposal,
    ProposalState,
    ProposerKind,
)
from coevo.campaigns.policy_steps import next_phase, policy_step_follow, policy_step_start
from coevo.campaigns.proposers import Draft, ProposalOutcome, proposer_for
from coevo.campaigns.proposers.base import stage
from coevo.campaigns.proposers.merge import NO_PAIR_REASON
from coevo.campaigns.racing import round_follow
from coevo.campaigns.selectors import proposals_under_active_policy
from coevo.campaigns.services import campaign_draft_enqueue
from coevo.campaigns.stop_rules import budget_spent, campaign_finish, stop_rule
from coevo.errors import CoevoError
from coevo.evaluations.ledger import Amount, budget_settle
from coevo.evaluations.storable import storable_json, storable_text
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
    # The round (its first sequence) of a batch draft, whose ticket is in drafting_batch.
    batch: int | None = None


def campaign_advance(*, campaign_id: Any) -> None:
    for _ in range(MAX_STEPS_PER_CALL):
        result = _step(campaign_id)
        if isinstance(result, _DraftTicket):
            result = _draft(campaign_id, result)
        if not result:
            return


def campaign_draft(*, campaign_id: Any, sequence: int, drafting_at: str) -> None:
    """Write one draft of a round (a ``campaign_draft`` task, one per slow draft, in parallel),
    then advance: the round's last draft to come back starts its race. A redelivered or stale
    task finds its ticket gone or replaced and only charges what it wrote."""
    with transaction.atomic():
        campaign = Campaign.objects.select_for_update().filter(id=campaign_id).first()
        held = campaign and (campaign.drafting_batch or {}).get(str(sequence))
        if not held or held["at"] != drafting_at:
            logger.info("campaign %s: draft %d no longer wanted", campaign_id, sequence)
            return
        ticket = _DraftTicket(
            sequence=sequence, drafting_at=datetime.fromisoformat(drafting_at), batch=held["batch"]
        )
        if campaign.state != CampaignState.RUNNING:
            logger.info(
                "campaign %s: draft %d not written (%s)", campaign_id, sequence, campaign.state
            )
            _ticket_return(campaign, ticket)
            return
    result = _draft(campaign_id, ticket)
    if result:
        campaign_advance(campaign_id=campaign_id)


def _draft(campaign_id: Any, ticket: _DraftTicket) -> bool:
    """Write the proposal with no lock and no transaction held (a slow proposer's model call
    of minutes must not block pause, stop or the campaign page), then record it under the lock
    if the campaign still wants it: still running, still this draft, nothing recorded since."""
    campaign = Campaign.objects.select_related("seed_candidate", "budget").get(id=campaign_id)
    proposer = proposer_for(campaign=campaign, sequence=ticket.sequence)
    try:
        draft = _write(campaign, proposer)
    except BaseException:
        _draft_failed(campaign_id, ticket)  # the next advance may try again at once
        raise
    with transaction.atomic():
        campaign = (
            Campaign.objects.select_for_update()
            .select_related("seed_candidate", "budget")
            .get(id=campaign_id)
        )
        current = _ticket_current(campaign, ticket)
        if campaign.state != CampaignState.RUNNING or not current:
            logger.info(
                "campaign %s: draft of proposal %d discarded (campaign %s%s)",
                campaign.id,
                ticket.sequence,
                campaign.state,
                "" if current else ", redrafted elsewhere",
            )
            if current:
                _ticket_return(campaign, ticket)
            # The proposer model was paid all the same.
            _charge(campaign, draft, f"proposal {ticket.sequence} ({draft.kind}), discarded")
            return False
        _drafting_clear(campaign_id, ticket)
        campaign.refresh_from_db(fields=["drafting_batch", "state_detail"])
        return _use_draft(campaign, proposer, ticket.sequence, draft, batch=ticket.batch)


def _ticket_current(campaign: Campaign, ticket: _DraftTicket) -> bool:
    """Still the draft the campaign wants (not redrafted since, not recorded)."""
    if ticket.batch is None:
        return (
            campaign.drafting_sequence == ticket.sequence
            and campaign.drafting_at == ticket.drafting_at
        )
    held = (campaign.drafting_batch or {}).get(str(ticket.sequence))
    return bool(held) and held["at"] == ticket.drafting_at.isoformat()


def _ticket_return(campaign: Campaign, ticket: _DraftTicket) -> None:
    """A current ticket handed back, its draft not recorded (under the lock). While the
    campaign may still want it (running, paused), a round's slot is drafted again by the next
    advance (the resume's, when paused): a ticket left as it was would look fresh and hold the
    round until it is stale, and a removed one would drop the slot (the round raced short of
    it, a gap in its sequences). Stopped or finished, no draft is wanted any more. A single
    draft's ticket is removed: the next advance drafts it again."""
    wanted = campaign.state in (CampaignState.RUNNING, CampaignState.PAUSED)
    if ticket.batch is not None and wanted:
        _batch_ticket_set(campaign, ticket.sequence, at=None, batch=ticket.batch)
    else:
        _drafting_clear(campaign.id, ticket)


def _draft_failed(campaign_id: Any, ticket: _DraftTicket) -> None:
    """A draft that raised (the proposer model down, its call timed out)."""
    with transaction.atomic():
        campaign = Campaign.objects.select_for_update().get(id=campaign_id)
        if _ticket_current(campaign, ticket):
            _ticket_return(campaign, ticket)


def _drafting_clear(campaign_id: Any, ticket: _DraftTicket) -> None:
    if ticket.batch is None:
        Campaign.objects.filter(
            id=campaign_id, drafting_sequence=ticket.sequence, drafting_at=ticket.drafting_at
        ).update(drafting_sequence=None, drafting_at=None, state_detail="")
        return
    with transaction.atomic():
        campaign = Campaign.objects.select_for_update().get(id=campaign_id)
        if _ticket_current(campaign, ticket):
            tickets = dict(campaign.drafting_batch)
            del tickets[str(ticket.sequence)]
            Campaign.objects.filter(id=campaign_id).update(
                drafting_batch=tickets,
                state_detail="" if not tickets else campaign.state_detail,
            )


def _batch_ticket_set(campaign: Campaign, sequence: int, *, at: Any, batch: int) -> None:
    tickets = dict(campaign.drafting_batch or {})
    tickets[str(sequence)] = {"at": None if at is None else at.isoformat(), "batch": batch}
    campaign.drafting_batch = tickets
    Campaign.objects.filter(id=campaign.id).update(drafting_batch=tickets)


def _drafting(campaign: Campaign) -> bool:
    """A draft is being written elsewhere (and is not stale)."""
    if campaign.drafting_at is None:
        return False
    return (timezone.now() - campaign.drafting_at).total_seconds() < DRAFT_STALE_S


def _batch_drafts_wait(campaign: Campaign) -> bool:
    """A round's slow drafts are out: send again those whose task was lost (stale) or that a
    pause threw away; the round waits for them all before its race."""
    now = timezone.now()
    for key, held in sorted((campaign.drafting_batch or {}).items()):
        at = held["at"] and datetime.fromisoformat(held["at"])
        if at and (now - at).total_seconds() < DRAFT_STALE_S:
            continue
        sequence = int(key)
        _batch_ticket_set(campaign, sequence, at=now, batch=held["batch"])
        campaign_draft_enqueue(
            campaign_id=campaign.id, sequence=sequence, drafting_at=now.isoformat()
        )
        logger.info("campaign %s: draft %d sent again", campaign.id, sequence)
    return False


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
        if campaign.drafting_batch:
            return _batch_drafts_wait(campaign)
        open_ = list(
            Proposal.objects.filter(campaign=campaign, state__in=PROPOSAL_OPEN_STATES).order_by(
                "sequence"
            )
        )
        if open_ and open_[0].batch is not None:
            return round_follow(campaign, open_)
        if open_:
            proposal = open_[0]
            if proposal.kind == ProposerKind.POLICY and proposal.search_evaluation_id is None:
                return policy_step_follow(campaign, proposal)  # exporting, then training
            return proposal_follow(campaign, proposal)
        if _drafting(campaign):
            return False  # its drafter records the proposal, or it goes stale
        queued = _next_queued(campaign)
        if queued is not None:
            return _start_queued(campaign, queued)
        reason = stop_rule(campaign)
        if reason:
            campaign_finish(campaign, CampaignState.FINISHED, reason)
            return False
        return _propose(campaign)


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
        return search_start(campaign, proposal)
    alternating = campaign.alternates and campaign.best_candidate_id is not None
    if alternating and next_phase(campaign).name == "policy":
        return policy_step_start(campaign, sequence)
    if campaign.batch_size > 1:
        return _propose_round(campaign, sequence)
    proposer = proposer_for(campaign=campaign, sequence=sequence)
    if proposer.drafts_slowly:
        now = timezone.now()
        Campaign.objects.filter(id=campaign.id).update(
            drafting_sequence=sequence,
            drafting_at=now,
            state_detail=f"proposal {sequence}: the proposer model is writing it",
        )
        return _DraftTicket(sequence=sequence, drafting_at=now)
    draft = _write(campaign, proposer)
    return _use_draft(campaign, proposer, sequence, draft)


def _propose_round(campaign: Campaign, first: int) -> bool:
    """Draft a round: up to batch_size proposals from the same history (no more than the
    max_proposals left). Fast proposers write theirs now, one after another, each recorded
    before the next is drawn (Optuna asks once per draft); slow ones get a ticket and a
    ``campaign_draft`` task each, run in parallel on the workers."""
    made = (
        Proposal.objects.filter(campaign=campaign)
        .exclude(kind__in=[ProposerKind.SEED, ProposerKind.MANUAL, ProposerKind.POLICY])
        .count()
    )
    size = max(1, min(campaign.batch_size, campaign.max_proposals - made))
    now = timezone.now()
    recorded = 0
    for sequence in range(first, first + size):
        proposer = proposer_for(campaign=campaign, sequence=sequence)
        if proposer.drafts_slowly:
            _batch_ticket_set(campaign, sequence, at=now, batch=first)
            campaign_draft_enqueue(
                campaign_id=campaign.id, sequence=sequence, drafting_at=now.isoformat()
            )
            continue
        draft = _write(campaign, proposer)
        if _merge_waits(campaign, draft):
            continue  # this slot waits, as a single merge does; the round goes on without it
        _use_draft(campaign, proposer, sequence, draft, batch=first)
        recorded += 1
    if campaign.drafting_batch:
        Campaign.objects.filter(id=campaign.id).update(
            state_detail=(
                f"round {first}: the proposer model is writing {len(campaign.drafting_batch)} "
                "proposal(s)"
            )
        )
    return bool(recorded or campaign.drafting_batch)


def _write(campaign: Campaign, proposer: Any) -> Draft:
    """The proposer's draft, with its wall time: the proposer's own (llm-patch: its model
    call), else the whole propose() call."""
    started = time.monotonic()
    draft = proposer.propose(history=_search_history(campaign))
    if draft.proposer_wall_ms is None:
        draft.proposer_wall_ms = round(1000 * (time.monotonic() - started))
    return draft


def _charge(campaign: Campaign, draft: Draft, note: str) -> None:
    """Charge a written draft's proposer spend to the campaign's budget (nothing was reserved:
    its cost is known only now)."""
    budget_settle(
        budget=campaign.budget,
        reserved=Amount(),
        actual=Amount(
            proposer_tokens=draft.proposer_tokens,
            proposer_wall_ms=draft.proposer_wall_ms or 0,
            proposer_usd=draft.proposer_cost_usd or Decimal(0),
        ),
        rollout=None,
        note=note,
    )


def _use_draft(
    campaign: Campaign, proposer: Any, sequence: int, draft: Draft, *, batch: int | None = None
) -> bool:
    """Validate and record a draft, then start its evaluation (under the campaign's lock); a
    round's draft waits for the round's race instead."""
    if batch is None and _merge_waits(campaign, draft):
        # Not charged: no model was asked, and a merge that waits is drafted again at each
        # advance (an entry per beat tick would drown the ledger).
        return False
    if campaign.state_detail and not campaign.drafting_batch:
        Campaign.objects.filter(id=campaign.id).update(state_detail="")
    proposal = _record(campaign, sequence, draft, batch=batch)
    if proposal.state == ProposalState.INVALID:
        proposer.tell(trial_number=draft.trial_number, outcome=ProposalOutcome.FAIL, value=None)
        count_no_improvement(campaign)
        return True
    if batch is not None:
        return True
    return search_start(campaign, proposal)


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
    if queued is None or budget_spent(campaign.budget):
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
    return search_start(campaign, proposal)


def _merge_waits(campaign: Campaign, draft: Draft) -> bool:
    """A merge with no pair to merge, right after another one: nothing was evaluated since, so
    it would fail the same way again. Wait (a manual submission, or a user stopping the
    campaign, ends the wait) instead of recording the same rejection over and over."""
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
    return [
        {"sha": sha, "search_score": score}
        for sha, score in proposals_under_active_policy(campaign=campaign)
        .filter(search_score__isnull=False, candidate__isnull=False)
        .order_by("sequence")
        .values_list("candidate__sha", "search_score")
    ]


def _record(campaign: Campaign, sequence: int, draft: Draft, *, batch: int | None) -> Proposal:
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
                message=storable_text(
                    f"{draft.message}\n\ncampaign {campaign.name} ({campaign.id}), proposal {sequence}"
                ),
                author_name=f"coevo {draft.kind} proposer",
            )
        except CoevoError as exc:
            stages.append(stage("manifest", False, str(exc)))
        else:
            stages.append(stage("manifest", True, "harness.toml validates"))
            if draft.kind in (ProposerKind.CONFIG, ProposerKind.RANDOM):
                stages.append(
                    stage("imports", True, "code unchanged from the parent (only knob defaults)")
                )
            else:
                # Any other kind may change code: it must load in the sandbox.
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
    _charge(campaign, draft, f"proposal {sequence} ({draft.kind})")
    return Proposal.objects.create(
        campaign=campaign,
        sequence=sequence,
        kind=draft.kind,
        parent_shas=[p.sha for p in draft.parents],
        trial_number=draft.trial_number,
        proposer_tokens=draft.proposer_tokens,
        proposer_wall_ms=draft.proposer_wall_ms or 0,
        proposer_cost_usd=draft.proposer_cost_usd,
        state=ProposalState.INVALID if failed else ProposalState.PROPOSED,
        **_storable_record(
            shown=draft.shown,
            params=draft.params,
            prompt=draft.prompt,
            response=draft.response,
            patch=draft.patch,
            stages=stages,
            state_detail=detail,
        ),
        candidate=candidate,
        policy_version=campaign.active_policy_version,
        batch=batch,
        finished_at=timezone.now() if failed else None,
    )


def _storable_record(**fields: Any) -> dict[str, Any]:
    """A draft's text and JSON fields as the database can hold them. A proposer program's answer,
    detail and transcript, a model's reply, hypothesis and patch, and the reasons the
    candidate's own checks give all reach them; PostgreSQL refuses a NUL, a lone surrogate or
    a NaN (coevo.evaluations.storable), and one refused value would fail the proposal's write
    at every draft. The JSON fields' structure is the proposers' own, a few levels deep: only
    their strings come from a program or a model, so nothing here is refused."""
    return {
        name: storable_text(value) if isinstance(value, str) else storable_json(value)
        for name, value in fields.items()
    }


def _imports_stage(candidate: Any) -> dict[str, Any]:
    """The candidate's entrypoint imported, or a program's command checked, in the sandbox
    (workers.import_check): code that fails to load is rejected here, before any rollout is
    spent on it."""
    check = candidate_import_check(candidate=candidate)
    return stage("imports", check.ok, check.reason)


__all__ = ["DRAFT_STALE_S", "campaign_advance", "campaign_draft"]
