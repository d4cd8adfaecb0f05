"""Read functions the dashboard needs beyond the domain selectors, shaped for templates.

Every function takes an already permission-checked project (or a row reached through one).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Count, QuerySet

from coevo.evaluations.models import Rollout
from coevo.evaluations.selectors import rollout_trace
from coevo.evaluations.traces import Cursor, TracePage, TraceSummary, trace_summary
from coevo.projects.models import Membership, Project
from coevo.projects.selectors import project_list_for_user

OPEN_MODEL_CALLS_UP_TO = 4


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

    @property
    def multi_attempt(self) -> bool:
        return len(self.summary.attempts) > 1

    @property
    def is_game(self) -> bool:
        return "env_step" in self.summary.kinds or "env_reset" in self.summary.kinds


def trace_viewer(*, rollout: Rollout, cursor: str | None = None, query: str = "") -> TraceViewer:
    """The trace page from ``cursor`` ("attempt.index", page 1 when absent), searched with
    ``query``; each step gets ``attempt_head`` (the first shown step of an attempt)."""
    start = Cursor.parse(cursor)
    page = rollout_trace(rollout=rollout, cursor=start, query=query)
    summary = trace_summary(rollout=rollout)
    # A page that starts mid-attempt continues the previous page's attempt heading.
    previous = start.attempt if start is not None and start.index > 0 else None
    for step in page.steps:
        step.attempt_head = step.attempt != previous
        previous = step.attempt
    return TraceViewer(
        summary=summary,
        page=page,
        open_model_calls=summary.kinds.get("model_call", 0) <= OPEN_MODEL_CALLS_UP_TO,
    )


def task_prompt(*, rollout: Rollout) -> str:
    """What the harness was shown. Only ``inputs``: the verifier never reaches a page."""
    inputs: dict[str, Any] = rollout.task.inputs or {}
    # HumanEval tasks carry a "prompt"; custom JSONL tasks an "input" (text or any JSON value).
    prompt = inputs.get("prompt", inputs.get("input"))
    if prompt is None:
        return ""
    return prompt if isinstance(prompt, str) else json.dumps(prompt, indent=2, ensure_ascii=False)
