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


class ImageBuildOutcome(models.TextChoices):
    BUILT = "built"
    FAILED = "failed"


class ImageBuildSource(models.TextChoices):
    ROLLOUT = "rollout", "a rollout"
    SOLUTION_CHECK = "solution_check", "the import's solution check"


class TaskImageBuild(TimeStampedModel):
    """One build of a task's image that ran (a cache hit is not one), on whichever machine ran
    it: a worker at a rollout's start, or the importing process checking solutions. Workers
    build on their own machines and the web process has no engine, so this row is how the
    suite's page learns of a build (coevo/suites/image_builds.py writes it)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="image_builds")
    outcome = models.CharField(max_length=16, choices=ImageBuildOutcome.choices)
    source = models.CharField(max_length=16, choices=ImageBuildSource.choices)
    # What was built: the image's content hash (workers/containers/images.py), empty for a
    # docker_image's CA layer; the tag it got, empty when it failed.
    content_hash = models.CharField(max_length=64, blank=True)
    image = models.CharField(max_length=255, blank=True)
    seconds = models.FloatField(null=True, blank=True)
    # Where a failed build stopped: the instruction as written and its Dockerfile line, when
    # the builder got that far; ``error`` is the failure's message, bounded.
    failed_step = models.TextField(blank=True)
    failed_line = models.PositiveIntegerField(null=True, blank=True)
    timed_out = models.BooleanField(default=False)
    error = models.TextField(blank=True)
    # The build's log, bounded (its head and its tail: image_builds.MAX_LOG_BYTES). Only the
    # suite page's detail of a task that is not held out ever reads it.
    log = models.TextField(blank=True)
    machine = models.CharField(max_length=255, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            # The latest build of each task (the suite page's "Images"): one index scan per task.
            models.Index(fields=["task", "-created_at"], name="task_image_build_latest"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(outcome__in=ImageBuildOutcome.values),
                name="task_image_build_outcome_valid",
            ),
            # A failed step belongs to a failed build: a built image names none.
            models.CheckConstraint(
                condition=models.Q(outcome=ImageBuildOutcome.FAILED)
                | models.Q(failed_step="", failed_line__isnull=True, timed_out=False),
                name="task_image_build_built_names_no_failed_step",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.task_id} {self.outcome} {self.created_at:%Y-%m-%d %H:%M}"
