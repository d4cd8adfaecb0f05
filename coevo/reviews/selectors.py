"""Channel and promotion reads."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models import F, Prefetch, QuerySet

from coevo.campaigns.models import Proposal
from coevo.db import JSONWithout
from coevo.errors import NotFound
from coevo.evaluations.models import Evaluation
from coevo.projects.audience import Audience
from coevo.projects.models import Project
from coevo.reviews.models import (
    Approval,
    Channel,
    ChannelMove,
    Decision,
    PromotionRequest,
    ReviewComment,
)
from coevo.reviews.promotions.evidence_types import Evidence, evidence_read, sealed_evidence
from coevo.suites.models import Split
from harness_store.models import Candidate


def channel_list_for_project(*, project: Project) -> QuerySet[Channel]:
    return Channel.objects.filter(project=project).select_related("candidate", "policy_version")


def channel_get(*, project: Project, name: str) -> Channel:
    channel = channel_list_for_project(project=project).filter(name=name).first()
    if channel is None:
        raise NotFound(f"No channel {name!r} in project {project.slug}.")
    return channel


def channel_holder(*, project: Project, name: str) -> Candidate | None:
    """The candidate the channel points at; None for an empty or unknown channel."""
    channel = channel_list_for_project(project=project).filter(name=name).first()
    return channel.candidate if channel else None


def channel_history(*, channel: Channel) -> QuerySet[ChannelMove]:
    """The channel's moves, newest first, each with the promotion request that made it (if
    one did)."""
    return ChannelMove.objects.filter(channel=channel).select_related(
        "from_candidate",
        "to_candidate",
        "from_policy_version",
        "to_policy_version",
        "moved_by",
        "promotion",
    )


# --- promotions -------------------------------------------------------------------------------


def promotion_list_for_project(*, project: Project) -> QuerySet[PromotionRequest]:
    return PromotionRequest.objects.filter(project=project).select_related(
        "channel",
        "candidate",
        "policy_version",
        "holder_candidate",
        "holder_policy_version",
        "baseline_candidate",
        "requester",
        "suite",
    )


def promotion_list_with_reviews(*, project: Project) -> QuerySet[PromotionRequest]:
    """promotion_list_for_project for a list that shows each request's approvals and whether
    it is stale, in a fixed number of queries: the approvals are prefetched, and the channel's
    generation is read by the list's own query (as fresh as the row it is compared with)."""
    return (
        promotion_list_for_project(project=project)
        .annotate(listed_channel_generation=F("channel__generation"))
        .prefetch_related(
            Prefetch("approvals", queryset=Approval.objects.select_related("reviewer"))
        )
    )


# What a list of requests carries of each one's evidence (coevo.api.promotions): not the
# per-task held-out results (sealed outside the review pages), the diff or the lineage's
# commits. Those are 90% of a request's evidence; a page of 40 whole ones was megabytes.
EVIDENCE_SUMMARY_OMITS = (
    ("heldout_tasks",),
    ("diff",),
    ("lineage",),
    ("comparison", "flips"),
    ("comparison", "flipped_tasks"),
    ("comparison", "dropped"),
)


def promotion_list_summaries(*, project: Project) -> QuerySet[PromotionRequest]:
    """promotion_list_with_reviews with the evidence left in the database and its summary
    (``evidence_summary``: without ``EVIDENCE_SUMMARY_OMITS``) read instead."""
    return (
        promotion_list_with_reviews(project=project)
        .defer("evidence")
        .annotate(evidence_summary=JSONWithout("evidence", omit=EVIDENCE_SUMMARY_OMITS))
    )


def promotion_get(*, project: Project, request_id: Any) -> PromotionRequest:
    try:
        return promotion_list_for_project(project=project).get(id=request_id)
    except (PromotionRequest.DoesNotExist, ValueError, TypeError):
        raise NotFound(f"No promotion request {request_id} in project {project.slug}.") from None


def promotion_review_get(
    *, project: Project, request_id: Any, audience: Audience
) -> tuple[PromotionRequest, Evidence | None]:
    """A request as its page or API answer shows it: the row without its stored evidence
    (left in the database, so nothing downstream holds the sealed parts), and the evidence
    read through its type and sealed for ``audience`` (None before it is assembled)."""
    try:
        promotion = promotion_list_for_project(project=project).defer("evidence").get(id=request_id)
    except (PromotionRequest.DoesNotExist, ValueError, TypeError):
        raise NotFound(f"No promotion request {request_id} in project {project.slug}.") from None
    payload = (
        PromotionRequest.objects.filter(id=promotion.id).values_list("evidence", flat=True).get()
    )
    return promotion, sealed_evidence(evidence=evidence_read(payload=payload), audience=audience)


def promotion_is_stale(*, request: PromotionRequest) -> bool:
    """Whether the channel moved since the request's holder was taken: its evidence compares
    against a holder that no longer holds. (Read from the database, not the cached channel.)"""
    generation = getattr(request, "listed_channel_generation", None)  # its list read it
    if generation is None:
        generation = (
            Channel.objects.filter(id=request.channel_id)
            .values_list("generation", flat=True)
            .first()
        )
    return generation is not None and generation != request.holder_generation


def promotion_approvals(*, request: PromotionRequest) -> Iterable[Approval]:
    # Read through promotion_list_with_reviews, the request carries them (Django's prefetch
    # cache); otherwise they are read now.
    prefetched = getattr(request, "_prefetched_objects_cache", {}).get("approvals")
    if prefetched is not None:
        return prefetched
    return Approval.objects.filter(request=request).select_related("reviewer")


def promotion_approval_count(*, request: PromotionRequest) -> int:
    return Approval.objects.filter(request=request, decision=Decision.APPROVE).count()


def promotion_comments(*, request: PromotionRequest) -> QuerySet[ReviewComment]:
    return ReviewComment.objects.filter(request=request).select_related("author")


def heldout_looks(*, project: Project, campaign: Any = None) -> int:
    """How many held-out evaluations the project has run (all of them, whatever their end),
    or, with ``campaign``, how many of them evaluated a candidate that campaign produced.

    Each is a look at sealed scores; reviewers see the count, because choosing among candidates
    by repeated held-out looks overfits the held-out split too.
    """
    evaluations = Evaluation.objects.filter(project=project, split=Split.HELDOUT)
    if campaign is not None:
        evaluations = evaluations.filter(
            candidate_id__in=Proposal.objects.filter(
                campaign=campaign, candidate__isnull=False
            ).values("candidate_id")
        )
    return evaluations.count()


def candidate_campaign(*, candidate: Candidate) -> Any:
    """The campaign that produced the candidate (its first proposal's), or None."""
    proposal = (
        Proposal.objects.filter(candidate=candidate)
        .select_related("campaign")
        .order_by("created_at")
        .first()
    )
    return proposal.campaign if proposal else None
