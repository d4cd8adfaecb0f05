import uuid

from django.conf import settings
from django.db import models

from coevo.db import TimeStampedModel
from coevo.projects.models import Project


class CandidateOrigin(models.TextChoices):
    IMPORT = "import", "imported directory"
    CI = "ci", "CI"
    PROPOSER = "proposer", "proposer"
    MANUAL = "manual", "manual"


class Candidate(TimeStampedModel):
    """One commit of a project's harness repository. Git holds the content; this row indexes it."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="candidates")
    sha = models.CharField(max_length=40)
    tree_sha = models.CharField(max_length=40)
    # Lineage: first parent first, as git orders them; merges have two.
    parent_shas = models.JSONField(default=list, blank=True)
    message = models.TextField()
    author_name = models.CharField(max_length=200)
    author_email = models.CharField(max_length=200, blank=True)
    authored_at = models.DateTimeField()
    origin = models.CharField(
        max_length=16, choices=CandidateOrigin.choices, default=CandidateOrigin.IMPORT
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )

    class Meta:
        ordering = ["-authored_at", "-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["project", "sha"], name="candidate_unique_sha"),
        ]
        indexes = [
            # candidate_find_by_tree: "is this directory already a candidate?"
            models.Index(fields=["project", "tree_sha"], name="candidate_tree_idx"),
            # candidate_page: the project page's candidates, newest first, a keyset page at a
            # time (authored_at, id), however many commits the project has.
            models.Index(fields=["project", "-authored_at", "-id"], name="candidate_recent_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.project.slug}@{self.short_sha}"

    @property
    def short_sha(self) -> str:
        return self.sha[:12]

    @property
    def parent_sha(self) -> str | None:
        return self.parent_shas[0] if self.parent_shas else None

    @property
    def subject(self) -> str:
        return self.message.strip().splitlines()[0] if self.message.strip() else ""


class TreeSnapshot(models.Model):
    """A candidate's tree as a gzipped tar, addressed by its git tree SHA.

    Workers read candidate content from here, by SHA, through the database they already talk
    to: no worker needs the harness store's disk. Git stays the source of truth; a snapshot is
    written when a commit is indexed and never changes.
    """

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="tree_snapshots")
    tree_sha = models.CharField(max_length=40)
    archive = models.BinaryField()
    size_bytes = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "tree_sha"], name="tree_snapshot_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.project_id}:{self.tree_sha[:12]}"


class StoreCheck(models.Model):
    """One integrity check of a project's repository (``git fsck`` plus the database's
    candidates present in git), kept so the system page can show the latest result."""

    # How much of git's output a row keeps: enough to read the first errors, bounded so a
    # badly broken repository does not write megabytes per check.
    OUTPUT_MAX_CHARS = 20_000

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="store_checks")
    ok = models.BooleanField()
    output = models.TextField(blank=True)
    duration_ms = models.PositiveIntegerField(default=0)
    checked_at = models.DateTimeField()

    class Meta:
        ordering = ["-checked_at"]
        indexes = [
            # store_check_latest: the newest check of each project.
            models.Index(fields=["project", "-checked_at"], name="store_check_latest_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.project_id} {'ok' if self.ok else 'FAILED'} at {self.checked_at}"
