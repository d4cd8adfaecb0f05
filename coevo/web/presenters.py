"""Read functions the dashboard needs beyond the domain selectors, shaped for templates.

Every function takes an already permission-checked project (or a row reached through one).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import groupby
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Count, Q, QuerySet

from coevo.evaluations.models import Evaluation, Outcome, Rollout, RolloutState, TraceStep
from coevo.evaluations.selectors import evaluation_list, rollout_trace
from coevo.evaluations.stats import ScoreSummary, pass_rate_summary
from coevo.projects.models import Membership, Project
from coevo.projects.selectors import project_list_for_user
from harness_store.models import Candidate


@dataclass(frozen=True)
class EvaluationSummary:
    evaluation: Evaluation
    total: int
    done: int
    score: ScoreSummary


@dataclass
class TraceAttempt:
    number: int
    steps: list[TraceStep] = field(default_factory=list)


def project_summaries_for_user(*, user: AbstractBaseUser) -> QuerySet[Project]:
    """The projects a user may see, with candidate and evaluation counts."""
    return project_list_for_user(user=user).annotate(
        candidate_count=Count("candidates", distinct=True),
        evaluation_count=Count("evaluations", distinct=True),
    )


def membership_role(*, project: Project, user: AbstractBaseUser) -> str | None:
    membership = Membership.objects.filter(project=project, user=user).first()
    return membership.role if membership else None


def evaluation_summaries(
    *, project: Project, candidate: Candidate | None = None, limit: int = 20
) -> list[EvaluationSummary]:
    """The latest evaluations with their pass rate, in one query.

    Counted as evaluation_progress counts: infra_error rollouts are not scores.
    """
    done = Q(rollouts__state=RolloutState.DONE)
    rows = (
        evaluation_list(project=project, candidate=candidate)
        .select_related("policy_version")
        .annotate(
            rollouts_total=Count("rollouts"),
            rollouts_done=Count("rollouts", filter=done),
            rollouts_passed=Count("rollouts", filter=done & Q(rollouts__outcome=Outcome.PASSED)),
            rollouts_infra=Count(
                "rollouts", filter=done & Q(rollouts__outcome=Outcome.INFRA_ERROR)
            ),
        )[:limit]
    )
    return [
        EvaluationSummary(
            evaluation=row,
            total=row.rollouts_total,
            done=row.rollouts_done,
            score=pass_rate_summary(row.rollouts_passed, row.rollouts_done - row.rollouts_infra),
        )
        for row in rows
    ]


def trace_attempts(*, rollout: Rollout) -> list[TraceAttempt]:
    """The rollout's trace steps in order, grouped by attempt (infra errors are retried)."""
    return [
        TraceAttempt(number=number, steps=list(steps))
        for number, steps in groupby(rollout_trace(rollout=rollout), key=lambda s: s.attempt)
    ]


def task_prompt(*, rollout: Rollout) -> str:
    """What the harness was shown. Only ``inputs``: the verifier never reaches a page."""
    inputs: dict[str, Any] = rollout.task.inputs or {}
    prompt = inputs.get("prompt")
    return prompt if isinstance(prompt, str) else ""
