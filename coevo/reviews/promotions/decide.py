"""People on a ready request: comments, a reviewer's approve or reject (the last approval
needed moves the channel), and withdrawing a request."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.utils import timezone

from coevo.errors import InvalidInput, InvalidState, NotFound, PermissionDenied
from coevo.projects.models import Role
from coevo.projects.selectors import project_user_has_role
from coevo.reviews.models import (
    Approval,
    Channel,
    Decision,
    PromotionRequest,
    PromotionState,
    ReviewComment,
)
from coevo.reviews.promotions.transitions import audit_event, transition
from coevo.reviews.selectors import promotion_approval_count, promotion_is_stale
from coevo.reviews.services import channel_move

COMMENT_MAX_CHARS = 10_000


def promotion_comment(
    *, request: PromotionRequest, author: AbstractBaseUser, body: str
) -> ReviewComment:
    """A comment on the request: researchers and above (the requester answers reviewers)."""
    if not project_user_has_role(project=request.project, user=author, role=Role.RESEARCHER):
        raise PermissionDenied(
            f"Only researchers, reviewers and admins of project {request.project.slug} can "
            "comment on promotion requests."
        )
    body = (body or "").strip()
    if not body:
        raise InvalidInput("Write something: the comment is empty.")
    if len(body) > COMMENT_MAX_CHARS:
        raise InvalidInput(f"The comment is longer than {COMMENT_MAX_CHARS} characters.")
    with transaction.atomic():
        comment = ReviewComment.objects.create(request=request, author=author, body=body)
        audit_event(
            actor=author,
            request=request,
            action="promotion.commented",
            after={"comment": str(comment.id)},
        )
    return comment


def promotion_decide(
    *,
    request: PromotionRequest,
    reviewer: AbstractBaseUser,
    decision: str,
    comment: str = "",
) -> PromotionRequest:
    """A reviewer approves or rejects the request.

    Reviewers and admins of the project only, never the requester (also refused by the
    database: ``approval_not_by_requester``). Refused unless the request is ready and fresh
    (the channel has not moved since its evidence). A reject ends the request; an approval
    that brings the approvals to the request's ``required_approvals`` moves the channel
    (``channel_move`` with the generation the evidence was assembled against, so a channel
    that moved in between refuses the move and the whole decision rolls back).
    """
    if decision not in Decision.values:
        raise InvalidInput(f"Unknown decision {decision!r}: use approve or reject.")
    if not project_user_has_role(project=request.project, user=reviewer, role=Role.REVIEWER):
        raise PermissionDenied(
            f"Only reviewers and admins of project {request.project.slug} can approve or reject "
            "promotion requests."
        )
    if reviewer.pk == request.requester_id:
        raise PermissionDenied(
            "You requested this promotion: another reviewer must approve or reject it."
        )
    comment = (comment or "").strip()[:COMMENT_MAX_CHARS]
    with transaction.atomic():
        # The row lock serialises decisions: two last approvals arriving together cannot both
        # see one approval missing and neither move the channel.
        locked = (
            PromotionRequest.objects.select_for_update()
            .select_related("project", "channel", "candidate", "policy_version")
            .filter(id=request.id)
            .first()
        )
        if locked is None:
            raise NotFound(f"No promotion request {request.id}.")
        if locked.state != PromotionState.READY:
            raise InvalidState(
                f"This request is {locked.state}"
                + (
                    ": its held-out evaluations are still running; decide once the evidence "
                    "is ready."
                    if locked.state == PromotionState.EVALUATING
                    else "; it can no longer be decided."
                )
            )
        if promotion_is_stale(request=locked):
            raise InvalidState(
                f"Channel {locked.channel.name} moved since this evidence was assembled: "
                "refresh the evidence (it re-evaluates against the new holder), then decide."
            )
        if Approval.objects.filter(request=locked, reviewer=reviewer).exists():
            raise InvalidState("You have already decided on this request.")
        try:
            with transaction.atomic():
                Approval.objects.create(
                    request=locked,
                    reviewer=reviewer,
                    requester_id=locked.requester_id,
                    decision=decision,
                    comment=comment,
                )
        except IntegrityError:
            raise InvalidState("You have already decided on this request.") from None
        now = timezone.now()
        if decision == Decision.REJECT:
            PromotionRequest.objects.filter(id=locked.id, state=PromotionState.READY).update(
                state=PromotionState.REJECTED,
                state_detail=f"Rejected by {reviewer.get_username()}"
                + (f": {comment}" if comment else "."),
                decided_at=now,
                updated_at=now,
            )
            audit_event(
                actor=reviewer,
                request=locked,
                action="promotion.rejected",
                before={"state": PromotionState.READY},
                after={"state": PromotionState.REJECTED, "comment": comment},
            )
        else:
            approvals = promotion_approval_count(request=locked)
            audit_event(
                actor=reviewer,
                request=locked,
                action="promotion.approval_given",
                after={
                    "approvals": approvals,
                    "required": locked.required_approvals,
                    "comment": comment,
                },
            )
            if approvals >= locked.required_approvals:
                _approve(request=locked, reviewer=reviewer, approvals=approvals, now=now)
    request.refresh_from_db()
    return request


def _approve(
    *, request: PromotionRequest, reviewer: AbstractBaseUser, approvals: int, now: Any
) -> None:
    channel = Channel.objects.select_related("project").get(id=request.channel_id)
    # channel_move's compare-and-swap is on the generation the evidence compared against:
    # any move since then (even A→B→A) refuses this one.
    # (The policy version is left as read: the request's holder_policy_version falls back to
    # the requested one for a channel moved without one, and must not enter the history.)
    channel.generation = request.holder_generation
    channel.candidate_id = request.holder_candidate_id
    move = channel_move(
        channel=channel,
        candidate=request.candidate,
        policy_version=request.policy_version,
        moved_by=reviewer,
        reason=f"promotion {request.id}",
    )
    PromotionRequest.objects.filter(id=request.id, state=PromotionState.READY).update(
        state=PromotionState.APPROVED,
        state_detail=f"Approved ({approvals} of {request.required_approvals}); "
        f"{channel.name} moved ({move.tag}).",
        channel_move=move,
        decided_at=now,
        updated_at=now,
    )
    audit_event(
        actor=reviewer,
        request=request,
        action="promotion.approved",
        before={"state": PromotionState.READY},
        after={"state": PromotionState.APPROVED, "move": move.number, "tag": move.tag},
    )


def promotion_cancel(
    *, request: PromotionRequest, by: AbstractBaseUser, reason: str = ""
) -> PromotionRequest:
    """Withdraw an open request: its requester, or a reviewer/admin of the project."""
    if by.pk != request.requester_id and not project_user_has_role(
        project=request.project, user=by, role=Role.REVIEWER
    ):
        raise PermissionDenied("Only the requester or a reviewer can cancel this request.")
    if request.is_final:
        raise InvalidState(f"This request is already {request.state}.")
    note = reason.strip()
    request = transition(
        request=request,
        to=PromotionState.CANCELLED,
        detail=f"Cancelled by {by.get_username()}" + (f": {note}" if note else "."),
        action="promotion.cancelled",
        actor=by,
    )
    if request.state != PromotionState.CANCELLED:
        raise InvalidState(f"This request is already {request.state}.")
    return request
