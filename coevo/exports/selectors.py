"""Reads of trajectory exports (project-scoped)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.db.models import Prefetch, QuerySet

from coevo.errors import InvalidState, NotFound
from coevo.evaluations.models import Evaluation
from coevo.exports.models import ExportState, TrajectoryExport
from coevo.exports.services import export_path
from coevo.projects.models import Project


def trajectory_export_list(*, project: Project) -> QuerySet[TrajectoryExport]:
    """The project's exports with their evaluations' ids prefetched (one query for a whole
    list, read by trajectory_export_evaluation_ids)."""
    evaluations = Evaluation.objects.order_by("created_at").only("id", "created_at")
    return (
        TrajectoryExport.objects.filter(project=project)
        .select_related("project", "created_by")
        .prefetch_related(Prefetch("evaluations", queryset=evaluations))
    )


def trajectory_export_evaluation_ids(*, export: TrajectoryExport) -> list[Any]:
    """The ids of the evaluations an export reads, oldest first."""
    return [e.id for e in sorted(export.evaluations.all(), key=lambda e: e.created_at)]


def trajectory_export_get(*, project: Project, export_id: Any) -> TrajectoryExport:
    export = trajectory_export_list(project=project).filter(id=export_id).first()
    if export is None:
        raise NotFound(f"No export {export_id} in project {project.slug}.")
    return export


def trajectory_export_file(*, export: TrajectoryExport) -> Path:
    """The ready export's file (for streaming; never read whole)."""
    if export.state != ExportState.READY:
        raise InvalidState(f"Export {export.id} is {export.state}: only a ready export downloads.")
    path = export_path(sha256=export.sha256)
    if not path.is_file():
        raise NotFound(
            f"The file of export {export.id} ({export.sha256}) is missing from the export "
            "directory (COEVO_EXPORT_DIR): restore it from a backup, or create the export again."
        )
    return path
