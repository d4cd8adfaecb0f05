"""Channels (``production``, ``staging``, …): a project's pointer to a candidate and a policy
version, with an append-only history of moves; and promotion requests, with their approvals
and comments, which decide *whether* a channel moves.

``coevo.reviews.services.channel_move`` is the one place that moves a channel;
``coevo.reviews.promotions`` runs promotion requests.
"""

import uuid

from django.conf import settings
from django.db import models

from coevo.db import TimeStampedModel
from coevo.errors import InvalidState
from coevo.evaluations.models import Evaluation
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
    # Set on a rollback: the move it undid. A second rollback then goes one holder further
    # back instead of undoing the first rollback (see channel_rollback).
    reverts = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.RESTRICT, related_name="+"
    )
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


class PromotionState(models.TextChoices):
    EVALUATING = "evaluating"  # held-out evaluations running (or evidence being assembled)
    READY = "ready"  # evidence assembled: reviewers may decide
    APPROVED = "approved"  # enough approvals: the channel moved (see channel_move)
    REJECTED = "rejected"  # a reviewer rejected it
    CANCELLED = "cancelled"  # withdrawn, or made moot (the channel already holds the candidate)
    FAILED = "failed"  # a held-out evaluation failed or was cancelled: no evidence (see detail)


PROMOTION_OPEN_STATES = (PromotionState.EVALUATING, PromotionState.READY)
PROMOTION_FINAL_STATES = (
    PromotionState.APPROVED,
    PromotionState.REJECTED,
    PromotionState.CANCELLED,
    PromotionState.FAILED,
)


class BaselineKind(models.TextChoices):
    """Where a request's baseline came from: only a request to an empty channel has one (with a
    holder, the holder is the reference)."""

    CAMPAIGN_SEED = "campaign_seed", "the campaign seed"
    PICKED = "picked", "the baseline the requester picked"


class PromotionRequest(TimeStampedModel):
    """A request that ``candidate`` (under ``policy_version``) replace the holder of ``channel``.

    The holder is snapshotted when the request is made (or re-targeted): candidate, policy
    version and the channel's ``generation``. The request is *stale* when the channel's
    generation has moved since: its evidence compares against a holder that no longer holds,
    so approval is refused until ``promotion_evidence_refresh`` re-targets it.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="promotions")
    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="promotions")
    # RESTRICT, like channels: a candidate under review is kept (retention protects it too).
    candidate = models.ForeignKey(
        Candidate, on_delete=models.RESTRICT, related_name="promotion_requests"
    )
    policy_version = models.ForeignKey(PolicyVersion, on_delete=models.RESTRICT, related_name="+")
    suite = models.ForeignKey("suites.Suite", on_delete=models.RESTRICT, related_name="+")
    epochs = models.PositiveSmallIntegerField(default=1)
    seed = models.BigIntegerField(default=0)
    # PROTECT: the requester is part of the approval rule (Approval.requester copies it).
    requester = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="promotion_requests"
    )
    state = models.CharField(
        max_length=16, choices=PromotionState.choices, default=PromotionState.EVALUATING
    )
    state_detail = models.TextField(blank=True)
    # The holder the evidence compares against (None: the channel was empty).
    holder_candidate = models.ForeignKey(
        Candidate, null=True, blank=True, on_delete=models.RESTRICT, related_name="+"
    )
    holder_policy_version = models.ForeignKey(
        PolicyVersion, null=True, blank=True, on_delete=models.RESTRICT, related_name="+"
    )
    holder_generation = models.PositiveIntegerField()
    # What the evidence compares against when the channel held nothing (None: no holder, no
    # campaign seed and none picked, so no comparison). Evaluated on held-out exactly as a
    # holder is, under the request's policy version; evidence only: approval moves the channel
    # as it would without one.
    baseline_candidate = models.ForeignKey(
        Candidate, null=True, blank=True, on_delete=models.RESTRICT, related_name="+"
    )
    baseline_kind = models.CharField(max_length=16, choices=BaselineKind.choices, blank=True)
    # The campaign the candidate came from, if any (its held-out looks are counted).
    campaign = models.ForeignKey(
        "campaigns.Campaign", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    candidate_evaluation = models.ForeignKey(
        Evaluation, on_delete=models.RESTRICT, related_name="+"
    )
    holder_evaluation = models.ForeignKey(
        Evaluation, null=True, blank=True, on_delete=models.RESTRICT, related_name="+"
    )
    baseline_evaluation = models.ForeignKey(
        Evaluation, null=True, blank=True, on_delete=models.RESTRICT, related_name="+"
    )
    # Assembled by coevo.reviews.promotions.evidence once both held-out evaluations are final;
    # {} before.
    evidence = models.JSONField(default=dict, blank=True)
    # Held-out evaluations of the project (and of the candidate's campaign) so far, this
    # request's own included: repeated looks at held-out scores are themselves overfitting.
    heldout_looks_project = models.PositiveIntegerField(default=0)
    heldout_looks_campaign = models.PositiveIntegerField(null=True, blank=True)
    required_approvals = models.PositiveSmallIntegerField(default=1)
    # The move an approval made.
    channel_move = models.OneToOneField(
        ChannelMove, null=True, blank=True, on_delete=models.RESTRICT, related_name="promotion"
    )
    evidence_at = models.DateTimeField(null=True, blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(required_approvals__gte=1),
                name="promotion_required_approvals_positive",
            ),
            models.CheckConstraint(
                condition=models.Q(epochs__gte=1), name="promotion_epochs_positive"
            ),
            models.CheckConstraint(
                condition=~models.Q(state="approved") | models.Q(channel_move__isnull=False),
                name="promotion_approved_has_move",
            ),
            models.CheckConstraint(
                condition=models.Q(holder_candidate__isnull=True)
                | models.Q(holder_evaluation__isnull=False),
                name="promotion_holder_has_evaluation",
            ),
            # A baseline stands in for a holder: never both, and never without its kind and
            # its held-out evaluation.
            models.CheckConstraint(
                condition=(
                    models.Q(baseline_candidate__isnull=True)
                    & models.Q(baseline_evaluation__isnull=True)
                    & models.Q(baseline_kind="")
                )
                | (
                    models.Q(holder_candidate__isnull=True)
                    & models.Q(baseline_candidate__isnull=False)
                    & models.Q(baseline_evaluation__isnull=False)
                    & ~models.Q(baseline_kind="")
                ),
                name="promotion_baseline_only_without_holder",
            ),
            # One open request per (channel, candidate, policy version): a second click must
            # not start (and count) a second round of held-out evaluations.
            models.UniqueConstraint(
                fields=["channel", "candidate", "policy_version"],
                condition=models.Q(state__in=PROMOTION_OPEN_STATES),
                name="promotion_one_open_per_candidate",
            ),
            # Target of Approval's composite foreign key (request, requester): see 0003.
            models.UniqueConstraint(
                fields=["id", "requester"], name="promotion_id_requester_unique"
            ),
        ]
        indexes = [
            # promotions_refresh_open (beat) and the evaluation_finished receiver: open requests.
            models.Index(
                fields=["created_at"],
                name="promotion_open_idx",
                condition=models.Q(state__in=PROMOTION_OPEN_STATES),
            ),
        ]

    def __str__(self) -> str:
        return f"promotion {self.id}"

    @property
    def is_final(self) -> bool:
        return self.state in PROMOTION_FINAL_STATES


class Decision(models.TextChoices):
    APPROVE = "approve"
    REJECT = "reject"


class Approval(models.Model):
    """One reviewer's decision on a request. ``requester`` copies the request's requester so
    the database itself refuses a requester's own approval (``approval_not_by_requester``);
    a composite foreign key (``approval_requester_matches``, PostgreSQL) keeps the copy true."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    request = models.ForeignKey(
        PromotionRequest, on_delete=models.CASCADE, related_name="approvals"
    )
    reviewer = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="promotion_approvals"
    )
    requester = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    decision = models.CharField(max_length=16, choices=Decision.choices)
    comment = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["request", "created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["request", "reviewer"], name="approval_one_per_reviewer"
            ),
            models.CheckConstraint(
                condition=~models.Q(reviewer=models.F("requester")),
                name="approval_not_by_requester",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.decision} by {self.reviewer_id} on {self.request_id}"


class ReviewComment(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    request = models.ForeignKey(PromotionRequest, on_delete=models.CASCADE, related_name="comments")
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    body = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["request", "created_at"]

    def __str__(self) -> str:
        return f"comment {self.id}"
