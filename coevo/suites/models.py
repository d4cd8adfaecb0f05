import uuid

from django.db import models

from coevo.db import TimeStampedModel
from coevo.projects.models import Project


class SuiteKind(models.TextChoices):
    HUMANEVAL = "humaneval", "HumanEval"


class Split(models.TextChoices):
    SEARCH = "search"
    VALIDATION = "validation"
    HELDOUT = "heldout", "held-out"


class Suite(TimeStampedModel):
    """A versioned, content-hashed task suite; immutable once imported."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="suites")
    name = models.SlugField(max_length=64)
    kind = models.CharField(max_length=32, choices=SuiteKind.choices)
    version = models.CharField(max_length=32)
    content_hash = models.CharField(max_length=64)
    split_seed = models.CharField(max_length=64, default="0")
    description = models.TextField(blank=True)

    class Meta:
        ordering = ["name", "-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["project", "name", "content_hash", "split_seed"],
                name="suite_unique_content",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name}@{self.version}"


class Task(models.Model):
    """One task of a suite. ``inputs`` is what a harness sees; ``verifier`` never leaves the worker."""

    suite = models.ForeignKey(Suite, on_delete=models.CASCADE, related_name="tasks")
    key = models.CharField(max_length=200)
    split = models.CharField(max_length=16, choices=Split.choices, db_index=True)
    position = models.PositiveIntegerField()
    inputs = models.JSONField()
    verifier = models.JSONField()

    class Meta:
        ordering = ["suite", "position"]
        constraints = [
            models.UniqueConstraint(fields=["suite", "key"], name="task_unique_key"),
        ]

    def __str__(self) -> str:
        return self.key
