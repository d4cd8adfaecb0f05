import uuid

from django.conf import settings
from django.db import models

from coevo.db import TimeStampedModel


class Project(TimeStampedModel):
    """An agent being improved: owns one harness repository, suites and members."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    # How many reviewers (other than the requester) must approve a promotion request; each
    # request copies it when created, so a later change does not move an open request's bar.
    required_approvals = models.PositiveSmallIntegerField(default=1)

    class Meta:
        ordering = ["slug"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(required_approvals__gte=1),
                name="project_required_approvals_positive",
            ),
        ]

    def __str__(self) -> str:
        return self.slug


class Role(models.TextChoices):
    VIEWER = "viewer"
    RESEARCHER = "researcher"
    REVIEWER = "reviewer"
    ADMIN = "admin"


# Each role can do everything the roles before it can.
ROLE_ORDER = (Role.VIEWER, Role.RESEARCHER, Role.REVIEWER, Role.ADMIN)


class Membership(TimeStampedModel):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "user"], name="membership_one_per_user"),
        ]

    def __str__(self) -> str:
        return f"{self.user} @ {self.project} ({self.role})"
