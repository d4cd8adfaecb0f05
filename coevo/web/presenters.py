"""What the dashboard's templates show, shaped from domain rows and selectors: rows, badges,
previews, plot points. Views call these; no view builds its own. The domain rules (what is a
new best, what is the gap) stay in the domain: these only read them.

Every function takes an already permission-checked project (or a row reached through one).
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Count, QuerySet
from django.urls import reverse

from coevo.audit.models import AuditEvent
from coevo.campaigns.models import Campaign, Proposal, ProposalState, ProposerKind
from coevo.campaigns.plots import LineageNode, ParetoPoint
from coevo.campaigns.selectors import CampaignProgress, ProposalPoint
from coevo.evaluations.models import Rollout, RolloutState
from coevo.evaluations.selectors import (
    EvaluationComparison,
    FlipRow,
    rollout_call_tree,
    rollout_trace,
    search_validation_gap,
)
from coevo.evaluations.stats.means import MEAN_SCORE, PASS_RATE
from coevo.evaluations.stats.paired import PairedComparison, too_few_tasks_note
from coevo.evaluations.traces import (
    AttemptSummary,
    Cursor,
    TracePage,
    TraceSummary,
    trace_summary,
)
from coevo.gates.models import Gate
from coevo.gates.policy import GatePolicy
from coevo.projects.models import Membership, Project
from coevo.projects.selectors import project_list_for_user
from coevo.reviews.models import PromotionRequest
from coevo.reviews.promotions.evidence_types import SPLITS as EVIDENCE_SPLITS
from coevo.reviews.promotions.evidence_types import Evidence, Score, Side
from coevo.suites.models import Task
from coevo.suites.selectors import task_is_sealed
from coevo.web.trace_calls import model_call_views
from coevo.web.trace_tree import OVERVIEW_MAX_CALLS, CallTree, call_tree
from coevo.web.trace_workspace import WorkspaceView, rollout_workspace, workspace_step_views
from workers.outcomes import ErrorKind
from workers.trace import ModelCall, StepKind

OPEN_MODEL_CALLS_UP_TO = 4
# The most candidates a campaign's lineage draws (campaign_lineage summarizes beyond it).
LINEAGE_MAX_NODES = 60
# The most rows the campaign page's proposal table shows at once (proposal_window).
PROPOSAL_TABLE_ROWS = 50
PREVIEW_CHARS = 240
MAX_VALUE_CHARS = 120
# Verdict → badge class (coevo.css has pass / fail / infra).
VERDICT_BADGES = {"pass": "pass", "fail": "fail", "inconclusive": "infra", "error": "fail"}


def project_summaries_for_user(*, user: AbstractBaseUser) -> QuerySet[Project]:
    """The projects a user may see, with candidate and evaluation counts."""
    return project_list_for_user(user=user).annotate(
        candidate_count=Count("candidates", distinct=True),
        evaluation_count=Count("evaluations", distinct=True),
    )


def membership_role(*, project: Project, user: AbstractBaseUser) -> str | None:
    membership = Membership.objects.filter(project=project, user=user).first()
    return membership.role if membership else None


@dataclass
class TraceViewer:
    """One page of a rollout's trace and what the page shows around it."""

    summary: TraceSummary
    page: TracePage
    # Model calls start open only on short traces (a HumanEval rollout's one or two calls);
    # a game's hundred calls would bury the action/observation timeline.
    open_model_calls: bool
    # A program harness's calls by session (None: the trace has no boundary calls).
    calls: CallTree | None = None
    # A workspace task's final diff and test output (None: not one, or not asked for).
    workspace: WorkspaceView | None = None

    # What became of each attempt that left steps, by number (attempt_note).
    attempt_notes: dict[int, str] = field(default_factory=dict)

    @property
    def multi_attempt(self) -> bool:
        return len(self.summary.attempts) > 1

    @property
    def attempts(self) -> list[tuple[AttemptSummary, str]]:
        """Each attempt's totals with its note, for the summary line."""
        return [(a, self.attempt_notes.get(a.number, "")) for a in self.summary.attempts]

    @property
    def is_game(self) -> bool:
        return StepKind.ENV_STEP in self.summary.kinds or StepKind.ENV_RESET in self.summary.kinds

    @property
    def is_workspace(self) -> bool:
        return StepKind.WORKSPACE_DIFF in self.summary.kinds


def trace_viewer(
    *, rollout: Rollout, cursor: str | None = None, query: str = "", workspace: bool = False
) -> TraceViewer:
    """The trace page from ``cursor`` ("attempt.index", page 1 when absent), searched with
    ``query``; each step gets ``attempt_head`` (the first shown step of an attempt).
    ``workspace``: also read a workspace task's final diff and test output (one query, only
    for such a trace), which the whole page shows above the steps and a next page does not."""
    start = Cursor.parse(cursor)
    page = rollout_trace(rollout=rollout, cursor=start, query=query)
    summary = trace_summary(rollout=rollout)
    notes = {a.number: attempt_note(rollout=rollout, attempt=a.number) for a in summary.attempts}
    # A page that starts mid-attempt continues the previous page's attempt heading.
    previous = start.attempt if start is not None and start.index > 0 else None
    for step in page.steps:
        step.attempt_head = step.attempt != previous
        step.attempt_note = notes.get(step.attempt, "")
        previous = step.attempt
    calls = None
    if _may_have_boundary_calls(summary, page):
        # The overview's first calls, and every call up to this page's last step (for the
        # page's session numbers and parent links): a prefix, as long as the steps before it.
        limit = OVERVIEW_MAX_CALLS
        if page.steps:
            last = page.steps[-1]
            before = sum(a.steps for a in summary.attempts if a.number < last.attempt)
            limit = max(limit, before + last.index + 1)
        rows = rollout_call_tree(rollout=rollout, limit=limit)
        if rows:
            total = summary.kinds.get(StepKind.MODEL_CALL, 0)
            calls = call_tree(
                rows,
                on_page=((s.attempt, s.index) for s in page.steps),
                total=total,
                complete=total <= limit,
            )
    model_call_views(page.steps, tree=calls)
    shown = rollout_workspace(rollout=rollout, summary=summary) if workspace else None
    workspace_step_views(page.steps, shown=shown)
    return TraceViewer(
        summary=summary,
        page=page,
        open_model_calls=summary.kinds.get(StepKind.MODEL_CALL, 0) <= OPEN_MODEL_CALLS_UP_TO,
        calls=calls,
        workspace=shown,
        attempt_notes=notes,
    )


def attempt_note(*, rollout: Rollout, attempt: int) -> str:
    """What became of one attempt of ``rollout``, from the row alone. Each claim numbers a new
    attempt and only the last claimed can finish the rollout (the finish is a compare-and-swap
    on the number), so an earlier one stopped before its end: its worker died, or an
    infrastructure error sent the rollout back, and its steps end where it stopped."""
    if attempt < rollout.attempts:
        return "an earlier attempt that did not finish; the rollout ran again"
    if rollout.state == RolloutState.RUNNING:
        return "running"
    if rollout.state == RolloutState.CANCELLED:
        return "cancelled"
    if rollout.state == RolloutState.DONE and rollout.error_kind != ErrorKind.WORKER_LOST:
        return "the rollout's result"
    # Back in the queue, or given up by the watchdog after its worker died.
    return "did not finish"


def _may_have_boundary_calls(summary: TraceSummary, page: TracePage) -> bool:
    """Whether to ask for the call tree (one query): a page that shows model calls tells
    whether they are a program's (a boundary call carries its place in the tree); a page
    that shows none (a search, an env-only stretch) cannot tell, so it asks."""
    if StepKind.MODEL_CALL not in summary.kinds:
        return False
    shown = [s.payload for s in page.steps if s.kind == StepKind.MODEL_CALL]
    return not shown or any(
        isinstance(p, dict) and ModelCall.from_payload(p).call is not None for p in shown
    )


def task_prompt(*, rollout: Rollout) -> str:
    """What the harness was shown. Only ``inputs``: the verifier never reaches a page."""
    inputs: dict[str, Any] = rollout.task.inputs or {}
    # HumanEval tasks carry a "prompt"; custom JSONL tasks an "input" (text or any JSON value);
    # workspace tasks an "instruction" (their files are in the workspace section and trace).
    prompt = inputs.get("prompt", inputs.get("input", inputs.get("instruction")))
    if prompt is None:
        return ""
    return prompt if isinstance(prompt, str) else json.dumps(prompt, indent=2, ensure_ascii=False)


# --- campaigns -------------------------------------------------------------------------------


def bar_percent(part: float, whole: float | None) -> int | None:
    """A progress bar's width: ``part`` of ``whole`` in percent (0–100), None without a whole."""
    if not whole:
        return None
    return max(0, min(100, round(100 * part / whole)))


def campaign_spend_rows(*, progress: CampaignProgress) -> list[dict[str, Any]]:
    """The budget's spend rows with the widths of their spent and reserved bars."""
    return [
        {
            **row,
            "spent_percent": bar_percent(row["spent"], row["limit"]),
            "reserved_percent": bar_percent(row["reserved"], row["limit"]),
        }
        for row in progress.spend()
    ]


@dataclass(frozen=True)
class ProposalRow:
    proposal: Proposal
    stages: list[dict[str, Any]]  # {stage, ok, reason}
    failed_stage: dict[str, Any] | None
    outcome: str  # the validation outcome, in words
    outcome_class: str  # pass | fail | neutral (the badge)
    gap: float | None  # search − validation: how much the search split flattered it
    # Links, built here from routes reversed once (a table of 50 rows had 250 {% url %}s).
    parents: list[tuple[str, str]]  # (SHA, candidate page)
    candidate_href: str | None
    diff_href: str | None
    search_href: str | None
    validation_href: str | None


def proposal_rows(*, project: Project, proposals: list[Proposal]) -> list[ProposalRow]:
    """Each proposal with its stages, what validation made of it and its links, in sequence
    order."""
    candidate = candidate_href(project=project)
    diff = route_href(project=project, route="web:candidate_diff", placeholder="0" * 40)
    evaluation = route_href(
        project=project, route="web:evaluation", placeholder=str(uuid.UUID(int=0))
    )
    rows = []
    for p in sorted(proposals, key=lambda p: p.sequence):
        stages = [s for s in (p.stages or []) if isinstance(s, dict)]
        failed = next((s for s in stages if not s.get("ok")), None)
        outcome, css = _outcome(p, failed)
        gap = search_validation_gap(
            search_score=p.search_score, validation_score=p.validation_score
        )
        sha = p.candidate.sha if p.candidate is not None else None
        rows.append(
            ProposalRow(
                p,
                stages,
                failed,
                outcome,
                css,
                gap,
                parents=[(parent, candidate(parent)) for parent in p.parent_shas or []],
                candidate_href=candidate(sha) if sha else None,
                diff_href=diff(sha) if sha else None,
                search_href=evaluation(p.search_evaluation_id) if p.search_evaluation_id else None,
                validation_href=(
                    evaluation(p.validation_evaluation_id) if p.validation_evaluation_id else None
                ),
            )
        )
    return rows


def _outcome(p: Proposal, failed: dict[str, Any] | None) -> tuple[str, str]:
    if p.state == ProposalState.INVALID:
        where = failed.get("stage") if failed else "validation"
        return f"rejected at {where}", "fail"
    if p.state == ProposalState.FAILED:
        return "not evaluated (failed)", "fail"
    if p.state == ProposalState.QUEUED:
        return "queued for evaluation", "neutral"
    if not p.is_final:
        return "in progress", "neutral"
    if p.eliminated_at is not None:
        return f"eliminated by #{p.eliminated_by.sequence if p.eliminated_by else '?'}", "neutral"
    if p.validation_score is None:
        return "stopped on search (worse than its parent)", "neutral"
    if p.kind == ProposerKind.SEED:
        return "baseline", "neutral"
    # As the runner recorded it when the proposal ended (coevo.campaigns.evaluating).
    if p.improved:
        return "new best", "pass"
    return "no improvement", "neutral"


@dataclass(frozen=True)
class Lineage:
    nodes: list[LineageNode]
    left_out: int  # candidates not drawn (a large campaign's summary)


def campaign_lineage(
    *,
    project: Project,
    campaign: Campaign,
    points: list[ProposalPoint],
    limit: int = LINEAGE_MAX_NODES,
) -> Lineage:
    """The lineage to draw: every candidate while there are at most ``limit``; beyond that
    (a campaign of 2,000 proposals would draw a generation thousands of boxes wide) the seed,
    the path from it to the best, and the best-scoring others on validation (search breaks
    ties), up to ``limit``, with how many were left out."""
    unique: dict[str, LineageNode] = {}
    for node in lineage_nodes(project=project, campaign=campaign, points=points):
        unique.setdefault(node.sha, node)  # a duplicate candidate is drawn once, first come
    nodes = list(unique.values())
    if len(nodes) <= limit:
        return Lineage(nodes, 0)
    by_sha = {node.sha: node for node in nodes}
    keep = {nodes[0].sha}
    best = next((node for node in nodes if node.status == "best"), None)
    while best is not None and best.sha not in keep:
        keep.add(best.sha)
        best = next((by_sha[p] for p in best.parents if p in by_sha), None)
    scores: dict[str, tuple[float, float]] = {}
    for p in points:
        if p.sha is not None and p.sha not in scores:
            scores[p.sha] = (
                p.validation_score if p.validation_score is not None else -1.0,
                p.search_score if p.search_score is not None else -1.0,
            )
    ranked = sorted(nodes, key=lambda node: scores.get(node.sha, (-1.0, -1.0)), reverse=True)
    for node in ranked:
        if len(keep) >= limit:
            break
        keep.add(node.sha)
    shown = [node for node in nodes if node.sha in keep]
    return Lineage(shown, len(nodes) - len(shown))


def route_href(*, project: Project, route: str, placeholder: str) -> Callable[[Any], str]:
    """``key -> the project page's URL`` for a route taking the project's slug and one key,
    reversing it once (``placeholder``: a valid key): pages that link thousands of rows spent
    a quarter of their time in ``reverse``."""
    head, tail = reverse(route, args=[project.slug, placeholder]).rsplit(placeholder, 1)
    return lambda key: f"{head}{key}{tail}"


def candidate_href(*, project: Project) -> Callable[[str], str]:
    return route_href(project=project, route="web:candidate", placeholder="0" * 40)


def rollout_href(*, project: Project) -> Callable[[Any], str]:
    return route_href(project=project, route="web:rollout", placeholder=str(uuid.UUID(int=0)))


def lineage_nodes(
    *, project: Project, campaign: Campaign, points: list[ProposalPoint]
) -> list[LineageNode]:
    """The seed and every candidate a proposal produced, with their git parents (a merge has
    two); a candidate several proposals arrived at (a duplicate) appears once, first come."""
    seed = campaign.seed_candidate
    best_id = campaign.best_candidate_id
    href = candidate_href(project=project)

    nodes = [
        LineageNode(
            sha=seed.sha,
            parents=list(seed.parent_shas or []),
            label="seed",
            href=href(seed.sha),
            status="best" if best_id == seed.id else "seed",
            title=seed.subject,
        )
    ]
    for p in sorted(points, key=lambda p: p.sequence):
        if p.sha is None or p.kind == ProposerKind.SEED:
            continue
        if p.candidate_id == best_id:
            status = "best"
        elif p.state in (ProposalState.INVALID, ProposalState.FAILED):
            status = "failed"
        elif not p.is_final:
            # Queued ones too: a manual proposal waiting for the runner is not pruned.
            status = "open"
        elif p.validation_score is None:
            status = "pruned"
        else:
            status = "evaluated"
        nodes.append(
            LineageNode(
                sha=p.sha,
                parents=list(p.candidate_parents or p.parent_shas or []),
                label=f"#{p.sequence} {p.kind}",
                href=href(p.sha),
                status=status,
                title=p.subject,
            )
        )
    return nodes


def pareto_points(
    *, project: Project, points: list[ProposalPoint], front: list[ProposalPoint]
) -> list[ParetoPoint]:
    front_ids = {p.id for p in front}
    href = candidate_href(project=project)
    return [
        ParetoPoint(
            label=f"#{p.sequence} {p.short_sha}",
            tokens_per_task=p.tokens_per_task,
            validation_score=p.validation_score,
            on_front=p.id in front_ids,
            href=href(p.sha),
        )
        for p in points
        if p.state == ProposalState.EVALUATED
        and p.sha is not None
        and p.validation_score is not None
        and p.tokens_per_task is not None
    ]


@dataclass(frozen=True)
class FrontRow:
    point: ProposalPoint
    is_best: bool
    on_front: bool
    note: str  # for the chosen best off the front: why it is chosen though dominated


def pareto_table(
    *, points: list[ProposalPoint], front: list[ProposalPoint], best: Proposal | None
) -> list[FrontRow]:
    """The Pareto-front table: the front, and the campaign's chosen best always, marked (issue
    38: a later candidate that tied its validation score with fewer tokens pushed it off the
    front, and the promoted candidate looked dominated without a word).

    The best stays the first candidate to reach the campaign's highest validation score
    (coevo.campaigns.evaluating): the campaign optimises validation alone, and replacing the
    best on a tie would reset its patience and swap the candidate it promotes on a secondary
    axis. The table says so instead."""
    front_ids = {p.id for p in front}
    rows = [FrontRow(p, best is not None and p.id == best.id, True, "") for p in front]
    chosen = next((p for p in points if best is not None and p.id == best.id), None)
    if chosen is None or chosen.id in front_ids:
        return rows
    if chosen.validation_score is None or chosen.tokens_per_task is None:
        note = "chosen best: not on the front (no token count recorded for it)"
    else:
        dominators = [
            p
            for p in front
            if p.validation_score >= chosen.validation_score
            and p.tokens_per_task <= chosen.tokens_per_task
        ]
        ties = [p for p in dominators if p.validation_score == chosen.validation_score]
        named = ", ".join(
            f"#{p.sequence} ({p.tokens_per_task:.1f} tokens/task)" for p in ties or dominators
        )
        if ties:
            note = (
                f"chosen best though dominated on tokens: {named} tied its validation score "
                f"later with fewer tokens; the campaign keeps the first candidate to reach its "
                "best validation score, and a tie does not replace it"
            )
        else:
            note = (
                f"chosen best though dominated by {named}: the campaign's best is the first "
                "to reach its highest validation score under the policy it was scored with"
            )
    rows.append(FrontRow(chosen, True, False, note))
    # The front's own order (best score first, then cheapest): the chosen best follows the
    # cheaper candidate that tied it.
    return sorted(
        rows,
        key=lambda r: (-(r.point.validation_score or 0.0), r.point.tokens_per_task or math.inf),
    )


# --- comparisons -----------------------------------------------------------------------------

# The most flipped tasks the comparison page lists unless asked for all (two evaluations of
# 1,000 tasks can flip 700).
FLIP_TABLE_ROWS = 200
FLIP_NAMES = ("fixed", "broken", "improved", "regressed")


@dataclass(frozen=True)
class FlipLine:
    row: FlipRow
    reference_href: str | None
    candidate_href: str | None


@dataclass(frozen=True)
class FlipTable:
    lines: list[FlipLine]
    total: int  # the flipped tasks of ``flip`` (all kinds when None)
    flip: str | None


def flip_table(
    *,
    project: Project,
    comparison: EvaluationComparison,
    flip: str | None,
    show_all: bool,
    size: int = FLIP_TABLE_ROWS,
) -> FlipTable:
    """The comparison's flipped tasks of one kind (``flip``; all kinds when None or unknown),
    the first ``size`` unless ``show_all``, each with links to a rollout of either side."""
    flip = flip if flip in FLIP_NAMES else None
    rows = [row for row in comparison.flips if flip is None or row.flip == flip]
    href = rollout_href(project=project)
    lines = [
        FlipLine(
            row,
            href(row.reference_rollout) if row.reference_rollout else None,
            href(row.candidate_rollout) if row.candidate_rollout else None,
        )
        for row in (rows if show_all else rows[:size])
    ]
    return FlipTable(lines, len(rows), flip)


# --- suites ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskRow:
    key: str
    split: str
    position: int
    preview: str | None  # None: sealed (held-out), never rendered


def task_row(task: Task) -> TaskRow:
    """A task of task_catalogue's (``listed_inputs``: a workspace task's instruction only)."""
    if task_is_sealed(task=task):
        return TaskRow(task.key, task.split, task.position, None)
    return TaskRow(task.key, task.split, task.position, input_preview(task.listed_inputs))


def input_preview(inputs: Any) -> str:
    """A short text of what the harness sees (``inputs`` only; never the verifier)."""
    if isinstance(inputs, dict):
        # JSONL suites keep the task's input under "input"; HumanEval its "prompt"; workspace
        # tasks their "instruction".
        for name in ("input", "prompt", "objective", "instruction"):
            if name in inputs:
                inputs = inputs[name]
                break
    text = inputs if isinstance(inputs, str) else json.dumps(inputs, ensure_ascii=False)
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"


# --- promotions and gates --------------------------------------------------------------------


# How the page names the side the candidate is compared with, by the reference's kind.
REFERENCE_LABELS = {"holder": "holder", "campaign_seed": "campaign seed", "picked": "baseline"}


def promotion_sides(*, evidence: Evidence | None) -> list[tuple[str, dict[str, Any] | None]]:
    """The candidate's evidence and its reference's (the holder's or the baseline's), each
    with its search, validation and held-out scores in that order (None where a side or a
    split has none), labelled as the page shows them."""
    if evidence is None:
        return [("candidate", None), ("holder", None)]
    kind = (evidence.reference.kind if evidence.reference else None) or "holder"
    return [
        ("candidate", _side(evidence.candidate)),
        (REFERENCE_LABELS.get(kind, "reference"), _side(evidence.reference_side)),
    ]


def _side(side: Side | None) -> dict[str, Any] | None:
    if side is None:
        return None
    return {
        "sha": side.sha,
        "policy_version": side.policy_version,
        "errors": side.errors,
        "cost": side.cost,
        "cells": [
            {
                "score": side.scores.get(split),
                "missing": side.missing.get(split),
                **_evidence_score_interval(side.scores.get(split)),
            }
            for split in EVIDENCE_SPLITS
        ],
    }


def _evidence_score_interval(score: Score | None) -> dict[str, Any]:
    if score is None:
        return interval_view(ci_low=None, method=None, n_tasks=None, confidence=None)
    return interval_view(
        ci_low=score.ci_low, method=score.method, n_tasks=score.n_tasks, confidence=score.confidence
    )


# How a page names the interval method a score summary stored ("method" of ScoreSummary).
INTERVAL_METHODS = {"wilson": "Wilson interval", "bootstrap": "bootstrap interval over tasks"}


def score_interval(score: dict[str, Any] | None) -> dict[str, Any]:
    """A stored score summary's interval as a page shows it: see interval_view."""
    score = score or {}
    return interval_view(
        ci_low=score.get("ci_low"),
        method=score.get("method"),
        n_tasks=score.get("n_tasks"),
        confidence=score.get("confidence"),
    )


def interval_view(
    *, ci_low: float | None, method: str | None, n_tasks: int | None, confidence: float | None
) -> dict[str, Any]:
    """A score's interval as a page shows it (issue 38): its name ("95% Wilson interval"),
    or, for a bootstrap over too few tasks to mean anything, why none is shown. Wilson
    intervals hold their level at any n and are always shown."""
    if ci_low is None:
        return {"interval_shown": False, "interval_note": None, "interval_name": None}
    method = method or "wilson"
    note = too_few_tasks_note(int(n_tasks or 0)) if method == "bootstrap" else None
    confidence = float(confidence or 0.95)
    return {
        "interval_shown": note is None,
        "interval_note": note,
        "interval_name": f"{confidence * 100:g}% {INTERVAL_METHODS.get(method, method)}",
    }


def promotion_comparison(*, evidence: Evidence | None) -> PairedComparison | None:
    """The evidence's held-out paired comparison, for the `paired_verdict` line: the exact
    test's verdict, the difference named by its score, and an interval only where the
    comparison page would show one."""
    return evidence.comparison.statistics() if evidence and evidence.comparison else None


def promotion_heldout_tasks(*, evidence: Evidence | None) -> dict[str, Any] | None:
    """The held-out task list of the evidence as rows the page renders: per task, the
    candidate's result and the reference's (when there is one) in column order. None where
    the evidence has none: sealed (sealed_evidence keeps it for reviewers alone), or version 1
    (its flipped tasks are shown instead)."""
    listed = evidence.heldout_tasks if evidence else None
    if listed is None or not listed.tasks:
        return None
    compared = bool(evidence.reference and evidence.reference.kind)
    rows = [
        {
            "task": task.task,
            "flip": task.flip,
            "changed": task.changed,
            "sides": [task.candidate, task.reference] if compared else [task.candidate],
        }
        for task in listed.tasks
    ]
    return {"total": listed.total, "truncated": listed.truncated, "tasks": rows}


def promotion_reference_summary(
    *, evidence: Evidence | None, promotion: PromotionRequest
) -> dict[str, Any]:
    """Which reference the evidence compares against, in one sentence: the stored one
    (evidence version 2), one read from an older evidence's holder, or, before the evidence
    is assembled, what the request will compare against."""
    channel = promotion.channel.name
    if evidence is not None and evidence.reference is not None:
        reference: dict[str, Any] = {
            "kind": evidence.reference.kind,
            "sha": evidence.reference.sha,
            "policy_version": evidence.reference.policy_version,
            "summary": evidence.reference.summary,
        }
    elif evidence is not None:
        holder = evidence.holder
        reference = {
            "kind": "holder" if holder else None,
            "sha": holder.sha if holder else None,
            "summary": f"Compared with {channel}'s holder {holder.sha[:7]}."
            if holder
            else f"No comparison: {channel} held nothing.",
        }
    else:
        candidate = promotion.holder_candidate or promotion.baseline_candidate
        kind = "holder" if promotion.holder_candidate_id else promotion.baseline_kind or None
        reference = {
            "kind": kind,
            "sha": candidate.sha if candidate else None,
            "summary": f"Will compare with the {REFERENCE_LABELS[kind]} {candidate.short_sha}."
            if candidate
            else f"No comparison: {channel} holds nothing and there is no baseline.",
        }
    reference["label"] = REFERENCE_LABELS.get(reference.get("kind") or "", "reference")
    return reference


def promotion_looks(*, promotion: PromotionRequest) -> dict[str, int]:
    """How often held-out was looked at, by scope (the campaign's only for a campaign's)."""
    looks = {"in this project": promotion.heldout_looks_project}
    if promotion.heldout_looks_campaign is not None:
        looks["in the candidate's campaign"] = promotion.heldout_looks_campaign
    return looks


def gate_verdict_badge(verdict: str) -> str:
    return VERDICT_BADGES.get(verdict, "neutral")


@dataclass(frozen=True)
class GateFigure:
    """One number of a gate's statistics with what it is and what it decides."""

    value: float | None
    low: float | None  # the interval, when it is shown
    high: float | None
    interval_name: str | None
    interval_note: str | None  # why no interval is shown
    tasks: int
    role: str  # which rule it decides, or that none does


@dataclass(frozen=True)
class GateStatistics:
    score_name: str
    confidence: float
    candidate: GateFigure
    baseline: GateFigure
    delta: GateFigure
    test: str
    p_value: float | None
    test_verdict: str
    test_role: str
    fixed: list[str]
    broken: list[str]

    @property
    def sides(self) -> list[tuple[str, GateFigure]]:
        return [("candidate", self.candidate), ("baseline", self.baseline)]


def gate_statistics(*, gate: Gate) -> GateStatistics | None:
    """A gate's stored statistics as the page shows them (issue 38): the verdict is the gate's
    rules'; each figure says which rule it decides (min_score the candidate's interval,
    max_regression the paired delta's) or that no rule of this gate uses it (the exact test,
    which is the comparison page's verdict); an interval from a bootstrap over too few tasks
    says so instead of its numbers. Gates stored before this still render."""
    stats = gate.statistics or {}
    if not stats.get("candidate"):
        return None
    rules = set(GatePolicy.from_dict(gate.policy or {}).rules)
    comparison = stats.get("comparison") or {}
    confidence = float(stats.get("confidence") or 0.95)
    unused = "no rule of this gate uses it"

    def side(summary: dict[str, Any], role: str) -> GateFigure:
        shown = score_interval(summary)
        return GateFigure(
            value=summary.get("mean"),
            low=summary.get("ci_low") if shown["interval_shown"] else None,
            high=summary.get("ci_high") if shown["interval_shown"] else None,
            interval_name=shown["interval_name"],
            interval_note=shown["interval_note"],
            tasks=int(summary.get("n_tasks") or 0),
            role=role,
        )

    tasks = int(comparison.get("n_tasks") or 0)
    delta_note = too_few_tasks_note(tasks)
    has_delta = comparison.get("ci_low") is not None and delta_note is None
    delta = GateFigure(
        value=comparison.get("delta"),
        low=comparison.get("ci_low") if has_delta else None,
        high=comparison.get("ci_high") if has_delta else None,
        interval_name=f"{confidence * 100:g}% paired bootstrap interval over tasks",
        interval_note=delta_note,
        tasks=tasks,
        role="max_regression is judged on its interval" if "max_regression" in rules else unused,
    )
    fixed = list((comparison.get("flips") or {}).get("fixed") or [])
    broken = list((comparison.get("flips") or {}).get("broken") or [])
    significant = comparison.get("significant")
    if significant is None and comparison.get("p_value") is not None:
        significant = comparison["p_value"] < 1 - confidence
    if significant and len(fixed) != len(broken):
        test_verdict = "better" if len(fixed) > len(broken) else "worse"
    else:
        test_verdict = "no significant difference"
    return GateStatistics(
        score_name=PASS_RATE if comparison.get("kind") == "binary" else MEAN_SCORE,
        confidence=confidence,
        candidate=side(
            stats["candidate"],
            "min_score is judged on it" if "min_score" in rules else unused,
        ),
        baseline=side(stats.get("baseline") or {}, unused),
        delta=delta,
        test=comparison.get("test") or "exact sign test",
        p_value=comparison.get("p_value"),
        test_verdict=test_verdict,
        test_role=f"the comparison page's verdict; {unused}",
        fixed=fixed,
        broken=broken,
    )


# --- audit -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    key: str
    before: str | None  # None: absent on that side
    after: str | None


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value) if value is not None else "null"
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 1] + "…"


def audit_changes(event: AuditEvent) -> list[Change]:
    """A compact diff: only the keys whose value differs between before and after."""
    before = event.before if isinstance(event.before, dict) else {}
    after = event.after if isinstance(event.after, dict) else {}
    changes = []
    for key in sorted(set(before) | set(after)):
        if key in before and key in after and before[key] == after[key]:
            continue
        changes.append(
            Change(
                key=key,
                before=_short(before[key]) if key in before else None,
                after=_short(after[key]) if key in after else None,
            )
        )
    return changes
