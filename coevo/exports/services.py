"""Trajectory exports: create (resolve and validate the filters, enqueue the build) and build
(write the JSONL to a temporary file, then rename it to its content hash)."""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import uuid
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from coevo.audit.services import audit_record
from coevo.enqueue import task_enqueue
from coevo.errors import InvalidInput, NotFound
from coevo.evaluations.models import EVALUATION_FINAL_STATES, Evaluation
from coevo.exports.models import ExportFormat, ExportState, TrajectoryExport
from coevo.exports.records import Counts, Selection, export_lines
from coevo.exports.signals import export_finished
from coevo.policies.models import PolicyVersion
from coevo.projects.models import Project
from coevo.suites.models import Split, Suite
from harness_store.models import Candidate

logger = logging.getLogger(__name__)

# The Celery task name (coevo.exports.tasks registers it; services send it by name).
TRAJECTORY_EXPORT_BUILD_TASK = "coevo.exports.tasks.trajectory_export_build"

EXPORTABLE_SPLITS = (Split.SEARCH, Split.VALIDATION)
MAX_LAST_TURNS = 10_000


@dataclass(frozen=True)
class ExportFilters:
    """An export's filters as stored (``TrajectoryExport.filters``): public ids only."""

    splits: list[str] = field(default_factory=lambda: [Split.SEARCH.value])
    candidate: str | None = None  # harness-matched: full SHA
    policy_version: str | None = None  # name
    suite: dict[str, str] | None = None  # {"name", "version"}
    successful_only: bool = False
    min_score: float | None = None
    last_turns: int | None = None
    evaluations: list[str] | None = None  # explicit evaluation ids (UUID strings)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def export_dir() -> Path:
    return Path(settings.COEVO_EXPORT_DIR)


def export_path(*, sha256: str) -> Path:
    return export_dir() / f"{sha256}.jsonl"


def _splits(splits: list[str] | None) -> list[str]:
    """Search by default; validation only when asked for; held-out never (the sealed split's
    rollouts must not become training data, or the held-out score stops meaning anything)."""
    chosen = list(dict.fromkeys(splits or [Split.SEARCH.value]))
    if Split.HELDOUT in chosen:
        raise InvalidInput(
            "Held-out rollouts are never exportable: they are sealed for promotion decisions. "
            "Export the search split (default) and, if you need it, the validation split."
        )
    unknown = [s for s in chosen if s not in EXPORTABLE_SPLITS]
    if unknown:
        raise InvalidInput(
            f"Unknown split(s) {', '.join(unknown)}: choose search and/or validation."
        )
    return chosen


def trajectory_export_create(
    *,
    project: Project,
    format: str,
    created_by: AbstractBaseUser | None,
    splits: list[str] | None = None,
    candidate: Candidate | None = None,
    policy_version: PolicyVersion | None = None,
    suite: Suite | None = None,
    successful_only: bool = False,
    min_score: float | None = None,
    last_turns: int | None = None,
    evaluations: list[Evaluation] | None = None,
) -> TrajectoryExport:
    """Create an export of the project's finished evaluations matching the filters and enqueue
    its build (on commit). ``candidate`` makes it harness-matched: only rollouts produced under
    that candidate. ``evaluations`` narrows it to those evaluations (each must match too)."""
    if format not in ExportFormat.values:
        raise InvalidInput(f"Unknown format {format!r}: choose chat or prompt_completion.")
    chosen = _splits(splits)
    if min_score is not None and not (0.0 <= min_score <= 1.0):
        raise InvalidInput("min_score must lie in [0, 1].")
    if last_turns is not None and not (1 <= last_turns <= MAX_LAST_TURNS):
        raise InvalidInput(f"last_turns must lie in [1, {MAX_LAST_TURNS}].")
    for obj, label in ((candidate, "candidate"), (suite, "suite")):
        if obj is not None and obj.project_id != project.id:
            raise NotFound(f"No such {label} in project {project.slug}.")

    matched = Evaluation.objects.filter(
        project=project, split__in=chosen, state__in=EVALUATION_FINAL_STATES
    )
    if candidate is not None:
        matched = matched.filter(candidate=candidate)
    if policy_version is not None:
        matched = matched.filter(policy_version=policy_version)
    if suite is not None:
        matched = matched.filter(suite=suite)
    if evaluations is not None:
        wanted = {e.id for e in evaluations}
        foreign = [e for e in evaluations if e.project_id != project.id]
        if foreign:
            raise NotFound(f"No evaluation {foreign[0].id} in project {project.slug}.")
        heldout = [e for e in evaluations if e.split == Split.HELDOUT]
        if heldout:
            raise InvalidInput(
                f"Evaluation {heldout[0].id} is a held-out evaluation: held-out rollouts are "
                "never exportable."
            )
        matched = matched.filter(id__in=wanted)
    evaluation_ids = list(matched.order_by("created_at", "id").values_list("id", flat=True))

    filters = ExportFilters(
        splits=chosen,
        candidate=candidate.sha if candidate else None,
        policy_version=policy_version.name if policy_version else None,
        suite={"name": suite.name, "version": suite.version} if suite else None,
        successful_only=successful_only,
        min_score=min_score,
        last_turns=last_turns,
        evaluations=sorted(str(e.id) for e in evaluations) if evaluations is not None else None,
    )
    with transaction.atomic():
        export = TrajectoryExport.objects.create(
            project=project, format=format, filters=filters.as_dict(), created_by=created_by
        )
        export.evaluations.set(evaluation_ids)
        audit_record(
            actor=created_by,
            project=project,
            action="export.created",
            target=export,
            after={
                "format": format,
                "filters": filters.as_dict(),
                "evaluations": len(evaluation_ids),
            },
        )
        transaction.on_commit(lambda: _enqueue(export.id))
    logger.info("export %s created: %d evaluation(s)", export.id, len(evaluation_ids))
    return export


def _enqueue(export_id: uuid.UUID) -> None:
    task_enqueue(
        TRAJECTORY_EXPORT_BUILD_TASK,
        str(export_id),
        queue="default",
        what=f"export {export_id}",
        record=lambda task_id: TrajectoryExport.objects.filter(id=export_id).update(
            celery_task_id=task_id
        ),
    )


def trajectory_exports_resend(*, older_than_s: float = 300.0) -> int:
    """Run by beat: send again the builds of exports still pending after ``older_than_s``
    (their message was lost, e.g. the broker was down at creation). A duplicate build is
    harmless: the first claims it, and a second of the same export writes the same bytes."""
    cutoff = timezone.now() - timedelta(seconds=older_than_s)
    resent = 0
    for export_id in TrajectoryExport.objects.filter(
        state=ExportState.PENDING, updated_at__lt=cutoff
    ).values_list("id", flat=True):
        TrajectoryExport.objects.filter(id=export_id).update(updated_at=timezone.now())
        _enqueue(export_id)
        resent += 1
    return resent


def trajectory_export_build(*, export_id: Any) -> TrajectoryExport | None:
    """Build the export's file. Safe to run twice (a redelivered task): a ready or failed
    export is left alone, and a second build of a building one writes the same bytes under
    the same name."""
    claimed = TrajectoryExport.objects.filter(
        id=export_id, state__in=(ExportState.PENDING, ExportState.BUILDING)
    ).update(state=ExportState.BUILDING, updated_at=timezone.now())
    if claimed != 1:
        return None
    export = TrajectoryExport.objects.select_related("project").get(id=export_id)
    try:
        sha256, size, counts = _write(export)
    except Exception as exc:
        logger.exception("export %s failed", export_id)
        moved = TrajectoryExport.objects.filter(id=export_id, state=ExportState.BUILDING).update(
            state=ExportState.FAILED,
            state_detail=f"{type(exc).__name__}: {exc}"[:2000],
            finished_at=timezone.now(),
        )
        if moved:
            _send_finished(export_id, ExportState.FAILED)
        return TrajectoryExport.objects.get(id=export_id)
    moved = TrajectoryExport.objects.filter(id=export_id, state=ExportState.BUILDING).update(
        state=ExportState.READY,
        sha256=sha256,
        size_bytes=size,
        rows=counts.rows,
        rollouts=counts.rollouts,
        finished_at=timezone.now(),
        updated_at=timezone.now(),
    )
    logger.info("export %s ready: %s (%d rows, %d bytes)", export_id, sha256, counts.rows, size)
    if moved:
        _send_finished(export_id, ExportState.READY)
    return TrajectoryExport.objects.get(id=export_id)


def _send_finished(export_id: Any, state: str) -> None:
    transaction.on_commit(
        lambda: export_finished.send(sender=TrajectoryExport, export_id=export_id, state=state)
    )


def _write(export: TrajectoryExport) -> tuple[str, int, Counts]:
    filters = export.filters
    selection = Selection(
        evaluation_ids=list(export.evaluations.values_list("id", flat=True)),
        splits=list(filters.get("splits") or [Split.SEARCH.value]),
        successful_only=bool(filters.get("successful_only")),
        min_score=filters.get("min_score"),
        last_turns=filters.get("last_turns"),
    )
    directory = export_dir()
    directory.mkdir(parents=True, exist_ok=True)
    counts = Counts()
    digest = hashlib.sha256()
    size = 0
    # The temporary file lives in the same directory, so the rename is atomic: a reader sees
    # either no file or the whole file, never a partial one.
    fd, tmp_name = tempfile.mkstemp(prefix=".building-", suffix=".jsonl", dir=directory)
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in export_lines(selection=selection, fmt=export.format, counts=counts):
                digest.update(chunk)
                size += len(chunk)
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        sha256 = digest.hexdigest()
        os.chmod(tmp_name, 0o444)
        # Same content, same name: an identical export's file is simply replaced by itself.
        os.replace(tmp_name, export_path(sha256=sha256))
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return sha256, size, counts
