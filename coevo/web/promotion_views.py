"""Channel and promotion pages (issue 5): the channels with their history and rollback, the
promotion request form and list, and one request's evidence with the review forms.

Held-out task inputs, traces and per-task results (docs/architecture.md, "The held-out seal") appear only here and only for
reviewers: ``promotion_detail`` gives the per-task part of the evidence to reviewers alone
(``sealed_evidence``, through ``promotion_review_get``), and
``promotion_rollout`` is the one page that unseals a held-out rollout, for reviewers, when the
rollout belongs to one of the request's own evaluations.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_POST

from coevo.errors import CoevoError, InvalidInput, NotFound
from coevo.evaluations.selectors import rollout_get
from coevo.policies.selectors import policy_version_find, policy_versions_list
from coevo.policies.services import policy_version_get_default
from coevo.projects.audience import Audience, audience_for_review
from coevo.projects.models import Project, Role
from coevo.projects.selectors import project_user_has_role
from coevo.reviews import selectors as review_selectors
from coevo.reviews import services as review_services
from coevo.reviews.models import PromotionState
from coevo.reviews.promotions.create import promotion_baseline_get, promotion_request_create
from coevo.reviews.promotions.decide import promotion_comment, promotion_decide
from coevo.reviews.promotions.refresh import promotion_evidence_refresh
from coevo.reviews.selectors import channel_history, channel_list_for_project
from coevo.suites.selectors import suite_get_by_id, suite_list
from coevo.web.access import project_view
from coevo.web.presenters import (
    promotion_comparison,
    promotion_heldout_tasks,
    promotion_looks,
    promotion_reference_summary,
    promotion_sides,
)
from coevo.web.views import rollout_page
from harness_store.selectors import candidate_get, candidate_list

DECISIONS = ("approve", "reject")


def _has_role(request: HttpRequest, project: Project, role: Role) -> bool:
    return project_user_has_role(project=project, user=request.user, role=role)


def _require_role(request: HttpRequest, project: Project, role: Role, action: str) -> None:
    if not _has_role(request, project, role):
        raise PermissionDenied(f"{action} needs the {role.value} role (or above) on this project.")


# -- channels -------------------------------------------------------------------------------


@project_view
def channel_list_page(request: HttpRequest, project: Project) -> HttpResponse:
    channels = []
    for channel in channel_list_for_project(project=project).order_by("name"):
        # The holder a rollback would restore: not simply the newest move's "from" (after a
        # rollback that is the holder just undone; a rollback walks further back instead).
        target = review_services.channel_rollback_target(channel=channel)
        channels.append(
            {
                "channel": channel,
                "history": list(channel_history(channel=channel)[:50]),
                "rollback_to": target.from_candidate if target else None,
            }
        )
    return render(
        request,
        "promotions/channels.html",
        {
            "project": project,
            "channels": channels,
            "can_rollback": _has_role(request, project, Role.REVIEWER),
            "can_create": _has_role(request, project, Role.ADMIN),
        },
    )


@require_POST
@project_view
def channel_create_action(request: HttpRequest, project: Project) -> HttpResponse:
    _require_role(request, project, Role.ADMIN, "Creating a channel")
    name = request.POST.get("name", "").strip()
    try:
        channel = review_services.channel_create(project=project, name=name, by=request.user)
    except CoevoError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Channel {channel.name} created; a promotion request fills it.")
    return redirect("web:channels", project.slug)


@require_POST
@project_view
def channel_rollback_action(request: HttpRequest, project: Project, name: str) -> HttpResponse:
    _require_role(request, project, Role.REVIEWER, "Rolling a channel back")
    channel = review_selectors.channel_get(project=project, name=name)
    reason = request.POST.get("reason", "").strip()
    if not reason:
        messages.error(request, "Say why you roll the channel back: the reason is in its history.")
        return redirect("web:channels", project.slug)
    try:
        review_services.channel_rollback(channel=channel, by=request.user, reason=reason)
    except CoevoError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Channel {channel.name} rolled back.")
    return redirect("web:channels", project.slug)


# -- promotion requests ---------------------------------------------------------------------


@project_view
def promotion_list_page(request: HttpRequest, project: Project) -> HttpResponse:
    return render(
        request,
        "promotions/list.html",
        {
            "project": project,
            # The list shows no evidence: it stays in the database (90 KB a request).
            "requests": review_selectors.promotion_list_for_project(project=project).defer(
                "evidence"
            )[:100],
            "can_request": _has_role(request, project, Role.RESEARCHER),
        },
    )


def _form_choices(project: Project) -> dict[str, Any]:
    return {
        "candidates": candidate_list(project=project)[:200],
        "policy_versions": policy_versions_list(),
        "channels": channel_list_for_project(project=project).order_by("name"),
        "suites": suite_list(project=project),
    }


@project_view
def promotion_new(request: HttpRequest, project: Project) -> HttpResponse:
    _require_role(request, project, Role.RESEARCHER, "Requesting a promotion")
    values = {"channel": "production", "epochs": "1"}
    error = None
    if request.method == "POST":
        values = {key: request.POST.get(key, "").strip() for key in _FORM_FIELDS}
        try:
            promotion = _create_from_form(project=project, values=values, user=request.user)
        except CoevoError as exc:
            error = str(exc)
        else:
            messages.success(request, "Promotion requested: its held-out evaluations are running.")
            return redirect("web:promotion", project.slug, promotion.id)
    return render(
        request,
        "promotions/new.html",
        {"project": project, "values": values, "error": error, **_form_choices(project)},
        status=400 if error else 200,
    )


_FORM_FIELDS = ("candidate", "policy_version", "channel", "suite", "epochs", "baseline")


def _create_from_form(*, project: Project, values: dict[str, str], user: Any) -> Any:
    if not values["candidate"]:
        raise InvalidInput("Choose the candidate to promote.")
    candidate = candidate_get(project=project, sha=values["candidate"])
    policy_version = None
    if values["policy_version"]:
        policy_version = policy_version_find(name_or_id=values["policy_version"])
        if policy_version is None:
            raise NotFound(f"No policy version {values['policy_version']!r}.")
    if not values["suite"]:
        raise InvalidInput("Choose the suite whose held-out split decides the promotion.")
    try:
        suite = suite_get_by_id(project=project, suite_id=UUID(values["suite"]))
    except ValueError as exc:
        raise InvalidInput("Choose a suite from the list.") from exc
    try:
        epochs = int(values["epochs"] or 1)
    except ValueError as exc:
        raise InvalidInput("Epochs is a whole number (1 to 20).") from exc
    if not 1 <= epochs <= 20:
        raise InvalidInput("Epochs is a whole number (1 to 20).")
    channel = review_services.channel_for_request(
        project=project, name=values["channel"] or "production"
    )
    if policy_version is None:
        # Like gates: the channel's policy version, else the configured default.
        policy_version = channel.policy_version or policy_version_get_default()
    return promotion_request_create(
        channel=channel,
        candidate=candidate,
        policy_version=policy_version,
        requester=user,
        suite=suite,
        epochs=epochs,
        baseline=promotion_baseline_get(project=project, sha=values["baseline"]),
    )


@project_view
def promotion_detail(request: HttpRequest, project: Project, request_id: UUID) -> HttpResponse:
    audience = audience_for_review(project=project, user=request.user)
    # Sealed (docs/architecture.md, "The held-out seal"): the request comes without its stored
    # evidence, and the evidence holds only what ``audience`` may see, so the template never
    # receives per-task held-out results a member who is not a reviewer may not see.
    promotion, evidence = review_selectors.promotion_review_get(
        project=project, request_id=request_id, audience=audience
    )
    is_reviewer = audience is Audience.REVIEWER
    is_requester = promotion.requester_id == request.user.pk
    sides = promotion_sides(evidence=evidence)
    context = {
        "project": project,
        "promotion": promotion,
        "evidence": evidence,
        "sides": sides,
        "reference_side": sides[1][1],
        # The held-out comparison as the comparison page shows one (issue 38): the exact test's
        # verdict, the score it is of, an interval only where it means something.
        "comparison": promotion_comparison(evidence=evidence),
        "reference": promotion_reference_summary(evidence=evidence, promotion=promotion),
        "heldout_tasks": promotion_heldout_tasks(evidence=evidence),
        "looks": promotion_looks(promotion=promotion),
        "is_stale": review_selectors.promotion_is_stale(request=promotion),
        "is_settled": promotion.state != PromotionState.EVALUATING,
        "is_reviewer": is_reviewer,
        "is_requester": is_requester,
        # Decisions: reviewers other than the requester (the database enforces it too).
        "can_decide": is_reviewer and not is_requester,
        "can_comment": _has_role(request, project, Role.RESEARCHER),
        "can_refresh": _has_role(request, project, Role.RESEARCHER),
        "approvals": review_selectors.promotion_approvals(request=promotion),
        "comments": review_selectors.promotion_comments(request=promotion),
    }
    partial = bool(request.htmx and not request.htmx.history_restore_request)
    # The poll that brings settled evidence is the last one (settled evidence stops polling):
    # it also swaps the review section out of band, so the approve button enables itself
    # without a reload. Earlier polls leave it alone (a comment being typed stays).
    context["review_oob"] = partial and context["is_settled"]
    template = "promotions/_evidence.html" if partial else "promotions/detail.html"
    response = render(request, template, context)
    patch_vary_headers(response, ("HX-Request",))
    return response


@require_POST
@project_view
def promotion_action(
    request: HttpRequest, project: Project, request_id: UUID, action: str
) -> HttpResponse:
    """Comment (researchers+), refresh stale evidence (researchers+), approve or reject
    (reviewers other than the requester; the service and the database re-check it)."""
    promotion = review_selectors.promotion_get(project=project, request_id=request_id)
    body = request.POST.get("comment", "").strip()
    try:
        if action == "comment":
            _require_role(request, project, Role.RESEARCHER, "Commenting")
            promotion_comment(request=promotion, author=request.user, body=body)
            messages.success(request, "Comment added.")
        elif action == "refresh":
            _require_role(request, project, Role.RESEARCHER, "Refreshing the evidence")
            promotion_evidence_refresh(request=promotion, by=request.user)
            messages.success(request, "Evidence refreshed against the channel's current holder.")
        elif action in DECISIONS:
            _require_role(request, project, Role.REVIEWER, "Approving or rejecting")
            promotion_decide(
                request=promotion, reviewer=request.user, decision=action, comment=body
            )
            messages.success(request, "Approved." if action == "approve" else "Rejected.")
        else:
            raise Http404(f"No action {action!r}.")
    except CoevoError as exc:
        messages.error(request, str(exc))
    return redirect("web:promotion", project.slug, promotion.id)


@project_view
def promotion_rollout(
    request: HttpRequest, project: Project, request_id: UUID, rollout_id: UUID
) -> HttpResponse:
    """A rollout of the request's evaluations, held-out ones unsealed: reviewers only."""
    _require_role(request, project, Role.REVIEWER, "Reading held-out traces")
    promotion = review_selectors.promotion_get(project=project, request_id=request_id)
    rollout = rollout_get(project=project, rollout_id=rollout_id, audience=Audience.REVIEWER)
    if rollout.evaluation_id not in (
        promotion.candidate_evaluation_id,
        promotion.holder_evaluation_id,
        promotion.baseline_evaluation_id,
    ):
        # Only the request's own evaluations: this path never unseals other held-out work.
        raise Http404("This rollout is not part of this promotion request's evidence.")
    return rollout_page(request, project, rollout, sealed=False)
