from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any, NamedTuple

from django.db.models import Count, F, Q, QuerySet, Sum, Window
from django.db.models.fields.json import KT
from django.db.models.functions import RowNumber

from coevo.db import keyset_slice
from coevo.errors import InvalidInput, NotFound
from coevo.evaluations.models import (
    Budget,
    Evaluation,
    EvaluationStage,
    EvaluationState,
    Rollout,
    RolloutState,
    TraceStep,
)
from coevo.evaluations.stats.means import (
    ScoreSummary,
    mean_score_summary,
    pass_at_k_summary,
    pass_rate_summary,
    per_task_means,
    per_task_pass_counts,
)
from coevo.evaluations.stats.paired import PairedComparison, paired_comparison
from coevo.evaluations.traces import PAGE_SIZE as TRACE_PAGE_SIZE
from coevo.evaluations.traces import Cursor, TracePage, trace_page
from coevo.projects.audience import Audience
from coevo.projects.models import Project
from coevo.suites.models import Split
from harness_store.models import Candidate
from workers.outcomes import RolloutOutcome
from workers.trace import ModelCall, StepKind


@dataclass(frozen=True)
class EvaluationProgress:
    total: int
    done: int
    running: int
    pending: int
    passed: int
    task_failures: int
    harness_errors: int
    infra_errors: int
    cancelled: int
    reused: int
    prompt_tokens: int
    completion_tokens: int
    score: ScoreSummary
    # US dollars of its rollouts' model calls; None when none had a price ("—").
    cost_usd: Decimal | None = None

    @property
    def percent(self) -> int:
        return int(100 * self.done / self.total) if self.total else 100

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def evaluation_list(
    *, project: Project, audience: Audience, candidate: Candidate | None = None
) -> QuerySet[Evaluation]:
    """The project's evaluations; held-out ones only for ``Audience.REVIEWER`` (they are
    sealed: docs/architecture.md, "The held-out seal")."""
    qs = Evaluation.objects.filter(project=project).select_related("candidate", "suite")
    if candidate is not None:
        qs = qs.filter(candidate=candidate)
    if not audience.sees_heldout:
        qs = qs.exclude(split=Split.HELDOUT)
    return qs


def evaluation_get(*, project: Project, evaluation_id: Any, audience: Audience) -> Evaluation:
    """The evaluation; a held-out one is answered as not found unless ``audience`` is
    ``Audience.REVIEWER``."""
    qs = Evaluation.objects.select_related("candidate", "suite", "policy_version")
    if not audience.sees_heldout:
        qs = qs.exclude(split=Split.HELDOUT)
    try:
        return qs.get(project=project, id=evaluation_id)
    except (Evaluation.DoesNotExist, ValueError, TypeError):
        raise NotFound(
            f"No evaluation {evaluation_id} in project {project.slug}"
            + ("" if audience.sees_heldout else " outside the sealed held-out split")
            + "."
        ) from None


def evaluation_progress(*, evaluation: Evaluation) -> EvaluationProgress:
    """Counts by state and outcome, tokens, and the pass rate with its Wilson interval.

    infra_error rollouts are not scores: they are left out of the pass rate's denominator.
    harness_error rollouts count as failures (they are the candidate's fault).
    """
    agg = Rollout.objects.filter(evaluation=evaluation).aggregate(
        **_rollout_counts(),
        prompt_tokens=Sum("prompt_tokens"),
        completion_tokens=Sum("completion_tokens"),
        cost_usd=Sum("cost_usd"),
    )
    scored = agg["done"] - agg["infra_errors"]
    return EvaluationProgress(
        total=agg["total"],
        done=agg["done"],
        running=agg["running"],
        pending=agg["pending"],
        passed=agg["passed"],
        task_failures=agg["task_failures"],
        harness_errors=agg["harness_errors"],
        infra_errors=agg["infra_errors"],
        cancelled=agg["cancelled"],
        reused=agg["reused"],
        prompt_tokens=agg["prompt_tokens"] or 0,
        completion_tokens=agg["completion_tokens"] or 0,
        score=pass_rate_summary(agg["passed"], scored),
        cost_usd=agg["cost_usd"],
    )


@dataclass(frozen=True)
class EvaluationSummary:
    evaluation: Evaluation
    total: int
    done: int
    score: ScoreSummary


def evaluation_summaries(
    *,
    project: Project,
    audience: Audience,
    candidate: Candidate | None = None,
    limit: int = 20,
) -> list[EvaluationSummary]:
    """The latest evaluations with their pass rate (counted as evaluation_progress counts),
    in one query; held-out ones as evaluation_list lets ``audience`` see them."""
    rows = (
        evaluation_list(project=project, audience=audience, candidate=candidate)
        .select_related("policy_version")
        .annotate(**_rollout_counts("rollouts__"))[:limit]
    )
    return [
        EvaluationSummary(
            evaluation=row,
            total=row.total,
            done=row.done,
            score=pass_rate_summary(row.passed, row.done - row.infra_errors),
        )
        for row in rows
    ]


def _rollout_counts(prefix: str = "") -> dict[str, Count]:
    """Rollout counts by state and outcome; ``prefix`` reaches rollouts through a relation."""

    def count(**conditions: str) -> Count:
        condition = Q(**{f"{prefix}{key}": value for key, value in conditions.items()})
        return Count(f"{prefix}id" if prefix else "id", filter=condition)

    done = {"state": RolloutState.DONE}
    return {
        "total": Count(f"{prefix}id" if prefix else "id"),
        "done": count(**done),
        "running": count(state=RolloutState.RUNNING),
        "pending": count(state=RolloutState.PENDING),
        "passed": count(**done, outcome=RolloutOutcome.PASSED),
        "task_failures": count(**done, outcome=RolloutOutcome.TASK_FAILURE),
        "harness_errors": count(**done, outcome=RolloutOutcome.HARNESS_ERROR),
        "infra_errors": count(**done, outcome=RolloutOutcome.INFRA_ERROR),
        "cancelled": count(state=RolloutState.CANCELLED),
        "reused": Count(
            f"{prefix}id" if prefix else "id",
            filter=Q(**{f"{prefix}reused_from__isnull": False}),
        ),
    }


def rollout_list(*, evaluation: Evaluation) -> QuerySet[Rollout]:
    # Never the trace or the task's hidden verifier on a list page.
    return (
        Rollout.objects.filter(evaluation=evaluation)
        .select_related("task")
        .defer("answer", "task__verifier", "task__inputs")
        .order_by("task__position", "epoch")
    )


@dataclass(frozen=True)
class RolloutPage:
    rollouts: list[Rollout]
    # Pass as ``cursor`` for the next page ("task position.epoch"); None on the last page.
    next_cursor: str | None


def rollout_list_page(
    *, evaluation: Evaluation, cursor: str | None = None, limit: int = 100
) -> RolloutPage:
    """One page of rollout_list after ``cursor``: keyset pagination on (task position, epoch),
    unique within an evaluation, so an evaluation of 5,000 rollouts is read a page at a time
    and a page never shifts while rollouts finish."""
    limit = max(1, min(limit, 500))
    rows = rollout_list(evaluation=evaluation)
    if cursor:
        position, epoch = _rollout_cursor_decode(cursor)
        rows = rows.filter(
            Q(task__position__gt=position) | Q(task__position=position, epoch__gt=epoch)
        )
    page, more = keyset_slice(rows, limit)
    last = page[-1] if page else None
    return RolloutPage(
        rollouts=page,
        next_cursor=f"{last.task.position}.{last.epoch}" if more and last else None,
    )


def _rollout_cursor_decode(cursor: str) -> tuple[int, int]:
    try:
        position, epoch = cursor.split(".", 1)
        return int(position), int(epoch)
    except ValueError:
        raise InvalidInput("That page link is broken: start again from the first page.") from None


def rollout_get(*, project: Project, rollout_id: Any, audience: Audience) -> Rollout:
    """``Audience.REVIEWER`` only on a promotion request's pages, which check that the rollout
    is part of the request's evidence: for anyone else a held-out rollout (its outcome, score
    and detail as much as its trace) is answered as not found, like its evaluation."""
    rollouts = Rollout.objects.filter(evaluation__project=project)
    if not audience.sees_heldout:
        rollouts = rollouts.exclude(evaluation__split=Split.HELDOUT)
    try:
        return (
            rollouts.select_related("evaluation__candidate", "evaluation__suite", "task")
            .defer("task__verifier")
            .get(id=rollout_id)
        )
    except (Rollout.DoesNotExist, ValueError, TypeError):
        raise NotFound(f"No rollout {rollout_id} in project {project.slug}.") from None


def rollout_trace(
    *,
    rollout: Rollout,
    cursor: Cursor | None = None,
    query: str = "",
    page_size: int = TRACE_PAGE_SIZE,
) -> TracePage:
    """One page of the rollout's trace from ``cursor`` (page 1 when None), optionally only
    the steps matching ``query``. Never the whole trace: see coevo.evaluations.traces."""
    return trace_page(rollout=rollout, cursor=cursor, query=query, page_size=page_size)


# The most calls one read of the tree returns. It is cut in step order, so every kept call's
# parent is kept too: workers/program.py places a call, and records its step, only after its
# parent's. Each row read decompresses its payload, so readers ask for the prefix they need.
CALL_TREE_MAX_CALLS = 20_000


class CallRow(NamedTuple):
    """One model call at a program harness's boundary, and where its step is (a tuple: a
    long trace has thousands)."""

    attempt: int
    index: int  # the step's
    call: int
    session: int | None  # None: refused by the policy server before it had a place
    parent: int | None
    relation: str | None  # starts | continues | repeats | branches


def rollout_call_tree(*, rollout: Rollout, limit: int = CALL_TREE_MAX_CALLS) -> list[CallRow]:
    """The boundary calls among the rollout's first ``limit`` model-call steps, with their
    place in the call tree (the ``call``, ``session``, ``parent`` and ``relation`` keys
    workers/program.py records), in step order: one query that reads those four JSON keys,
    never whole payloads into Python. The keys come as text (``->>``): decoding four JSON
    values a row costs more than the query on a long trace."""
    limit = max(0, min(limit, CALL_TREE_MAX_CALLS))
    # The prefix is picked by (attempt, index) alone, and only its rows' keys are read: each
    # key read decompresses the payload, and a filter or sort on one reads every step's.
    prefix = (
        TraceStep.objects.filter(rollout=rollout, kind=StepKind.MODEL_CALL)
        .order_by("attempt", "index")
        .values("id")[:limit]
    )
    rows = (
        TraceStep.objects.filter(id__in=prefix)
        .order_by("attempt", "index")
        .annotate(
            tree_call=KT(f"payload__{ModelCall.key('call')}"),
            tree_session=KT(f"payload__{ModelCall.key('session')}"),
            tree_parent=KT(f"payload__{ModelCall.key('parent')}"),
            tree_relation=KT(f"payload__{ModelCall.key('relation')}"),
        )
        .values_list(
            "attempt", "index", "tree_call", "tree_session", "tree_parent", "tree_relation"
        )
    )
    places = []
    for attempt, index, call, session, parent, relation in rows:
        number = _as_int(call)
        if number is not None:
            places.append(
                CallRow(attempt, index, number, _as_int(session), _as_int(parent), relation)
            )
    return places


def _as_int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


_SCORED = (RolloutOutcome.PASSED, RolloutOutcome.TASK_FAILURE, RolloutOutcome.HARNESS_ERROR)


def evaluation_task_scores(*, evaluation_id: Any) -> dict[str, list[float]]:
    """Per-task scores of finished, scored rollouts (infra errors are not scores; harness
    errors score 0: they are the candidate's fault)."""
    scores = evaluations_task_scores(evaluation_ids=[evaluation_id])
    return next(iter(scores.values()), {})


def evaluations_task_scores(*, evaluation_ids: list[Any]) -> dict[Any, dict[str, list[float]]]:
    """evaluation_task_scores of several evaluations in one query (a matrix's cells), by
    evaluation id; an evaluation without scored rollouts is left out."""
    scores: dict[Any, dict[str, list[float]]] = {}
    rows = (
        Rollout.objects.filter(evaluation_id__in=evaluation_ids, state=RolloutState.DONE)
        .filter(outcome__in=_SCORED)
        .order_by("evaluation_id", "task__position", "epoch")
        .values_list("evaluation_id", "task__key", "score", "outcome")
    )
    for evaluation_id, key, score, outcome in rows:
        if score is None:
            score = 1.0 if outcome == RolloutOutcome.PASSED else 0.0
        scores.setdefault(evaluation_id, {}).setdefault(key, []).append(float(score))
    return scores


@dataclass(frozen=True)
class EvaluationStatistics:
    """The figures of the evaluation page: mean per-task score with its interval, pass@k."""

    mean: ScoreSummary
    pass_at_k: dict[int, float]
    tasks: int
    complete_tasks: int


def evaluation_statistics(*, evaluation: Evaluation) -> EvaluationStatistics:
    scores = evaluation_task_scores(evaluation_id=evaluation.id)
    means = per_task_means(scores)
    counts = per_task_pass_counts(scores)
    complete = {task: nc for task, nc in counts.items() if nc[0] >= evaluation.epochs}
    ks = [k for k in (1, 2, 4, 8, 16, 32, 64) if k <= evaluation.epochs]
    if evaluation.epochs not in ks:
        ks.append(evaluation.epochs)
    pass_at_k = pass_at_k_summary(complete, ks) if complete else {}
    return EvaluationStatistics(
        mean=mean_score_summary(list(means.values()), seed=evaluation.seed),
        pass_at_k=pass_at_k,
        tasks=len(scores),
        complete_tasks=len(complete),
    )


def evaluation_stages(*, evaluation: Evaluation) -> list[EvaluationStage]:
    return list(EvaluationStage.objects.filter(evaluation=evaluation).order_by("index"))


def evaluation_budget(*, evaluation: Evaluation) -> Budget | None:
    return Budget.objects.filter(evaluation=evaluation).first()


@dataclass(frozen=True)
class ErrorCount:
    outcome: str
    kind: str
    count: int
    example: str


def evaluation_errors(*, evaluation: Evaluation) -> list[ErrorCount]:
    """harness_error and infra_error rollouts by kind, with one example reason each: one
    query, however many kinds (the example is a subquery per group, not a query per kind)."""
    errors = Rollout.objects.filter(
        evaluation=evaluation,
        state=RolloutState.DONE,
        outcome__in=[RolloutOutcome.HARNESS_ERROR, RolloutOutcome.INFRA_ERROR],
    )
    # Window functions: one pass over the error rollouts. (An example subquery next to a GROUP
    # BY is grouped by, and ran once per error rollout: 900 ms on a 5,000-rollout evaluation.)
    group = [F("outcome"), F("error_kind")]
    rows = (
        errors.annotate(
            n=Window(Count("id"), partition_by=group),
            rank=Window(
                RowNumber(), partition_by=group, order_by=[F("task__position"), F("epoch")]
            ),
        )
        .filter(rank=1)
        .order_by()
        .values("outcome", "error_kind", "n", "detail")
    )
    ordered = sorted(rows, key=lambda row: (row["outcome"], -row["n"], row["error_kind"]))
    return [
        ErrorCount(row["outcome"], row["error_kind"] or "other", row["n"], row["detail"] or "")
        for row in ordered
    ]


@dataclass(frozen=True)
class FlipRow:
    task_key: str
    flip: str
    reference_score: float
    candidate_score: float
    reference_rollout: Any
    candidate_rollout: Any


@dataclass(frozen=True)
class EvaluationComparison:
    reference: Evaluation
    candidate: Evaluation
    statistics: PairedComparison
    flips: list[FlipRow]


def evaluation_comparable_list(*, evaluation: Evaluation) -> QuerySet[Evaluation]:
    """The evaluations ``evaluation`` compares with task by task (evaluation_compare): the same
    suite and split, itself left out; never held-out ones (sealed: docs/architecture.md, "The held-out seal")."""
    return (
        Evaluation.objects.filter(
            project_id=evaluation.project_id, suite_id=evaluation.suite_id, split=evaluation.split
        )
        .exclude(split=Split.HELDOUT)
        .exclude(id=evaluation.id)
        .select_related("candidate", "suite")
    )


def evaluation_compare(*, reference: Evaluation, candidate: Evaluation) -> EvaluationComparison:
    """The paired comparison of two evaluations on the same suite split, with the flipped
    tasks (and a rollout of each side to open)."""
    if reference.suite_id != candidate.suite_id or reference.split != candidate.split:
        raise InvalidInput(
            "Only evaluations on the same suite and split can be compared task by task."
        )
    ref_scores = evaluation_task_scores(evaluation_id=reference.id)
    cand_scores = evaluation_task_scores(evaluation_id=candidate.id)
    statistics = paired_comparison(ref_scores, cand_scores, seed=candidate.seed)
    flipped = {
        key: name
        for name, keys in statistics.flips.items()
        if name in ("fixed", "broken", "improved", "regressed")
        for key in keys
    }
    first_rollouts: dict[tuple[Any, str], Any] = {}
    for evaluation_id, key, rollout_id in (
        Rollout.objects.filter(
            evaluation_id__in=[reference.id, candidate.id], task__key__in=list(flipped)
        )
        .order_by("epoch")
        .values_list("evaluation_id", "task__key", "id")
    ):
        first_rollouts.setdefault((evaluation_id, key), rollout_id)
    ref_means = per_task_means(ref_scores)
    cand_means = per_task_means(cand_scores)
    rows = [
        FlipRow(
            task_key=key,
            flip=name,
            reference_score=ref_means[key],
            candidate_score=cand_means[key],
            reference_rollout=first_rollouts.get((reference.id, key)),
            candidate_rollout=first_rollouts.get((candidate.id, key)),
        )
        for key, name in sorted(flipped.items(), key=lambda item: (item[1], item[0]))
    ]
    return EvaluationComparison(reference, candidate, statistics, rows)


def search_validation_gap(
    *, search_score: float | None, validation_score: float | None
) -> float | None:
    """How much of a search score did not carry over to validation: search − validation
    (positive: the search split flattered it; AutoSaddler, HDA). None without both scores."""
    if search_score is None or validation_score is None:
        return None
    return search_score - validation_score


@dataclass(frozen=True)
class SplitGap:
    """A candidate's latest finished search and validation scores on one suite and policy: the
    gap is how much of its search score did not carry over (AutoSaddler, HDA)."""

    suite: str
    policy_version: str
    search: Evaluation
    validation: Evaluation
    search_mean: float | None
    validation_mean: float | None

    @property
    def gap(self) -> float | None:
        return search_validation_gap(
            search_score=self.search_mean, validation_score=self.validation_mean
        )


def candidate_split_gaps(*, candidate: Candidate) -> list[SplitGap]:
    latest: dict[tuple[Any, Any, str], Evaluation] = {}
    finished = (
        Evaluation.objects.filter(
            candidate=candidate,
            state=EvaluationState.FINISHED,
            split__in=(Split.SEARCH, Split.VALIDATION),
        )
        .select_related("suite", "policy_version")
        .order_by("created_at")
    )
    for evaluation in finished:
        latest[(evaluation.suite_id, evaluation.policy_version_id, evaluation.split)] = evaluation
    gaps = []
    for (suite_id, policy_id, split), search in latest.items():
        if split != Split.SEARCH:
            continue
        validation = latest.get((suite_id, policy_id, Split.VALIDATION))
        if validation is None:
            continue
        gaps.append(
            SplitGap(
                suite=search.suite.name,
                policy_version=search.policy_version.name,
                search=search,
                validation=validation,
                search_mean=evaluation_statistics(evaluation=search).mean.mean,
                validation_mean=evaluation_statistics(evaluation=validation).mean.mean,
            )
        )
    return gaps
