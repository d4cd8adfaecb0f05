"""The harness × policy compatibility matrix: every candidate evaluated under every policy
version on one suite split, so a harness tuned for one policy can be seen losing under another
(HRP: deployed return = harness ceiling − policy mismatch; comparing harnesses under one fixed
model mixes the two)."""

import uuid

from django.conf import settings
from django.db import models

from coevo.db import TimeStampedModel
from coevo.evaluations.models import Budget, Evaluation
from coevo.policies.models import PolicyVersion
from coevo.projects.models import Project
from coevo.suites.models import Split, Suite
from harness_store.models import Candidate


class MatrixState(models.TextChoices):
    """Computed from the cells (never stored: the cells' evaluations are the truth)."""

    RUNNING = "running"
    FINISHED = "finished"  # every cell finished
    INCOMPLETE = "incomplete"  # every cell final, some failed or were cancelled


MATRIX_FINAL_STATES = (MatrixState.FINISHED, MatrixState.INCOMPLETE)


class CompatibilityMatrix(TimeStampedModel):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="matrices")
    name = models.CharField(max_length=200, blank=True)
    suite = models.ForeignKey(Suite, on_delete=models.PROTECT, related_name="matrices")
    split = models.CharField(max_length=16, choices=Split.choices)
    epochs = models.PositiveSmallIntegerField(default=1)
    seed = models.BigIntegerField(default=0)
    task_limit = models.PositiveIntegerField(null=True, blank=True)
    # The ledger account every cell's evaluation reserves on (as parent_budget).
    budget = models.OneToOneField(Budget, on_delete=models.PROTECT, related_name="matrix")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            # Held-out tasks are sealed (docs/architecture.md, "The held-out seal"): only a promotion request evaluates them.
            models.CheckConstraint(
                condition=~models.Q(split=Split.HELDOUT), name="matrix_split_not_heldout"
            ),
            models.CheckConstraint(
                condition=models.Q(epochs__gte=1), name="matrix_epochs_positive"
            ),
        ]

    def __str__(self) -> str:
        return f"matrix {self.id}"


class MatrixCell(models.Model):
    """One (candidate, policy version) cell: its row and column fix the grid's order."""

    matrix = models.ForeignKey(CompatibilityMatrix, on_delete=models.CASCADE, related_name="cells")
    row = models.PositiveSmallIntegerField()
    column = models.PositiveSmallIntegerField()
    candidate = models.ForeignKey(Candidate, on_delete=models.PROTECT, related_name="+")
    policy_version = models.ForeignKey(PolicyVersion, on_delete=models.PROTECT, related_name="+")
    evaluation = models.ForeignKey(Evaluation, on_delete=models.PROTECT, related_name="+")

    class Meta:
        ordering = ["row", "column"]
        constraints = [
            models.UniqueConstraint(
                fields=["matrix", "row", "column"], name="matrix_cell_position"
            ),
            models.UniqueConstraint(
                fields=["matrix", "candidate", "policy_version"], name="matrix_cell_unique_pair"
            ),
        ]

    def __str__(self) -> str:
        return f"matrix {self.matrix_id} cell ({self.row}, {self.column})"
