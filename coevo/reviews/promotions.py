"""Promotion requests: the held-out evaluations, the evidence, comments, two-person approval and
the channel move an approval makes (DESIGN.md §8).

Life of a request:
    evaluating ──(both held-out evaluations final)──> ready ──(approvals reach the project's
    required count)──> approved (the channel moved) ; ready ──(a reject)──> rejected ;
    evaluating|ready ──> cancelled (withdrawn) ; evaluating ──(an evaluation failed)──> failed.
A request whose channel moved meanwhile is *stale*: ``promotion_evidence_refresh`` re-targets
it at the new holder (back to evaluating; approvals already given are withdrawn, they were
given on other evidence), and approval is refused until then.

Refresh is triggered by the ``evaluation_finished`` signal (coevo.reviews.receivers) and by
beat (``promotions_refresh_open``), and is idempotent: every transition is a compare-and-swap
from the state it read, so a redelivered task or beat racing the signal does the work once.
Every state change writes an audit event in its own transaction.
"""

from __future__ import annotations

import logging
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from coevo.errors import InvalidInput, InvalidState, NotFound, PermissionDenied
from coevo.evaluations.models import (
    EVALUATION_FINAL_STATES,
    Evaluation,
    EvaluationState,
)
from coevo.policies.models import PolicyVersion
from coevo.projects.models import Role
from coevo.projects.selectors import project_user_has_role
from coevo.reviews.models import (
    PROMOTION_OPEN_STATES,
    Approval,
    Channel,
    Decision,
    PromotionRequest,
    PromotionState,
    ReviewComment,
)
from coevo.reviews.selectors import (
    candidate_campaign,
    heldout_looks,
    promotion_approval_count,
    promotion_is_stale,
)
from coevo.suites.models import Split, Suite, Task
from harness_store.models import Candidate

logger = logging.getLogger(__name__)

COMMENT_MAX_CHARS = 10_000
# Held-out evaluations of the holder that a request may reuse instead of starting another
# look: finished ones, and ones still running for another request.
_REUSABLE_STATES = (EvaluationState.FINISHED, EvaluationState.PENDING, EvaluationState.RUNNING)


def _audit(
    *,
    actor: AbstractBaseUser | None,
    request: PromotionRequest,
    action: str,
    before: dict | None = None,
    after: dict | None = None,
) -> None:
    from coevo.audit.services import audit_record

    audit_record(
        actor=actor,
        project=request.project,
        action=action,
        target=request,
        before=before,
        after=after,
    )


def _refresh_later(request_id: Any) -> None:
    from coevo.reviews.tasks import promotion_refresh_enqueue

    promotion_refresh_enqueue(request_id=request_id)


# --- create -----------------------------------------------------------------------------------


def promotion_request_create(
    *,
    channel: Channel,
    candidate: Candidate,
    policy_version: PolicyVersion,
    requester: AbstractBaseUser,
    suite: Suite,
    epochs: int = 1,
    seed: int = 0,
) -> PromotionRequest:
    """Request that ``candidate`` (under ``policy_version``) replace ``channel``'s holder.

    Starts the held-out evaluation of the candidate and, unless a finished (or running) one
    with the same suite, policy version, epochs and seed exists, of the holder; an empty
    channel has no holder (the evidence then has the candidate only). The rollouts are sent
    when the transaction commits. Researchers and above only.

    Idempotent: while a request for the same channel, candidate and policy version is open,
    that request is returned and nothing new is evaluated (each held-out run is a counted look).
    """
    project = channel.project
    if not project_user_has_role(project=project, user=requester, role=Role.RESEARCHER):
        raise PermissionDenied(
            f"Only researchers, reviewers and admins of project {project.slug} can request a "
            "promotion: ask an admin for the role."
        )
    if candidate.project_id != project.id or suite.project_id != project.id:
        raise InvalidInput(
            f"The candidate and the suite must belong to project {project.slug}, like channel "
            f"{channel.name}."
        )
    if not Task.objects.filter(suite=suite, split=Split.HELDOUT).exists():
        raise InvalidInput(
            f"Suite {suite} has no held-out tasks: a promotion is judged on held-out tasks; "
            "choose a suite that has some."
        )
    channel = Channel.objects.select_related("candidate", "policy_version", "project").get(
        id=channel.id
    )
    if channel.candidate_id == candidate.id and channel.policy_version_id == policy_version.id:
        raise InvalidInput(
            f"Channel {channel.name} already holds {candidate.short_sha} with policy version "
            f"{policy_version.name}: there is nothing to promote."
        )
    existing = _open_request(channel=channel, candidate=candidate, policy_version=policy_version)
    if existing is not None:
        return existing
    holder = channel.candidate
    holder_policy = channel.policy_version or policy_version
    campaign = candidate_campaign(candidate=candidate)
    try:
        with transaction.atomic():
            candidate_eval = _heldout_evaluation(
                candidate=candidate,
                suite=suite,
                policy_version=policy_version,
                epochs=epochs,
                seed=seed,
                created_by=requester,
            )
            holder_eval = (
                _holder_evaluation(
                    holder=holder,
                    suite=suite,
                    policy_version=holder_policy,
                    epochs=epochs,
                    seed=seed,
                    created_by=requester,
                )
                if holder is not None
                else None
            )
            request = PromotionRequest.objects.create(
                project=project,
                channel=channel,
                candidate=candidate,
                policy_version=policy_version,
                suite=suite,
                epochs=epochs,
                seed=seed,
                requester=requester,
                holder_candidate=holder,
                holder_policy_version=holder_policy if holder is not None else None,
                holder_generation=channel.generation,
                campaign=campaign,
                candidate_evaluation=candidate_eval,
                holder_evaluation=holder_eval,
                # Counted after this request's own evaluations were created: "this is look N".
                heldout_looks_project=heldout_looks(project=project),
                heldout_looks_campaign=(
                    heldout_looks(project=project, campaign=campaign) if campaign else None
                ),
                required_approvals=project.required_approvals,
            )
            _audit(
                actor=requester,
                request=request,
                action="promotion.requested",
                after=_snapshot(request),
            )
            # Both evaluations may already be complete (every rollout from the cache, or a
            # reused holder evaluation) and their signals sent before this row was visible.
            transaction.on_commit(lambda: _refresh_later(request.id))
    except IntegrityError:
        # A concurrent identical request won the one-open-request constraint.
        existing = _open_request(
            channel=channel, candidate=candidate, policy_version=policy_version
        )
        if existing is None:
            raise
        return existing
    logger.info(
        "promotion %s requested: %s to %s (holder %s), held-out look %d of project %s",
        request.id,
        candidate.short_sha,
        channel,
        holder.short_sha if holder else "none",
        request.heldout_looks_project,
        project.slug,
    )
    return request


def _open_request(
    *, channel: Channel, candidate: Candidate, policy_version: PolicyVersion
) -> PromotionRequest | None:
    return PromotionRequest.objects.filter(
        channel=channel,
        candidate=candidate,
        policy_version=policy_version,
        state__in=PROMOTION_OPEN_STATES,
    ).first()


def _heldout_evaluation(
    *,
    candidate: Candidate,
    suite: Suite,
    policy_version: PolicyVersion,
    epochs: int,
    seed: int,
    created_by: AbstractBaseUser | None,
) -> Evaluation:
    from coevo.evaluations.services import evaluation_create

    return evaluation_create(
        candidate=candidate,
        suite=suite,
        split=Split.HELDOUT,
        policy_version=policy_version,
        epochs=epochs,
        seed=seed,
        created_by=created_by,
        purpose="promotion",
    )


def _holder_evaluation(
    *,
    holder: Candidate,
    suite: Suite,
    policy_version: PolicyVersion,
    epochs: int,
    seed: int,
    created_by: AbstractBaseUser | None,
) -> Evaluation:
    """The holder's held-out evaluation: a finished (or still running) one of the same
    settings if there is one (no new look), else a new one."""
    cached = (
        Evaluation.objects.filter(
            candidate=holder,
            suite=suite,
            split=Split.HELDOUT,
            policy_version=policy_version,
            epochs=epochs,
            seed=seed,
            task_limit__isnull=True,
            knobs={},
            state__in=_REUSABLE_STATES,
        )
        .order_by("-created_at")
        .first()
    )
    if cached is not None:
        return cached
    return _heldout_evaluation(
        candidate=holder,
        suite=suite,
        policy_version=policy_version,
        epochs=epochs,
        seed=seed,
        created_by=created_by,
    )


def _snapshot(request: PromotionRequest) -> dict[str, Any]:
    return {
        "state": request.state,
        "channel": request.channel.name,
        "candidate": request.candidate.sha,
        "policy_version": request.policy_version.name,
        "holder": request.holder_candidate.sha if request.holder_candidate else None,
        "holder_generation": request.holder_generation,
        "heldout_looks_project": request.heldout_looks_project,
        "heldout_looks_campaign": request.heldout_looks_campaign,
    }


# --- evidence ---------------------------------------------------------------------------------


def promotion_evidence_refresh(
    *, request: PromotionRequest, by: AbstractBaseUser | None = None
) -> PromotionRequest:
    """Bring the request up to date; safe to call any number of times, from any process.

    - stale (the channel moved since the holder was taken): re-target the new holder and start
      its held-out evaluation (or reuse one), back to evaluating;
    - evaluating, both held-out evaluations final: assemble the evidence → ready (or failed,
      when an evaluation did not finish);
    - ready: re-assemble the evidence (newer search/validation results show up).
    """
    request = PromotionRequest.objects.select_related(
        "project", "channel", "candidate", "policy_version"
    ).get(id=request.id)
    if request.is_final:
        return request
    if promotion_is_stale(request=request):
        return _retarget(request=request, by=by)
    evaluations = [request.candidate_evaluation_id, request.holder_evaluation_id]
    states = dict(
        Evaluation.objects.filter(id__in=[e for e in evaluations if e]).values_list("id", "state")
    )
    if not all(states[e] in EVALUATION_FINAL_STATES for e in evaluations if e):
        return request
    unfinished = [
        (label, states[e])
        for label, e in (("candidate", evaluations[0]), ("holder", evaluations[1]))
        if e and states[e] != EvaluationState.FINISHED
    ]
    if unfinished:
        detail = "; ".join(
            f"the {label}'s held-out evaluation {state}" for label, state in unfinished
        )
        return _transition(
            request=request,
            to=PromotionState.FAILED,
            detail=f"No evidence: {detail}. Request the promotion again.",
            action="promotion.failed",
            actor=by,
        )
    from coevo.reviews.evidence import evidence_build

    evidence = evidence_build(request=request)
    now = timezone.now()
    with transaction.atomic():
        updated = PromotionRequest.objects.filter(
            id=request.id,
            state__in=PROMOTION_OPEN_STATES,
            holder_generation=request.holder_generation,
        ).update(
            state=PromotionState.READY,
            state_detail="",
            evidence=evidence,
            evidence_at=now,
            updated_at=now,
        )
        if updated and request.state != PromotionState.READY:
            _audit(
                actor=by,
                request=request,
                action="promotion.ready",
                before={"state": request.state},
                after={"state": PromotionState.READY},
            )
    request.refresh_from_db()
    return request


def _retarget(*, request: PromotionRequest, by: AbstractBaseUser | None) -> PromotionRequest:
    channel = Channel.objects.select_related("candidate", "policy_version").get(
        id=request.channel_id
    )
    if (
        channel.candidate_id == request.candidate_id
        and channel.policy_version_id == request.policy_version_id
    ):
        return _transition(
            request=request,
            to=PromotionState.CANCELLED,
            detail=f"Channel {channel.name} already holds this candidate (moved elsewhere).",
            action="promotion.cancelled",
            actor=by,
        )
    holder = channel.candidate
    holder_policy = channel.policy_version or request.policy_version
    with transaction.atomic():
        locked = (
            PromotionRequest.objects.select_for_update()
            .filter(id=request.id, state__in=PROMOTION_OPEN_STATES)
            .first()
        )
        if locked is None or locked.holder_generation != request.holder_generation:
            # Finished, or re-targeted by a concurrent refresh.
            request.refresh_from_db()
            return request
        holder_eval = (
            _holder_evaluation(
                holder=holder,
                suite=request.suite,
                policy_version=holder_policy,
                epochs=request.epochs,
                seed=request.seed,
                created_by=by or request.requester,
            )
            if holder is not None
            else None
        )
        withdrawn = list(
            Approval.objects.filter(request=request).values_list("reviewer__username", flat=True)
        )
        Approval.objects.filter(request=request).delete()
        before = {
            "holder": request.holder_candidate.sha if request.holder_candidate else None,
            "holder_generation": request.holder_generation,
            "state": request.state,
        }
        now = timezone.now()
        PromotionRequest.objects.filter(id=request.id).update(
            state=PromotionState.EVALUATING,
            state_detail=(
                f"Channel {channel.name} moved (now move {channel.generation}): re-evaluating "
                "against its new holder."
                + (f" Approvals withdrawn: {', '.join(withdrawn)}." if withdrawn else "")
            ),
            holder_candidate=holder,
            holder_policy_version=holder_policy if holder is not None else None,
            holder_generation=channel.generation,
            holder_evaluation=holder_eval,
            evidence={},
            evidence_at=None,
            heldout_looks_project=heldout_looks(project=request.project),
            heldout_looks_campaign=(
                heldout_looks(project=request.project, campaign=request.campaign)
                if request.campaign_id
                else None
            ),
            updated_at=now,
        )
        _audit(
            actor=by,
            request=request,
            action="promotion.retargeted",
            before=before,
            after={
                "holder": holder.sha if holder else None,
                "holder_generation": channel.generation,
                "state": PromotionState.EVALUATING,
                "approvals_withdrawn": withdrawn,
            },
        )
        transaction.on_commit(lambda: _refresh_later(request.id))
    logger.info(
        "promotion %s re-targeted at %s (channel move %d)",
        request.id,
        holder.short_sha if holder else "nothing",
        channel.generation,
    )
    request.refresh_from_db()
    return request


def _transition(
    *,
    request: PromotionRequest,
    to: str,
    detail: str,
    action: str,
    actor: AbstractBaseUser | None,
    from_states: tuple[str, ...] = PROMOTION_OPEN_STATES,
) -> PromotionRequest:
    now = timezone.now()
    with transaction.atomic():
        updated = PromotionRequest.objects.filter(id=request.id, state__in=from_states).update(
            state=to, state_detail=detail, decided_at=now, updated_at=now
        )
        if updated:
            _audit(
                actor=actor,
                request=request,
                action=action,
                before={"state": request.state},
                after={"state": to, "detail": detail},
            )
    if updated:
        logger.info("promotion %s %s: %s", request.id, to, detail)
    request.refresh_from_db()
    return request


def promotions_for_evaluation(*, evaluation_id: Any) -> list[Any]:
    """Ids of the open requests that wait on this evaluation."""
    return list(
        PromotionRequest.objects.filter(state=PromotionState.EVALUATING)
        .filter(Q(candidate_evaluation_id=evaluation_id) | Q(holder_evaluation_id=evaluation_id))
        .values_list("id", flat=True)
    )


def promotions_refresh_open(*, limit: int = 500) -> int:
    """Beat's catch-up: refresh evaluating requests whose evaluations are final (their signal
    was missed). Stale ready requests are left for a person to refresh: re-targeting starts a
    new held-out look, which someone should choose to take. Returns how many became ready."""
    waiting = (
        PromotionRequest.objects.filter(
            state=PromotionState.EVALUATING,
            candidate_evaluation__state__in=EVALUATION_FINAL_STATES,
        )
        .filter(
            Q(holder_evaluation__isnull=True)
            | Q(holder_evaluation__state__in=EVALUATION_FINAL_STATES)
        )
        .order_by("created_at")
        .values_list("id", flat=True)[:limit]
    )
    ready = 0
    for request_id in list(waiting):
        request = promotion_evidence_refresh(request=PromotionRequest(id=request_id))
        ready += request.state == PromotionState.READY
    return ready


# --- comments and decisions -------------------------------------------------------------------


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
        _audit(
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
            _audit(
                actor=reviewer,
                request=locked,
                action="promotion.rejected",
                before={"state": PromotionState.READY},
                after={"state": PromotionState.REJECTED, "comment": comment},
            )
        else:
            approvals = promotion_approval_count(request=locked)
            _audit(
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
    from coevo.reviews.services import channel_move

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
    _audit(
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
    request = _transition(
        request=request,
        to=PromotionState.CANCELLED,
        detail=f"Cancelled by {by.get_username()}" + (f": {note}" if note else "."),
        action="promotion.cancelled",
        actor=by,
    )
    if request.state != PromotionState.CANCELLED:
        raise InvalidState(f"This request is already {request.state}.")
    return request
