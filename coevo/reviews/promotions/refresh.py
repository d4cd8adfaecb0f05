"""Bringing a request up to date: re-target a stale one at the channel's new holder, assemble the
evidence once its held-out evaluations (the candidate's and its reference's: the holder's or
the baseline's) are final, and beat's catch-up for missed signals."""

from __future__ import annotations

import logging
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from coevo.evaluations.models import EVALUATION_FINAL_STATES, Evaluation, EvaluationState
from coevo.reviews.models import (
    PROMOTION_OPEN_STATES,
    Approval,
    Channel,
    PromotionRequest,
    PromotionState,
)
from coevo.reviews.promotions.create import reference_evaluation
from coevo.reviews.promotions.evidence import evidence_build
from coevo.reviews.promotions.transitions import audit_event, refresh_later, transition
from coevo.reviews.selectors import heldout_looks, promotion_is_stale

logger = logging.getLogger(__name__)


def promotion_evidence_refresh(
    *, request: PromotionRequest, by: AbstractBaseUser | None = None
) -> PromotionRequest:
    """Bring the request up to date; safe to call any number of times, from any process.

    - stale (the channel moved since the holder was taken): re-target the new holder and start
      its held-out evaluation (or reuse one), back to evaluating;
    - evaluating, its held-out evaluations final (the candidate's and the holder's or the
      baseline's): assemble the evidence → ready (or failed, when one did not finish);
    - ready: re-assemble the evidence (newer search/validation results show up).
    """
    request = PromotionRequest.objects.select_related(
        "project", "channel", "candidate", "policy_version"
    ).get(id=request.id)
    if request.is_final:
        return request
    if promotion_is_stale(request=request):
        return _retarget(request=request, by=by)
    evaluations = [
        (label, e)
        for label, e in (
            ("candidate", request.candidate_evaluation_id),
            ("holder", request.holder_evaluation_id),
            ("baseline", request.baseline_evaluation_id),
        )
        if e
    ]
    states = dict(
        Evaluation.objects.filter(id__in=[e for _, e in evaluations]).values_list("id", "state")
    )
    if not all(states[e] in EVALUATION_FINAL_STATES for _, e in evaluations):
        return request
    unfinished = [
        (label, states[e]) for label, e in evaluations if states[e] != EvaluationState.FINISHED
    ]
    if unfinished:
        detail = "; ".join(
            f"the {label}'s held-out evaluation {state}" for label, state in unfinished
        )
        return transition(
            request=request,
            to=PromotionState.FAILED,
            detail=f"No evidence: {detail}. Request the promotion again.",
            action="promotion.failed",
            actor=by,
        )
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
            audit_event(
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
        return transition(
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
            reference_evaluation(
                reference=holder,
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
            "baseline": request.baseline_candidate.sha if request.baseline_candidate else None,
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
            # A channel never empties again (a rollback needs a previous holder), so the
            # new holder is the reference from now on; the baseline stood in for none.
            baseline_candidate=None,
            baseline_kind="",
            baseline_evaluation=None,
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
        audit_event(
            actor=by,
            request=request,
            action="promotion.retargeted",
            before=before,
            after={
                "holder": holder.sha if holder else None,
                "holder_generation": channel.generation,
                "baseline": None,
                "state": PromotionState.EVALUATING,
                "approvals_withdrawn": withdrawn,
            },
        )
        transaction.on_commit(lambda: refresh_later(request.id))
    logger.info(
        "promotion %s re-targeted at %s (channel move %d)",
        request.id,
        holder.short_sha if holder else "nothing",
        channel.generation,
    )
    request.refresh_from_db()
    return request


def promotions_for_evaluation(*, evaluation_id: Any) -> list[Any]:
    """Ids of the open requests that wait on this evaluation."""
    return list(
        PromotionRequest.objects.filter(state=PromotionState.EVALUATING)
        .filter(
            Q(candidate_evaluation_id=evaluation_id)
            | Q(holder_evaluation_id=evaluation_id)
            | Q(baseline_evaluation_id=evaluation_id)
        )
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
        .filter(
            Q(baseline_evaluation__isnull=True)
            | Q(baseline_evaluation__state__in=EVALUATION_FINAL_STATES)
        )
        .order_by("created_at")
        .values_list("id", flat=True)[:limit]
    )
    ready = 0
    for request_id in list(waiting):
        request = promotion_evidence_refresh(request=PromotionRequest(id=request_id))
        ready += request.state == PromotionState.READY
    return ready
