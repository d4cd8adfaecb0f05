"""Reads for the campaign page and the API: progress, spend, fronts, best-so-far series."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, TypeVar
from uuid import UUID

from django.db.models import Count, Q, QuerySet, Sum
from django.db.models.functions import Left

from coevo.campaigns.models import (
    PROPOSAL_FINAL_STATES,
    Campaign,
    Proposal,
    ProposalState,
    ProposerKind,
)
from coevo.errors import NotFound
from coevo.evaluations.models import Budget
from coevo.evaluations.selectors import evaluation_task_scores
from coevo.projects.models import Project
from coevo.training.models import TrainingRun


def campaign_list(*, project: Project) -> QuerySet[Campaign]:
    return Campaign.objects.filter(project=project).select_related(
        "seed_candidate", "best_candidate", "suite"
    )


def campaign_get(*, project: Project, campaign_id: Any) -> Campaign:
    try:
        return (
            campaign_list(project=project)
            .select_related(
                "budget", "policy_version", "current_policy_version", "best_policy_version"
            )
            .get(id=campaign_id)
        )
    except (Campaign.DoesNotExist, ValueError, TypeError):
        raise NotFound(f"No campaign {campaign_id} in project {project.slug}.") from None


def proposal_list(*, campaign: Campaign) -> QuerySet[Proposal]:
    return (
        Proposal.objects.filter(campaign=campaign)
        .select_related("candidate", "eliminated_by")
        .defer(
            "shown",
            "prompt",
            "response",
            "eliminated_by__shown",
            "eliminated_by__prompt",
            "eliminated_by__response",
        )
        .order_by("sequence")
    )


@dataclass(frozen=True, slots=True)
class ProposalPoint:
    """A proposal as the campaign page's plots, Pareto front and lineage need it: a dozen
    columns instead of whole rows with their candidates (2,000 of those took 0.4 s to load,
    most of it parsing timestamps nobody drew)."""

    id: UUID
    sequence: int
    kind: str
    state: str
    search_score: float | None
    validation_score: float | None
    tokens_per_task: float | None
    improved: bool  # as the runner recorded it (coevo.campaigns.evaluating)
    parent_shas: list[str]  # as the proposer declared them
    candidate_id: UUID | None  # None: rejected before it became a commit
    sha: str | None
    candidate_parents: list[str]  # the commit's own parents
    subject: str
    rollouts_saved: int = 0

    @property
    def is_final(self) -> bool:
        return self.state in PROPOSAL_FINAL_STATES

    @property
    def short_sha(self) -> str:
        return (self.sha or "")[:12]


_POINT_COLUMNS = (
    "id",
    "sequence",
    "kind",
    "state",
    "search_score",
    "validation_score",
    "tokens_per_task",
    "improved",
    "parent_shas",
    "candidate_id",
    "candidate__sha",
    "candidate__parent_shas",
    "message_head",
    "rollouts_saved",
)
# Enough of a commit message for its subject line (a proposer's message may run to pages).
_SUBJECT_CHARS = 200


def campaign_points(*, campaign: Campaign) -> list[ProposalPoint]:
    """Every proposal of ``campaign`` in sequence order, as ``ProposalPoint`` rows: one query
    of a dozen columns, whatever the campaign's size."""
    rows = (
        Proposal.objects.filter(campaign=campaign)
        .order_by("sequence")
        .annotate(message_head=Left("candidate__message", _SUBJECT_CHARS))
        .values_list(*_POINT_COLUMNS)
    )
    return [
        ProposalPoint(
            id=row[0],
            sequence=row[1],
            kind=row[2],
            state=row[3],
            search_score=row[4],
            validation_score=row[5],
            tokens_per_task=row[6],
            improved=bool(row[7]),
            parent_shas=list(row[8] or []),
            candidate_id=row[9],
            sha=row[10],
            candidate_parents=list(row[11] or []),
            subject=_subject(row[12] or ""),
            rollouts_saved=row[13],
        )
        for row in rows
    ]


def _subject(message: str) -> str:
    lines = message.strip().splitlines()
    return lines[0] if lines else ""


@dataclass(frozen=True)
class ProposalWindow:
    """The proposals the campaign page's table shows: the newest ``size`` before a sequence
    number, whole rows in sequence order."""

    proposals: list[Proposal]
    older_before: int | None  # ?before= for the next older window; None: none older
    newest: bool  # whether this is the newest window


def proposal_window(*, campaign: Campaign, before: str | None, size: int) -> ProposalWindow:
    """The newest ``size`` proposals with a sequence below ``before`` (the newest when absent
    or not a number), in one query of ``size + 1`` rows: a campaign of 2,000 proposals shows a
    table of ``size`` rows, with a link to the older ones."""
    try:
        limit = int(before) if before else None
    except ValueError:
        limit = None
    rows = proposal_list(campaign=campaign).select_related("policy_version")
    if limit is not None:
        rows = rows.filter(sequence__lt=limit)
    newest_first = list(rows.order_by("-sequence")[: size + 1])
    shown = newest_first[:size][::-1]
    older = shown[0].sequence if len(newest_first) > size else None
    return ProposalWindow(shown, older, limit is None)


def proposal_for_training_run(*, project: Project, run: TrainingRun) -> Proposal | None:
    """The policy step that trained ``run``, with its campaign; None for a run started alone."""
    return (
        Proposal.objects.filter(training_run=run, campaign__project=project)
        .select_related("campaign")
        .first()
    )


@dataclass(frozen=True)
class CampaignProgress:
    proposals: int  # excluding the seed
    by_state: dict[str, int]
    budget: Budget
    # Search rollouts the rounds' races did not run (coevo.campaigns.racing).
    rollouts_saved: int = 0

    def spend(self) -> list[dict[str, Any]]:
        """Per ledger unit: the policy's (rollouts, tokens, wall time) and the proposers'."""
        rows = []
        for field, label, scale in _SPEND_ROWS:
            limit = getattr(self.budget, f"limit_{field}")
            spent = getattr(self.budget, f"spent_{field}")
            reserved = getattr(self.budget, f"reserved_{field}")
            rows.append(
                {
                    "name": label,
                    "spent": _scaled(spent, scale),
                    "reserved": _scaled(reserved, scale),
                    "limit": None if limit is None else _scaled(limit, scale),
                    "percent": int(100 * (spent + reserved) / limit) if limit else None,
                }
            )
        return rows


# (ledger unit, row name, divisor): proposer wall time is kept in ms and shown in seconds.
_SPEND_ROWS = (
    ("rollouts", "rollouts", 1),
    ("tokens", "tokens", 1),
    ("wall_s", "wall s", 1),
    ("usd", "policy US$", 0),
    ("proposer_tokens", "proposer tokens", 1),
    ("proposer_wall_ms", "proposer wall s", 1000),
    ("proposer_usd", "proposer US$", 0),
)
# Dollars (divisor 0 above) are shown to the millionth: a call of a small model costs less
# than a cent. The ledger keeps them exact.
_SHOWN_USD = Decimal("0.000001")


def _scaled(value: int | Decimal, scale: int) -> int | float | Decimal:
    if not scale:
        return Decimal(value).quantize(_SHOWN_USD)
    return value // scale if value % scale == 0 else round(value / scale, 1)


def campaign_progress(
    *, campaign: Campaign, points: list[ProposalPoint] | None = None
) -> CampaignProgress:
    """Proposals by state (the seed not counted), the budget and what racing saved; from
    ``points`` when the caller has read them (``campaign_points``), else two aggregates."""
    if points is None:
        counts = dict(
            Proposal.objects.filter(campaign=campaign)
            .exclude(kind=ProposerKind.SEED)
            .values_list("state")
            .annotate(n=Count("id"))
            .values_list("state", "n")
        )
        saved = campaign_rollouts_saved(campaign=campaign)
    else:
        counts = dict(Counter(p.state for p in points if p.kind != ProposerKind.SEED))
        saved = sum(p.rollouts_saved for p in points)
    budget = Budget.objects.get(id=campaign.budget_id)
    return CampaignProgress(
        proposals=sum(counts.values()), by_state=counts, budget=budget, rollouts_saved=saved
    )


def campaign_rollouts_saved(*, campaign: Campaign) -> int:
    """Search rollouts not run because a race eliminated their proposal (its unsent ones):
    what racing saved the campaign."""
    saved = Proposal.objects.filter(campaign=campaign).aggregate(n=Sum("rollouts_saved"))["n"]
    return saved or 0


@dataclass(frozen=True)
class CampaignRound:
    batch: int  # the sequence of its first proposal
    proposals: list[Proposal]

    @property
    def eliminated(self) -> list[Proposal]:
        return [p for p in self.proposals if p.eliminated_at is not None]

    @property
    def rollouts_saved(self) -> int:
        return sum(p.rollouts_saved for p in self.proposals)


T = TypeVar("T")


def campaign_rounds(*, campaign: Campaign, limit: int | None = None) -> list[CampaignRound]:
    """The rounds of a campaign drafting batch_size > 1, newest first, each with its proposals
    and who its race eliminated (by whom, after how many tasks, when); the newest ``limit``
    rounds only when given (a long raced campaign has hundreds)."""
    raced = proposal_list(campaign=campaign).filter(batch__isnull=False)
    if limit is not None:
        newest = (
            Proposal.objects.filter(campaign=campaign, batch__isnull=False)
            .order_by("-batch")
            .values_list("batch", flat=True)
            .distinct()[:limit]
        )
        raced = raced.filter(batch__in=list(newest))
    rounds: dict[int, list[Proposal]] = {}
    for proposal in raced:
        rounds.setdefault(proposal.batch, []).append(proposal)
    return [CampaignRound(batch=b, proposals=rounds[b]) for b in sorted(rounds, reverse=True)]


def campaign_round_count(*, campaign: Campaign) -> int:
    return (
        Proposal.objects.filter(campaign=campaign, batch__isnull=False)
        .values("batch")
        .distinct()
        .count()
    )


P = TypeVar("P", Proposal, ProposalPoint)


def campaign_pareto_front(*, campaign: Campaign, proposals: Sequence[P] | None = None) -> list[P]:
    """Evaluated proposals no other beats on both validation score (↑) and tokens per task (↓).
    ``proposals``: the campaign's (rows or ``ProposalPoint``s), when the caller has them loaded
    already (no second query)."""
    if proposals is None:
        proposals = proposal_list(campaign=campaign).filter(
            state=ProposalState.EVALUATED, validation_score__isnull=False
        )
    points = [
        p
        for p in proposals
        if p.state == ProposalState.EVALUATED
        and p.validation_score is not None
        and p.tokens_per_task is not None
    ]
    return pareto_front(
        points, score=lambda p: p.validation_score, cost=lambda p: p.tokens_per_task
    )


def pareto_front(
    points: Sequence[T], *, score: Callable[[T], float], cost: Callable[[T], float]
) -> list[T]:
    """The points no other beats on both (higher or equal score, lower or equal cost, one of
    them strictly), best score first: one sort and a sweep, not a comparison of every pair (a
    campaign of 2,000 proposals has a million pairs)."""
    front: list[T] = []
    cheapest_above = math.inf  # the lowest cost among strictly higher scores
    ordered = sorted(points, key=lambda p: (-score(p), cost(p)))
    for _score, group in itertools.groupby(ordered, key=score):
        tied = list(group)
        cheapest = cost(tied[0])
        # On the front: the cheapest of its score (ties all), cheaper than every higher score.
        if cheapest < cheapest_above:
            front.extend(p for p in tied if cost(p) == cheapest)
        cheapest_above = min(cheapest_above, cheapest)
    return front


def proposals_under_active_policy(*, campaign: Campaign) -> QuerySet[Proposal]:
    """The proposals evaluated under the policy now in use: in an alternating campaign, scores
    under an earlier policy version do not compare with today's (HRP: a harness's score mixes
    its own ceiling with its fit to the policy)."""
    return proposal_list(campaign=campaign).filter(
        Q(policy_version=campaign.active_policy_version) | Q(policy_version__isnull=True)
    )


def campaign_task_front(*, campaign: Campaign) -> dict[str, list[str]]:
    """For each SEARCH task, the candidates (SHAs) with the best mean score on it (> 0), among
    the proposals evaluated under the policy now in use."""
    best: dict[str, tuple[float, list[str]]] = {}
    for proposal in proposals_under_active_policy(campaign=campaign).filter(
        search_evaluation__isnull=False, candidate__isnull=False
    ):
        for key, scores in evaluation_task_scores(
            evaluation_id=proposal.search_evaluation_id
        ).items():
            mean = sum(scores) / len(scores)
            if mean <= 0:
                continue
            top, shas = best.get(key, (0.0, []))
            if mean > top:
                best[key] = (mean, [proposal.candidate.sha])
            elif mean == top and proposal.candidate.sha not in shas:
                shas.append(proposal.candidate.sha)
    return {key: shas for key, (_, shas) in sorted(best.items())}


def campaign_best_series(
    *, campaign: Campaign, points: Sequence[ProposalPoint] | None = None
) -> list[dict[str, Any]]:
    """Per ended proposal: its search and validation scores, whether it raised the best, and
    the best validation so far. "Raised the best" is ``Proposal.improved`` as the runner
    recorded it (coevo.campaigns.evaluating), never judged again from the scores here: a tie
    is no improvement, and the plot must say what the table and the stop rules say.
    ``points``: the campaign's (``campaign_points``), when the caller has them already."""
    if points is None:
        points = campaign_points(campaign=campaign)
    series = []
    best = None
    for p in points:
        if not p.is_final:
            continue
        if p.improved and p.validation_score is not None:
            best = p.validation_score
        series.append(
            {
                "sequence": p.sequence,
                "search_score": p.search_score,
                "validation_score": p.validation_score,
                "improved": p.improved,
                "best_validation_score": best,
            }
        )
    return series


def campaign_best_proposal(*, campaign: Campaign) -> Proposal | None:
    if campaign.best_candidate_id is None:
        return None
    return (
        proposal_list(campaign=campaign)
        .filter(candidate_id=campaign.best_candidate_id, state=ProposalState.EVALUATED)
        .order_by("-validation_score")
        .first()
    )


@dataclass
class ProposerValidity:
    """How many of a proposer model's proposals passed every validation stage (reached
    evaluation), and where the others were rejected (their first failing stage)."""

    model: str
    kind: str
    judged: int = 0  # past the validation stages: valid or invalid
    valid: int = 0
    rejected_at: dict[str, int] | None = None
    proposer_tokens: int = 0
    # US dollars of its calls where its endpoint had a price; None: none had.
    proposer_cost_usd: Decimal | None = None

    @property
    def valid_share(self) -> float | None:
        return self.valid / self.judged if self.judged else None


def proposer_validity(*, campaigns: QuerySet[Campaign] | list[Campaign]) -> list[ProposerValidity]:
    """Per proposer model (llm-patch and agentic: ``params["model"]``; other kinds by kind),
    the share of valid proposals over ``campaigns``: what the evolution benchmark reports
    beside the scores. Proposals still waiting for their stages are not counted."""
    rows: dict[tuple[str, str], ProposerValidity] = {}
    proposals = (
        Proposal.objects.filter(campaign__in=campaigns)
        .exclude(kind__in=[ProposerKind.SEED, ProposerKind.MANUAL])
        .exclude(state__in=[ProposalState.QUEUED, ProposalState.PROPOSED])
        .only("kind", "state", "stages", "params", "proposer_tokens", "proposer_cost_usd")
    )
    for proposal in proposals:
        model = str((proposal.params or {}).get("model") or "-")
        row = rows.setdefault(
            (proposal.kind, model), ProposerValidity(model=model, kind=proposal.kind)
        )
        row.judged += 1
        row.proposer_tokens += proposal.proposer_tokens
        if proposal.proposer_cost_usd is not None:
            row.proposer_cost_usd = (
                row.proposer_cost_usd or Decimal(0)
            ) + proposal.proposer_cost_usd
        if proposal.state != ProposalState.INVALID:
            row.valid += 1
            continue
        failed = next((s for s in proposal.stages or [] if not s.get("ok")), None)
        stage = str(failed["stage"]) if failed else "unknown"
        row.rejected_at = row.rejected_at or {}
        row.rejected_at[stage] = row.rejected_at.get(stage, 0) + 1
    return sorted(rows.values(), key=lambda row: (row.kind, row.model))
