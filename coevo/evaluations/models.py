import uuid

from django.conf import settings
from django.db import models

from coevo.db import TimeStampedModel
from coevo.policies.models import PolicyVersion
from coevo.projects.models import Project
from coevo.suites.models import Split, Suite, Task
from harness_store.models import Candidate


class EvaluationState(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"


EVALUATION_FINAL_STATES = (
    EvaluationState.FINISHED,
    EvaluationState.FAILED,
    EvaluationState.CANCELLED,
)


class Evaluation(TimeStampedModel):
    """A candidate × policy version × suite split × epochs; fans out to one rollout per task × epoch."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="evaluations")
    candidate = models.ForeignKey(Candidate, on_delete=models.PROTECT, related_name="evaluations")
    policy_version = models.ForeignKey(
        PolicyVersion, on_delete=models.PROTECT, related_name="evaluations"
    )
    suite = models.ForeignKey(Suite, on_delete=models.PROTECT, related_name="evaluations")
    split = models.CharField(max_length=16, choices=Split.choices)
    epochs = models.PositiveSmallIntegerField(default=1)
    seed = models.BigIntegerField(default=0)
    task_limit = models.PositiveIntegerField(null=True, blank=True)
    knobs = models.JSONField(default=dict, blank=True)
    state = models.CharField(
        max_length=16, choices=EvaluationState.choices, default=EvaluationState.PENDING
    )
    state_detail = models.TextField(blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(epochs__gte=1), name="evaluation_epochs_positive"
            ),
        ]

    def __str__(self) -> str:
        return f"evaluation {self.id}"

    @property
    def is_final(self) -> bool:
        return self.state in EVALUATION_FINAL_STATES


class RolloutState(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    CANCELLED = "cancelled"


ROLLOUT_FINAL_STATES = (RolloutState.DONE, RolloutState.CANCELLED)


class Outcome(models.TextChoices):
    PASSED = "passed"
    TASK_FAILURE = "task_failure", "task failure"
    HARNESS_ERROR = "harness_error", "harness error"
    INFRA_ERROR = "infra_error", "infra error"


class Rollout(TimeStampedModel):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    evaluation = models.ForeignKey(Evaluation, on_delete=models.CASCADE, related_name="rollouts")
    task = models.ForeignKey(Task, on_delete=models.PROTECT, related_name="rollouts")
    epoch = models.PositiveSmallIntegerField(default=0)
    seed = models.BigIntegerField()
    state = models.CharField(
        max_length=16, choices=RolloutState.choices, default=RolloutState.PENDING
    )
    outcome = models.CharField(max_length=16, choices=Outcome.choices, blank=True)
    score = models.FloatField(null=True, blank=True)
    detail = models.TextField(blank=True)
    answer = models.JSONField(null=True, blank=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    model_calls = models.PositiveIntegerField(default=0)
    latency_ms = models.PositiveIntegerField(default=0)
    attempts = models.PositiveSmallIntegerField(default=0)
    worker = models.CharField(max_length=200, blank=True)
    celery_task_id = models.CharField(max_length=64, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["task__position", "epoch"]
        constraints = [
            models.UniqueConstraint(
                fields=["evaluation", "task", "epoch"], name="rollout_one_per_task_epoch"
            ),
            models.CheckConstraint(
                condition=~models.Q(state="done") | ~models.Q(outcome=""),
                name="rollout_done_has_outcome",
            ),
        ]
        indexes = [
            # evaluation_progress: counts of rollouts by state for one evaluation.
            models.Index(fields=["evaluation", "state"], name="rollout_eval_state_idx"),
        ]

    def __str__(self) -> str:
        return f"rollout {self.id}"

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def is_final(self) -> bool:
        return self.state in ROLLOUT_FINAL_STATES


class TraceStep(models.Model):
    """One step of a rollout's trace. Kept out of list pages: only the rollout page loads them."""

    rollout = models.ForeignKey(Rollout, on_delete=models.CASCADE, related_name="steps")
    attempt = models.PositiveSmallIntegerField(default=1)
    index = models.PositiveIntegerField()
    kind = models.CharField(max_length=32)
    payload = models.JSONField()
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    latency_ms = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["rollout", "attempt", "index"]
        constraints = [
            models.UniqueConstraint(
                fields=["rollout", "attempt", "index"], name="trace_step_unique_index"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.rollout_id} #{self.attempt}.{self.index} {self.kind}"
