from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import Count, Q, QuerySet, Sum

from coevo.errors import NotFound
from coevo.evaluations.models import Evaluation, Outcome, Rollout, RolloutState, TraceStep
from coevo.evaluations.stats import ScoreSummary, pass_rate_summary
from coevo.projects.models import Project
from harness_store.models import Candidate


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
    prompt_tokens: int
    completion_tokens: int
    score: ScoreSummary

    @property
    def percent(self) -> int:
        return int(100 * self.done / self.total) if self.total else 100

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def evaluation_list(
    *, project: Project, candidate: Candidate | None = None
) -> QuerySet[Evaluation]:
    qs = Evaluation.objects.filter(project=project).select_related("candidate", "suite")
    if candidate is not None:
        qs = qs.filter(candidate=candidate)
    return qs


def evaluation_get(*, project: Project, evaluation_id: Any) -> Evaluation:
    try:
        return Evaluation.objects.select_related("candidate", "suite", "policy_version").get(
            project=project, id=evaluation_id
        )
    except (Evaluation.DoesNotExist, ValueError, TypeError):
        raise NotFound(f"No evaluation {evaluation_id} in project {project.slug}.") from None


def evaluation_progress(*, evaluation: Evaluation) -> EvaluationProgress:
    """Counts by state and outcome, tokens, and the pass rate with its Wilson interval.

    infra_error rollouts are not scores: they are left out of the pass rate's denominator.
    harness_error rollouts count as failures (they are the candidate's fault).
    """
    agg = Rollout.objects.filter(evaluation=evaluation).aggregate(
        **_rollout_counts(),
        prompt_tokens=Sum("prompt_tokens"),
        completion_tokens=Sum("completion_tokens"),
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
        prompt_tokens=agg["prompt_tokens"] or 0,
        completion_tokens=agg["completion_tokens"] or 0,
        score=pass_rate_summary(agg["passed"], scored),
    )


@dataclass(frozen=True)
class EvaluationSummary:
    evaluation: Evaluation
    total: int
    done: int
    score: ScoreSummary


def evaluation_summaries(
    *, project: Project, candidate: Candidate | None = None, limit: int = 20
) -> list[EvaluationSummary]:
    """The latest evaluations with their pass rate (counted as evaluation_progress counts),
    in one query."""
    rows = (
        evaluation_list(project=project, candidate=candidate)
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
        "passed": count(**done, outcome=Outcome.PASSED),
        "task_failures": count(**done, outcome=Outcome.TASK_FAILURE),
        "harness_errors": count(**done, outcome=Outcome.HARNESS_ERROR),
        "infra_errors": count(**done, outcome=Outcome.INFRA_ERROR),
    }


def rollout_list(*, evaluation: Evaluation) -> QuerySet[Rollout]:
    # Never the trace or the task's hidden verifier on a list page.
    return (
        Rollout.objects.filter(evaluation=evaluation)
        .select_related("task")
        .defer("answer", "task__verifier", "task__inputs")
        .order_by("task__position", "epoch")
    )


def rollout_get(*, project: Project, rollout_id: Any) -> Rollout:
    try:
        return (
            Rollout.objects.select_related("evaluation__candidate", "evaluation__suite", "task")
            .defer("task__verifier")
            .get(evaluation__project=project, id=rollout_id)
        )
    except (Rollout.DoesNotExist, ValueError, TypeError):
        raise NotFound(f"No rollout {rollout_id} in project {project.slug}.") from None


def rollout_trace(*, rollout: Rollout) -> QuerySet[TraceStep]:
    return TraceStep.objects.filter(rollout=rollout).order_by("attempt", "index")
