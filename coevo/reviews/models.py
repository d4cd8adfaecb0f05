"""Channels (``production``, ``staging``, …): a project's pointer to a candidate and a policy
version, with an append-only history of moves.

Promotion requests, approvals and audit (issue 5) build on these: they decide *whether* a
channel moves; ``coevo.reviews.services.channel_move`` is the one place that moves it.
"""

import uuid

from django.conf import settings
from django.db import models

from coevo.db import TimeStampedModel
from coevo.errors import InvalidState
from coevo.policies.models import PolicyVersion
from coevo.projects.models import Project
from harness_store.models import Candidate


class Channel(TimeStampedModel):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="channels")
    name = models.SlugField(max_length=64)
    # RESTRICT: a candidate a channel points at (or once pointed at, see ChannelMove) is never
    # deleted on its own, only with its whole project; the retention helper relies on these
    # field names to keep them.
    candidate = models.ForeignKey(
        Candidate, null=True, blank=True, on_delete=models.RESTRICT, related_name="channels"
    )
    policy_version = models.ForeignKey(
        PolicyVersion, null=True, blank=True, on_delete=models.RESTRICT, related_name="channels"
    )
    moved_at = models.DateTimeField(null=True, blank=True)
    # How many times the channel has moved: numbers the moves (and their git tags) and is the
    # compare-and-swap token of a move (it catches A→B→A, which the holder alone would not).
    generation = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["project", "name"]
        constraints = [
            models.UniqueConstraint(fields=["project", "name"], name="channel_unique_name"),
            models.CheckConstraint(
                condition=models.Q(generation=0) | models.Q(candidate__isnull=False),
                name="channel_moved_has_candidate",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.project.slug}:{self.name}"


class ChannelMove(models.Model):
    """One move of a channel. Append-only: rows are created by ``channel_move`` and never
    changed or deleted (the history is the audit trail of what ran in production)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="moves")
    number = models.PositiveIntegerField()
    from_candidate = models.ForeignKey(
        Candidate, null=True, blank=True, on_delete=models.RESTRICT, related_name="+"
    )
    to_candidate = models.ForeignKey(Candidate, on_delete=models.RESTRICT, related_name="+")
    from_policy_version = models.ForeignKey(
        PolicyVersion, null=True, blank=True, on_delete=models.RESTRICT, related_name="+"
    )
    to_policy_version = models.ForeignKey(
        PolicyVersion, null=True, blank=True, on_delete=models.RESTRICT, related_name="+"
    )
    moved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    reason = models.TextField(blank=True)
    # The numbered git tag that records this move in the project's repository.
    tag = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["channel", "-number"]
        constraints = [
            models.UniqueConstraint(
                fields=["channel", "number"], name="channel_move_unique_number"
            ),
            models.CheckConstraint(condition=models.Q(number__gte=1), name="channel_move_number"),
        ]

    def __str__(self) -> str:
        return f"{self.channel} #{self.number}"

    def save(self, *args: object, **kwargs: object) -> None:
        if not self._state.adding:
            raise InvalidState("Channel moves are history: they cannot be changed.")
        super().save(*args, **kwargs)

    def delete(self, *args: object, **kwargs: object) -> tuple[int, dict[str, int]]:
        raise InvalidState("Channel moves are history: they cannot be deleted.")
