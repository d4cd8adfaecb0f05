"""Reading training runs for pages and the API."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from coevo.errors import NotFound
from coevo.projects.models import Project
from coevo.training.models import TrainingRun


def training_run_list(*, project: Project) -> QuerySet[TrainingRun]:
    return (
        TrainingRun.objects.filter(project=project)
        .select_related("trainer", "export", "parent_policy", "policy_version", "created_by")
        .defer("log_tail")
    )


def training_run_get(*, project: Project, run_id: Any) -> TrainingRun:
    run = (
        TrainingRun.objects.filter(project=project, id=run_id)
        .select_related(
            "project", "trainer", "export", "parent_policy", "policy_version", "created_by"
        )
        .first()
    )
    if run is None:
        raise NotFound(f"No training run {run_id} in project {project.slug}.")
    return run
