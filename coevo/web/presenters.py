"""Read functions the dashboard needs beyond the domain selectors, shaped for templates.

Every function takes an already permission-checked project (or a row reached through one).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import groupby
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Count, QuerySet

from coevo.evaluations.models import Rollout, TraceStep
from coevo.evaluations.selectors import rollout_trace
from coevo.projects.models import Membership, Project
from coevo.projects.selectors import project_list_for_user


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
