"""Gate reads, scoped to a project."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db.models import QuerySet

from coevo.errors import NotFound
from coevo.gates.models import Gate
from coevo.projects.models import Project


def gate_list(*, project: Project) -> QuerySet[Gate]:
    return Gate.objects.filter(project=project).select_related(
        "candidate",
        "baseline",
        "suite",
        "policy_version",
        "created_by",
        "candidate_evaluation",
        "baseline_evaluation",
    )


def gate_get(*, project: Project, gate_id: Any) -> Gate:
    try:
        gate = gate_list(project=project).filter(id=gate_id).first()
    except (ValidationError, ValueError):
        gate = None
    if gate is None:
        raise NotFound(f"No gate {gate_id} in project {project.slug}.")
    return gate
