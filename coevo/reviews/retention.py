"""Trace retention keeps what channels and promotion requests reference (docs/operations.md):
every candidate a channel points at or pointed at, the candidates compared (the candidate and
the holder or baseline it was compared against) and the held-out evaluations behind the
evidence, whose traces reviewers open from the held-out task list."""

from __future__ import annotations

from django.db.models import QuerySet

from coevo.evaluations.retention import protect_candidates, protect_evaluations
from coevo.reviews.models import Channel, ChannelMove, PromotionRequest


@protect_candidates
def _channel_candidates() -> QuerySet:
    """Candidates a channel points at now, or pointed at or from in its history."""
    return (
        Channel.objects.filter(candidate__isnull=False)
        .values("candidate_id")
        .union(
            ChannelMove.objects.values("to_candidate_id"),
            ChannelMove.objects.filter(from_candidate__isnull=False).values("from_candidate_id"),
        )
    )


@protect_candidates
def _promotion_candidates() -> QuerySet:
    return PromotionRequest.objects.values("candidate_id").union(
        PromotionRequest.objects.filter(holder_candidate__isnull=False).values(
            "holder_candidate_id"
        ),
        PromotionRequest.objects.filter(baseline_candidate__isnull=False).values(
            "baseline_candidate_id"
        ),
    )


@protect_evaluations
def _promotion_evaluations() -> QuerySet:
    return PromotionRequest.objects.values("candidate_evaluation_id").union(
        PromotionRequest.objects.filter(holder_evaluation__isnull=False).values(
            "holder_evaluation_id"
        ),
        PromotionRequest.objects.filter(baseline_evaluation__isnull=False).values(
            "baseline_evaluation_id"
        ),
    )
