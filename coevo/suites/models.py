import uuid
from typing import Any

from django.db import models

from coevo.db import TimeStampedModel
from coevo.errors import CoevoError
from coevo.projects.models import Project


class SuiteInUse(CoevoError):
    """A change to a suite that an evaluation has used: its scores would stop meaning anything."""

    code = "suite_in_use"


# Fields that define what a suite is; description may still be edited after use.
SUITE_CONTENT_FIELDS = (
    "project_id",
    "name",
    "kind",
    "version",
    "content_hash",
    "split_seed",
    "scorer",
)


class SuiteKind(models.TextChoices):
    HUMANEVAL = "humaneval", "HumanEval"
    TEXTWORLD = "textworld", "TextWorld"
    JSONL = "jsonl", "custom (JSONL)"
    WORKSPACE = "workspace", "workspace (Harbor tasks)"


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
    # How answers are scored, as shown on pages (scorer kind and parameters). A Python
    # verifier's source is not here: it travels in each task's ``verifier`` payload.
    scorer = models.JSONField(default=dict, blank=True)
    # The suite this one is a slice of (a subset of its tasks, e.g. the demo's few TextWorld
    # games): a slice and its source are one suite family, so a promotion judged on the full
    # suite still finds the candidate's search and validation scores from a campaign that ran
    # on the slice (suite_family). Not content: it never changes what a score means.
    source = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="slices"
    )

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

    @property
    def is_used(self) -> bool:
        return self._state.adding is False and self.evaluations.exists()

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding and self.is_used:
            stored = Suite.objects.filter(pk=self.pk).values(*SUITE_CONTENT_FIELDS).first()
            changed = [
                name
                for name in SUITE_CONTENT_FIELDS
                if stored and stored[name] != getattr(self, name)
            ]
            if changed:
                raise SuiteInUse(
                    f"Suite {self} has been used by an evaluation, so its {', '.join(changed)} "
                    "cannot change. Import the changed suite instead: it becomes a new version."
                )
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        if self.is_used:
            raise SuiteInUse(
                f"Suite {self} has been used by an evaluation and cannot be deleted: its "
                "evaluations' scores refer to its tasks."
            )
        return super().delete(*args, **kwargs)


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

    # Tasks are written once, by an import. These guards keep an evaluated suite's tasks
    # from being changed through the ORM; bulk ``QuerySet.update()`` bypasses them, so no
    # service may use it on tasks.
    def save(self, *args: Any, **kwargs: Any) -> None:
        self._refuse_if_suite_used("changed")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        self._refuse_if_suite_used("deleted")
        return super().delete(*args, **kwargs)

    def _refuse_if_suite_used(self, verb: str) -> None:
        if Suite.objects.filter(pk=self.suite_id, evaluations__isnull=False).exists():
            raise SuiteInUse(
                f"Task {self.key} cannot be {verb}: its suite has been used by an evaluation. "
                "Import the changed file instead: it becomes a new version of the suite."
            )
