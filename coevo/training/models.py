"""Policy training: operator-registered trainer commands and the runs that produce adapters.

A ``Trainer`` is a command an operator registered (Django admin or ``manage.py
trainer_register``): it runs on a training worker, outside any sandbox, so only staff may
define one; campaigns and users pick a trainer by name. A ``TrainingRun`` runs one trainer on
one trajectory export; when the command exits 0 and its output directory holds a valid LoRA
adapter, the adapter is installed under ``COEVO_ADAPTER_DIR`` and registered as a new
``PolicyVersion`` whose parent is the policy the export's rollouts came from.
"""

import uuid

from django.conf import settings
from django.db import models

from coevo.db import TimeStampedModel
from coevo.exports.models import TrajectoryExport
from coevo.policies.models import PolicyVersion
from coevo.projects.models import Project


class Trainer(TimeStampedModel):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.SlugField(max_length=64, unique=True)
    description = models.TextField(blank=True)
    # argv, with placeholders {export} {base_model} {output_dir} {parent_adapter} {run_dir}
    # {format}; the same values are in the environment as COEVO_EXPORT_PATH, ... (docs/training.md).
    command = models.JSONField()
    # Extra environment for the command (the worker's own environment is not passed on).
    env = models.JSONField(default=dict, blank=True)
    # The longest a run may take; a campaign may ask for less, never more.
    time_limit_s = models.PositiveIntegerField(default=3600)
    enabled = models.BooleanField(default=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(time_limit_s__gte=1), name="trainer_time_limit_positive"
            ),
        ]

    def __str__(self) -> str:
        return self.name


class TrainingState(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


TRAINING_FINAL_STATES = (TrainingState.SUCCEEDED, TrainingState.FAILED, TrainingState.CANCELLED)
TRAINING_OPEN_STATES = (TrainingState.PENDING, TrainingState.RUNNING)


class TrainingRun(TimeStampedModel):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="training_runs")
    trainer = models.ForeignKey(Trainer, on_delete=models.PROTECT, related_name="runs")
    export = models.ForeignKey(TrajectoryExport, on_delete=models.PROTECT, related_name="+")
    # The policy the trainer starts from: its base model (and adapter, when it has one).
    parent_policy = models.ForeignKey(PolicyVersion, on_delete=models.PROTECT, related_name="+")
    # The policy version registered from the run's adapter (set when it succeeds).
    policy_version = models.OneToOneField(
        PolicyVersion,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="training_run",
    )
    state = models.CharField(
        max_length=16, choices=TrainingState.choices, default=TrainingState.PENDING
    )
    state_detail = models.TextField(blank=True)
    time_limit_s = models.PositiveIntegerField()
    # The argv as run (placeholders filled in), written when the run starts.
    command = models.JSONField(default=list, blank=True)
    # Where the run's files live on the training worker: <run_dir>/output and <run_dir>/train.log.
    run_dir = models.CharField(max_length=1000, blank=True)
    # The last COEVO_TRAINING_LOG_TAIL bytes of the log, refreshed while the command runs.
    log_tail = models.TextField(blank=True)
    log_bytes = models.PositiveBigIntegerField(default=0)
    exit_code = models.IntegerField(null=True, blank=True)
    # sha256 over the installed adapter's files (name and bytes, in name order).
    adapter_sha256 = models.CharField(max_length=64, blank=True)
    # Written every few seconds by the worker running it: a stale one means the worker died.
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    cancel_requested = models.BooleanField(default=False)
    celery_task_id = models.CharField(max_length=64, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=~models.Q(state="succeeded") | models.Q(policy_version__isnull=False),
                name="training_run_succeeded_has_policy",
            ),
        ]
        indexes = [
            # The watchdog: runs whose worker may have died.
            models.Index(
                fields=["state"],
                name="training_run_open_idx",
                condition=models.Q(state__in=["pending", "running"]),
            ),
        ]

    def __str__(self) -> str:
        return f"training {self.id} ({self.trainer.name}, {self.state})"

    @property
    def is_final(self) -> bool:
        return self.state in TRAINING_FINAL_STATES

    @property
    def duration_s(self) -> float | None:
        if self.started_at is None:
            return None
        from django.utils import timezone

        end = self.finished_at or timezone.now()
        return (end - self.started_at).total_seconds()
