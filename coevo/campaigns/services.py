"""Creating a campaign and its state transitions (compare-and-swap). The step-by-step runner
is ``coevo.campaigns.runner.campaign_advance``."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from coevo.campaigns.alternation import alternation_validate
from coevo.campaigns.import_checks import candidate_import_check
from coevo.campaigns.models import (
    PROPOSAL_OPEN_STATES,
    Campaign,
    CampaignState,
    Proposal,
    ProposalState,
    ProposerKind,
)
from coevo.campaigns.proposers import ProposalOutcome, proposer_for_proposal, strategy_validate
from coevo.campaigns.proposers.base import stage
from coevo.campaigns.transitions import campaign_move
from coevo.enqueue import task_enqueue
from coevo.errors import InvalidInput, InvalidManifest, InvalidState
from coevo.evaluations.ledger import BudgetLimits, budget_create
from coevo.evaluations.lifecycle import evaluation_cancel, evaluation_pause, evaluation_resume
from coevo.evaluations.models import (
    EVALUATION_OPEN_STATES,
    Evaluation,
    EvaluationState,
    PauseKind,
)
from coevo.evaluations.plans import EvaluationPlan
from coevo.policies.models import ADAPTER_ENDPOINT_KINDS, PolicyVersion
from coevo.projects.models import Project
from coevo.suites.models import Split, Suite, Task
from coevo.training.models import TRAINING_OPEN_STATES, TrainingRun
from coevo.training.services import training_run_cancel
from harness_store.manifest import Manifest
from harness_store.models import Candidate
from harness_store.selectors import candidate_manifest

logger = logging.getLogger(__name__)

# The Celery task names (coevo.campaigns.tasks registers them; services send them by name).
CAMPAIGN_ADVANCE_TASK = "coevo.campaigns.tasks.campaign_advance"
CAMPAIGN_DRAFT_TASK = "coevo.campaigns.tasks.campaign_draft"

# Proposals drafted per round at most: each round's race runs this many search evaluations at
# once, and each reserves its worst case on the campaign's budget.
MAX_BATCH_SIZE = 16

DEFAULT_PLAN = EvaluationPlan(smoke_tasks=1, minibatch_tasks=0, early_stop=True)


def campaign_default_name(*, seed_candidate: Candidate, strategy: list[dict[str, Any]]) -> str:
    """A campaign started without a name (from the dashboard, the API or the command line) is
    named by its proposers and its seed, e.g. ``config+llm-patch 1a2b3c4d5e6f``."""
    return f"{'+'.join(entry['kind'] for entry in strategy)} {seed_candidate.short_sha}"


def campaign_create(
    *,
    project: Project,
    name: str,
    seed_candidate: Candidate,
    policy_version: PolicyVersion,
    suite: Suite,
    strategy: list[dict[str, Any]] | None = None,
    search_split: str = Split.SEARCH,
    validation_split: str = Split.VALIDATION,
    budget_limits: BudgetLimits | None = None,
    max_proposals: int = 10,
    batch_size: int = 1,
    max_candidates: int | None = None,
    plan: EvaluationPlan | None = None,
    patience: int | None = None,
    target_score: float | None = None,
    epochs: int = 1,
    seed: int = 0,
    alternation: dict[str, Any] | None = None,
    created_by: AbstractBaseUser | None = None,
) -> Campaign:
    """A pending campaign with its ledger budget; ``campaign_start`` runs it.

    A blank ``name`` takes ``campaign_default_name``'s. ``alternation``
    (coevo.campaigns.alternation) makes it alternate harness steps with policy steps that
    train a LoRA adapter with a registered trainer."""
    if seed_candidate.project_id != project.id or suite.project_id != project.id:
        raise InvalidInput(
            "The seed candidate and the suite must belong to the campaign's project."
        )
    for label, split in (("search_split", search_split), ("validation_split", validation_split)):
        if split not in (Split.SEARCH, Split.VALIDATION):
            raise InvalidInput(
                f"{label}={split!r}: campaigns use the search and validation splits; held-out "
                "tasks are evaluated only for a promotion request."
            )
    if search_split == validation_split:
        raise InvalidInput("The search and validation splits must differ.")
    for split in (search_split, validation_split):
        if not Task.objects.filter(suite=suite, split=split).exists():
            raise InvalidInput(f"Suite {suite.name} has no tasks in the {split} split.")
    if max_proposals < 1:
        raise InvalidInput("max_proposals must be at least 1.")
    if not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise InvalidInput(
            f"batch_size must be between 1 and {MAX_BATCH_SIZE} proposals per round (1 "
            "evaluates one proposal at a time; more are raced on the search split); got "
            f"{batch_size}."
        )
    if max_candidates is not None and max_candidates < 1:
        raise InvalidInput("max_candidates must be at least 1.")
    if patience is not None and patience < 1:
        raise InvalidInput("patience must be at least 1 proposal.")
    if not 1 <= epochs <= 100:
        raise InvalidInput("epochs must be between 1 and 100.")
    plan = plan or DEFAULT_PLAN
    manifest = _manifest_of(seed_candidate)
    cleaned = strategy_validate(strategy=strategy, manifest=manifest, project=project)
    name = name.strip() or campaign_default_name(seed_candidate=seed_candidate, strategy=cleaned)
    alternation = alternation_validate(raw=alternation, campaign_patience=patience)
    if alternation and policy_version.endpoint.kind not in ADAPTER_ENDPOINT_KINDS:
        raise InvalidInput(
            f"An alternating campaign trains LoRA adapters, which only a vLLM endpoint or the "
            f"coevo llama.cpp host loads at run time; policy version {policy_version.name} is "
            f"served by {policy_version.endpoint.name} "
            f"({policy_version.endpoint.get_kind_display()})."
        )
    with transaction.atomic():
        campaign_id = _new_id()
        budget = budget_create(project=project, name=f"campaign {name[:150]}", limits=budget_limits)
        campaign = Campaign.objects.create(
            id=campaign_id,
            project=project,
            name=name[:200],
            seed_candidate=seed_candidate,
            policy_version=policy_version,
            suite=suite,
            search_split=search_split,
            validation_split=validation_split,
            strategy=cleaned,
            budget=budget,
            max_proposals=max_proposals,
            batch_size=batch_size,
            max_candidates=max_candidates,
            plan=plan.as_dict(),
            patience=patience,
            target_score=target_score,
            epochs=epochs,
            seed=seed,
            alternation=alternation,
            current_policy_version=policy_version,
            created_by=created_by,
        )
    logger.info("campaign %s created: seed %s", campaign.id, seed_candidate.short_sha)
    return campaign


def campaign_start(*, campaign: Campaign) -> Campaign:
    moved = campaign_move(campaign_id=campaign.id, move="start", started_at=timezone.now())
    if not moved:
        raise InvalidState(
            f"Campaign {campaign.name} is {campaign.state}: only a pending one starts."
        )
    campaign_advance_enqueue(campaign_id=campaign.id, on_commit=True)
    campaign.refresh_from_db()
    return campaign


def campaign_pause(*, campaign: Campaign) -> Campaign:
    """Running → paused: no new proposal, and the open proposal's evaluations stop claiming
    rollouts until the campaign is resumed."""
    with transaction.atomic():
        moved = campaign_move(campaign_id=campaign.id, move="pause")
        if not moved:
            raise InvalidState(
                f"Campaign {campaign.name} is {campaign.state}: only a running one pauses."
            )
        for evaluation_id in _open_evaluation_ids(campaign):
            evaluation_pause(
                evaluation_id=evaluation_id,
                reason="its campaign was paused",
                kind=PauseKind.CAMPAIGN,
            )
    campaign.refresh_from_db()
    return campaign


def campaign_resume(*, campaign: Campaign) -> Campaign:
    with transaction.atomic():
        moved = campaign_move(campaign_id=campaign.id, move="resume")
        if not moved:
            raise InvalidState(
                f"Campaign {campaign.name} is {campaign.state}: only a paused one resumes."
            )
        for evaluation in Evaluation.objects.filter(
            id__in=_open_evaluation_ids(campaign), state=EvaluationState.PAUSED
        ):
            evaluation_resume(evaluation=evaluation)
        campaign_advance_enqueue(campaign_id=campaign.id, on_commit=True)
    campaign.refresh_from_db()
    return campaign


def campaign_stop(*, campaign: Campaign, reason: str = "stopped by a user") -> Campaign:
    """Any open state → stopped; the open proposal's evaluations are cancelled."""
    with transaction.atomic():
        moved = campaign_move(
            campaign_id=campaign.id,
            move="stop",
            stop_reason=reason,
            finished_at=timezone.now(),
            # No draft is wanted any more. A draft still being written finds its ticket gone
            # and is discarded (and charged); a draft task that never reaches a worker would
            # otherwise leave its ticket here for good.
            drafting_batch={},
            drafting_sequence=None,
            drafting_at=None,
            state_detail="",
        )
        if not moved:
            raise InvalidState(f"Campaign {campaign.name} is {campaign.state}: nothing to stop.")
        for evaluation in Evaluation.objects.filter(id__in=_open_evaluation_ids(campaign)):
            evaluation_cancel(evaluation=evaluation, reason=f"campaign stopped: {reason}")
        _cancel_open_training(campaign)
        _fail_open_proposals(campaign, f"campaign stopped: {reason}")
    campaign.refresh_from_db()
    return campaign


def _cancel_open_training(campaign: Campaign) -> None:
    """An open policy step's training run: stopped by its worker within a tick."""
    for run in TrainingRun.objects.filter(
        id__in=Proposal.objects.filter(
            campaign=campaign, state__in=PROPOSAL_OPEN_STATES, training_run__isnull=False
        ).values("training_run_id"),
        state__in=TRAINING_OPEN_STATES,
    ):
        # It may end on its own meanwhile: nothing to cancel then, and the stop goes on.
        with contextlib.suppress(InvalidState):
            training_run_cancel(run=run)


def _fail_open_proposals(campaign: Campaign, detail: str) -> None:
    # Queued manual submissions end with the campaign too: nothing will evaluate them.
    for proposal in Proposal.objects.filter(
        campaign=campaign, state__in=[*PROPOSAL_OPEN_STATES, ProposalState.QUEUED]
    ):
        Proposal.objects.filter(id=proposal.id, state=proposal.state).update(
            state=ProposalState.FAILED,
            state_detail=detail,
            finished_at=timezone.now(),
            updated_at=timezone.now(),
        )
        proposer = proposer_for_proposal(campaign=campaign, kind=proposal.kind)
        if proposer is not None:
            proposer.tell(
                trial_number=proposal.trial_number, outcome=ProposalOutcome.FAIL, value=None
            )


def campaign_submit_candidate(
    *, campaign: Campaign, candidate: Candidate, submitted_by: AbstractBaseUser | None
) -> Proposal:
    """A human's or CI's commit enters the campaign as a ``manual`` proposal.

    It passes the same validation stages as a proposer's (the manifest validates, the
    entrypoint imports in the sandbox, the tree is new to the campaign; the smoke rollout
    comes with its search evaluation). A valid one is queued: the runner evaluates queued
    submissions first submitted first, ahead of the proposers' next proposal, as soon as the
    open proposal (if any) is done. An invalid one is recorded as such and never evaluated.
    Raises InvalidInput for a candidate of another project, InvalidState for an ended campaign.
    """
    if candidate.project_id != campaign.project_id:
        raise InvalidInput(
            f"Candidate {candidate.short_sha} belongs to another project than campaign "
            f"{campaign.name}."
        )
    who = getattr(submitted_by, "username", "") or "an anonymous caller"
    stages = [stage("applies", True, f"commit {candidate.short_sha} submitted by {who}")]
    try:
        candidate_manifest(candidate=candidate)
    except InvalidManifest as exc:
        stages.append(stage("manifest", False, str(exc)))
    else:
        stages.append(stage("manifest", True, "harness.toml validates"))
    if stages[-1]["ok"]:
        check = candidate_import_check(candidate=candidate)
        stages.append(stage("imports", check.ok, check.reason))
    with transaction.atomic():
        # The campaign's row lock orders submissions (FIFO by sequence) and the runner's steps.
        locked = Campaign.objects.select_for_update().get(id=campaign.id)
        if locked.is_final:
            raise InvalidState(
                f"Campaign {locked.name} is {locked.state}: submit candidates to a pending, "
                "running or paused campaign."
            )
        if stages[-1]["ok"]:
            same = (
                Proposal.objects.filter(campaign=locked, candidate__tree_sha=candidate.tree_sha)
                .exclude(state=ProposalState.FAILED)
                .order_by("sequence")
                .first()
            )
            if same is None and candidate.tree_sha == locked.seed_candidate.tree_sha:
                stages.append(
                    stage("duplicate", False, "the seed's own tree: it is evaluated as proposal 0")
                )
            elif same is None:
                stages.append(stage("duplicate", True, "a new tree"))
            else:
                stages.append(
                    stage(
                        "duplicate",
                        False,
                        f"the same tree as proposal #{same.sequence} "
                        f"({same.candidate.short_sha}): not evaluated again",
                    )
                )
        failed = next((s for s in stages if not s["ok"]), None)
        last = Proposal.objects.filter(campaign=locked).aggregate(m=Max("sequence"))["m"]
        proposal = Proposal.objects.create(
            campaign=locked,
            # Sequence 0 is the seed's, even when a submission comes before the start.
            sequence=max(1, (last or 0) + 1),
            kind=ProposerKind.MANUAL,
            parent_shas=list(candidate.parent_shas),
            params={"submitted_by": who},
            stages=stages,
            state=ProposalState.INVALID if failed else ProposalState.QUEUED,
            state_detail=(
                f"rejected at the {failed['stage']} stage: {failed['reason']}" if failed else ""
            ),
            candidate=candidate,
            finished_at=timezone.now() if failed else None,
        )
        if not failed and locked.state == CampaignState.RUNNING:
            campaign_advance_enqueue(campaign_id=locked.id, on_commit=True)
    logger.info(
        "campaign %s: candidate %s submitted as proposal %s (%s)",
        campaign.id,
        candidate.short_sha,
        proposal.sequence,
        proposal.state,
    )
    return proposal


def _open_evaluation_ids(campaign: Campaign) -> list[Any]:
    ids = []
    for proposal in Proposal.objects.filter(campaign=campaign, state__in=PROPOSAL_OPEN_STATES):
        ids += [e for e in (proposal.search_evaluation_id, proposal.validation_evaluation_id) if e]
    return list(
        Evaluation.objects.filter(id__in=ids, state__in=EVALUATION_OPEN_STATES).values_list(
            "id", flat=True
        )
    )


def campaign_advance_enqueue(*, campaign_id: Any, on_commit: bool = False) -> None:
    """Send ``campaign_advance`` for one campaign (once the caller's transaction commits, with
    ``on_commit``); a broker that is down only delays it (beat's job advances it later)."""
    task_enqueue(
        CAMPAIGN_ADVANCE_TASK,
        str(campaign_id),
        queue="default",
        what=f"campaign {campaign_id}",
        on_commit=on_commit,
    )


def campaign_draft_enqueue(*, campaign_id: Any, sequence: int, drafting_at: str) -> None:
    """Send one round draft's ``campaign_draft`` task once the caller's transaction commits
    (its ticket is committed with it); a lost one goes stale and the runner sends it again."""
    task_enqueue(
        CAMPAIGN_DRAFT_TASK,
        str(campaign_id),
        str(sequence),
        drafting_at,
        queue="default",
        what=f"campaign {campaign_id}, draft {sequence}",
        later="the runner sends it again once its ticket is stale",
        on_commit=True,
    )


def _new_id() -> Any:
    import uuid

    return uuid.uuid4()


def _manifest_of(candidate: Candidate) -> Manifest:
    try:
        return candidate_manifest(candidate=candidate)
    except InvalidManifest as exc:
        raise InvalidInput(f"Seed {candidate.short_sha} cannot run: {exc}") from None
