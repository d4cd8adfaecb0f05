"""Creating a promotion request: its checks, the held-out evaluations of the candidate and of
its reference (the channel's holder; for an empty channel, a baseline: the candidate's campaign
seed or one the requester picked), reusing a finished or running one of the reference, the
counted look."""

from __future__ import annotations

import logging
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction

from coevo.errors import InvalidInput, NotFound, PermissionDenied
from coevo.evaluations.models import Evaluation, EvaluationState
from coevo.evaluations.services import evaluation_create
from coevo.policies.models import PolicyVersion
from coevo.projects.models import Role
from coevo.projects.selectors import project_user_has_role
from coevo.reviews.models import (
    PROMOTION_OPEN_STATES,
    BaselineKind,
    Channel,
    PromotionRequest,
)
from coevo.reviews.promotions.transitions import audit_event, refresh_later
from coevo.reviews.selectors import candidate_campaign, heldout_looks
from coevo.suites.models import Split, Suite, Task
from harness_store.models import Candidate
from harness_store.selectors import candidate_get

logger = logging.getLogger(__name__)

# Held-out evaluations of a reference (holder or baseline) that a request may reuse instead of starting another
# look: finished ones, and ones still running for another request.
_REUSABLE_STATES = (EvaluationState.FINISHED, EvaluationState.PENDING, EvaluationState.RUNNING)


def promotion_request_create(
    *,
    channel: Channel,
    candidate: Candidate,
    policy_version: PolicyVersion,
    requester: AbstractBaseUser,
    suite: Suite,
    epochs: int = 1,
    seed: int = 0,
    baseline: Candidate | None = None,
) -> PromotionRequest:
    """Request that ``candidate`` (under ``policy_version``) replace ``channel``'s holder.

    Starts the held-out evaluation of the candidate and, unless a finished (or running) one
    with the same suite, policy version, epochs and seed exists, of its reference: the holder;
    for an empty channel, ``baseline`` if given, else the seed of the campaign that proposed
    the candidate (under ``policy_version``), else none (the evidence then has the candidate
    only, and says why). The rollouts are sent when the transaction commits. Researchers and
    above only.

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
        if baseline is not None and existing.baseline_candidate_id != baseline.id:
            raise InvalidInput(
                f"Promotion request {existing.id} for this candidate is already open and "
                "compares against another reference: cancel it first to pick this baseline."
            )
        return existing
    holder = channel.candidate
    holder_policy = channel.policy_version or policy_version
    campaign = candidate_campaign(candidate=candidate)
    baseline, baseline_kind = promotion_baseline(
        channel=channel, candidate=candidate, campaign=campaign, picked=baseline
    )
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
                reference_evaluation(
                    reference=holder,
                    suite=suite,
                    policy_version=holder_policy,
                    epochs=epochs,
                    seed=seed,
                    created_by=requester,
                )
                if holder is not None
                else None
            )
            baseline_eval = (
                reference_evaluation(
                    reference=baseline,
                    suite=suite,
                    policy_version=policy_version,
                    epochs=epochs,
                    seed=seed,
                    created_by=requester,
                )
                if baseline is not None
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
                baseline_candidate=baseline,
                baseline_kind=baseline_kind,
                baseline_evaluation=baseline_eval,
                # Counted after this request's own evaluations were created: "this is look N".
                heldout_looks_project=heldout_looks(project=project),
                heldout_looks_campaign=(
                    heldout_looks(project=project, campaign=campaign) if campaign else None
                ),
                required_approvals=project.required_approvals,
            )
            audit_event(
                actor=requester,
                request=request,
                action="promotion.requested",
                after=_snapshot(request),
            )
            # Both evaluations may already be complete (every rollout from the cache, or a
            # reused holder evaluation) and their signals sent before this row was visible.
            transaction.on_commit(lambda: refresh_later(request.id))
    except IntegrityError:
        # A concurrent identical request won the one-open-request constraint.
        existing = _open_request(
            channel=channel, candidate=candidate, policy_version=policy_version
        )
        if existing is None:
            raise
        return existing
    logger.info(
        "promotion %s requested: %s to %s (holder %s, baseline %s), held-out look %d of project %s",
        request.id,
        candidate.short_sha,
        channel,
        holder.short_sha if holder else "none",
        baseline.short_sha if baseline else "none",
        request.heldout_looks_project,
        project.slug,
    )
    return request


def promotion_baseline_get(*, project: Any, sha: str | None) -> Candidate | None:
    """The baseline a requester named by SHA (the API, the CLI, the form); None for none."""
    if not sha:
        return None
    try:
        return candidate_get(project=project, sha=sha)
    except NotFound as exc:
        raise InvalidInput(
            f"Baseline: {exc} Pick a candidate of this project (its SHA), or leave the "
            "baseline out to compare with the candidate's campaign seed."
        ) from None


def promotion_baseline(
    *,
    channel: Channel,
    candidate: Candidate,
    campaign: Any,
    picked: Candidate | None,
) -> tuple[Candidate | None, str]:
    """The baseline a request to ``channel`` compares against, and its kind: none while the
    channel holds something (the holder is the reference, as always); else ``picked``, else
    the seed of ``campaign`` (the campaign that proposed the candidate) unless that is the
    candidate itself; else none ("")."""
    if channel.candidate_id is not None:
        if picked is not None:
            raise InvalidInput(
                f"Channel {channel.name} holds {channel.candidate.short_sha}: the evidence "
                "compares against its holder. A baseline is only for an empty channel; leave "
                "it out."
            )
        return None, ""
    if picked is not None:
        if picked.project_id != channel.project_id:
            raise InvalidInput(
                f"Baseline {picked.short_sha} belongs to another project: pick a candidate of "
                f"project {channel.project.slug}."
            )
        if picked.id == candidate.id:
            raise InvalidInput(
                "The baseline is the candidate itself, so nothing would be compared: pick "
                "another candidate (its parent, or its campaign's seed), or leave it out."
            )
        return picked, BaselineKind.PICKED
    if campaign is not None and campaign.seed_candidate_id != candidate.id:
        return campaign.seed_candidate, BaselineKind.CAMPAIGN_SEED
    return None, ""


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


def reference_evaluation(
    *,
    reference: Candidate,
    suite: Suite,
    policy_version: PolicyVersion,
    epochs: int,
    seed: int,
    created_by: AbstractBaseUser | None,
) -> Evaluation:
    """The held-out evaluation of what the candidate is compared with (the holder, or a
    baseline): a finished (or still running) one of the same settings if there is one (no new
    look), else a new one."""
    cached = (
        Evaluation.objects.filter(
            candidate=reference,
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
        candidate=reference,
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
        "baseline": request.baseline_candidate.sha if request.baseline_candidate else None,
        "baseline_kind": request.baseline_kind,
        "heldout_looks_project": request.heldout_looks_project,
        "heldout_looks_campaign": request.heldout_looks_campaign,
    }
