"""Trace retention keeps what promotion requests reference (docs/operations.md): the
candidates compared (the candidate and the holder it was compared against) and the held-out
evaluations behind the evidence, whose traces reviewers open from the flipped tasks."""

from __future__ import annotations

from django.db.models import QuerySet

from coevo.ops.retention import protect_candidates, protect_evaluations


@protect_candidates
def _promotion_candidates() -> QuerySet:
    from coevo.reviews.models import PromotionRequest

    return PromotionRequest.objects.values("candidate_id").union(
        PromotionRequest.objects.filter(holder_candidate__isnull=False).values(
            "holder_candidate_id"
        )
    )


@protect_evaluations
def _promotion_evaluations() -> QuerySet:
    from coevo.reviews.models import PromotionRequest

    return PromotionRequest.objects.values("candidate_evaluation_id").union(
        PromotionRequest.objects.filter(holder_evaluation__isnull=False).values(
            "holder_evaluation_id"
        )
    )
