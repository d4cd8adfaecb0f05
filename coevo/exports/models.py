"""Trajectory exports: rollouts' model calls as training data (JSONL), with provenance.

An export is created with its filters and the evaluations they matched at that moment (so a
rebuild, or a second export with the same filters, reads the same rollouts), built by a
Celery task into ``COEVO_EXPORT_DIR/<sha256>.jsonl`` and then never changes: the file is named
by its content, so identical exports share one file.
"""

import uuid

from django.conf import settings
from django.db import models

from coevo.db import TimeStampedModel
from coevo.evaluations.models import Evaluation
from coevo.projects.models import Project


class ExportFormat(models.TextChoices):
    CHAT = "chat"  # {"messages": [...], "weight", "provenance"}
    PROMPT_COMPLETION = "prompt_completion"  # {"prompt", "completion", "weight", "provenance"}


class ExportState(models.TextChoices):
    PENDING = "pending"
    BUILDING = "building"
    READY = "ready"
    FAILED = "failed"


EXPORT_FINAL_STATES = (ExportState.READY, ExportState.FAILED)


class TrajectoryExport(TimeStampedModel):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="exports")
    format = models.CharField(max_length=32, choices=ExportFormat.choices)
    # As validated by coevo.exports.services.ExportFilters.as_dict().
    filters = models.JSONField(default=dict)
    # The evaluations the filters matched at creation: the build reads only these, and trace
    # retention keeps their traces (coevo/exports/retention.py).
    evaluations = models.ManyToManyField(Evaluation, related_name="+", blank=True)
    state = models.CharField(
        max_length=16, choices=ExportState.choices, default=ExportState.PENDING
    )
    state_detail = models.TextField(blank=True)
    sha256 = models.CharField(max_length=64, blank=True)
    size_bytes = models.PositiveBigIntegerField(default=0)
    rows = models.PositiveIntegerField(default=0)
    rollouts = models.PositiveIntegerField(default=0)
    celery_task_id = models.CharField(max_length=64, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=~models.Q(state="ready") | models.Q(sha256__regex=r"^[0-9a-f]{64}$"),
                name="export_ready_has_sha256",
            ),
        ]

    def __str__(self) -> str:
        return f"export {self.id} ({self.format}, {self.state})"

    @property
    def is_final(self) -> bool:
        return self.state in EXPORT_FINAL_STATES

    @property
    def filename(self) -> str:
        return f"{self.project.slug}-{self.format}-{self.sha256[:12]}.jsonl"
