"""Merge gates: a candidate against a baseline (a channel's holder or a SHA) on one suite
split, under a declared policy, decided from two evaluations run side by side."""

import uuid

from django.conf import settings
from django.db import models

from coevo.db import TimeStampedModel
from coevo.evaluations.models import Evaluation
from coevo.policies.models import PolicyVersion
from coevo.projects.models import Project
from coevo.suites.models import Split, Suite
from harness_store.models import Candidate


class GateState(models.TextChoices):
    PENDING = "pending"  # evaluations created, no rollout started yet
    RUNNING = "running"
    FINISHED = "finished"  # a verdict was reached (which may be "error")
    FAILED = "failed"  # the verdict could not be computed (verdict "error", see state_detail)


GATE_OPEN_STATES = (GateState.PENDING, GateState.RUNNING)
GATE_FINAL_STATES = (GateState.FINISHED, GateState.FAILED)


class GateVerdict(models.TextChoices):
    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"
    ERROR = "error"


class Gate(TimeStampedModel):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="gates")
    candidate = models.ForeignKey(Candidate, on_delete=models.RESTRICT, related_name="gates")
    baseline = models.ForeignKey(Candidate, on_delete=models.RESTRICT, related_name="+")
    # As given: a channel name or a SHA. The channel's holder at creation time is `baseline`.
    against = models.CharField(max_length=100)
    suite = models.ForeignKey(Suite, on_delete=models.RESTRICT, related_name="gates")
    split = models.CharField(max_length=16, choices=Split.choices, default=Split.VALIDATION)
    policy_version = models.ForeignKey(PolicyVersion, on_delete=models.RESTRICT, related_name="+")
    epochs = models.PositiveSmallIntegerField(default=1)
    seed = models.BigIntegerField(default=0)
    # The declared policy, validated by coevo.gates.policy.GatePolicy (its as_dict()).
    policy = models.JSONField(default=dict)
    candidate_evaluation = models.ForeignKey(
        Evaluation, on_delete=models.RESTRICT, related_name="+"
    )
    baseline_evaluation = models.ForeignKey(Evaluation, on_delete=models.RESTRICT, related_name="+")
    state = models.CharField(max_length=16, choices=GateState.choices, default=GateState.PENDING)
    state_detail = models.TextField(blank=True)
    verdict = models.CharField(max_length=16, choices=GateVerdict.choices, blank=True)
    # [{"rule", "outcome": pass|fail|inconclusive|error, "message"}], one per declared rule.
    reasons = models.JSONField(default=list, blank=True)
    # {"candidate": summary, "baseline": summary, "comparison": ..., "errors": ...}
    statistics = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=(models.Q(state__in=GATE_FINAL_STATES) & ~models.Q(verdict=""))
                | (~models.Q(state__in=GATE_FINAL_STATES) & models.Q(verdict="")),
                name="gate_verdict_iff_final",
            ),
            models.CheckConstraint(condition=~models.Q(split="heldout"), name="gate_not_heldout"),
            models.CheckConstraint(condition=models.Q(epochs__gte=1), name="gate_epochs_positive"),
        ]
        indexes = [
            # gate_advance_ready (the beat job): open gates, oldest first.
            models.Index(
                fields=["created_at"],
                name="gate_open_idx",
                condition=models.Q(state__in=GATE_OPEN_STATES),
            ),
        ]

    def __str__(self) -> str:
        return f"gate {self.id}"

    @property
    def is_final(self) -> bool:
        return self.state in GATE_FINAL_STATES
