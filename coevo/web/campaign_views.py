"""Campaign pages: the list, and one campaign's progress, best candidate, Pareto front and
proposals (htmx polling while it runs), with pause / resume / stop for researchers."""

from __future__ import annotations

from uuid import UUID

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_POST

from coevo.campaigns.selectors import (
    campaign_best_proposal,
    campaign_get,
    campaign_list,
    campaign_pareto_front,
    campaign_progress,
    proposal_list,
)
from coevo.campaigns.services import campaign_pause, campaign_resume, campaign_stop
from coevo.errors import CoevoError
from coevo.projects.models import Project, Role
from coevo.projects.selectors import project_user_has_role
from coevo.web.access import project_view

ACTIONS = {"pause": campaign_pause, "resume": campaign_resume}


@project_view
def campaign_list_page(request: HttpRequest, project: Project) -> HttpResponse:
    return render(
        request,
        "campaigns/list.html",
        {"project": project, "campaigns": campaign_list(project=project)[:100]},
    )


@project_view
def campaign_detail(request: HttpRequest, project: Project, campaign_id: UUID) -> HttpResponse:
    campaign = campaign_get(project=project, campaign_id=campaign_id)
    best = campaign_best_proposal(campaign=campaign)
    context = {
        "project": project,
        "campaign": campaign,
        "progress": campaign_progress(campaign=campaign),
        "best": best,
        "gap": (
            best.search_score - best.validation_score
            if best and best.search_score is not None and best.validation_score is not None
            else None
        ),
        "front": campaign_pareto_front(campaign=campaign),
        "proposals": proposal_list(campaign=campaign),
        "can_run": project_user_has_role(project=project, user=request.user, role=Role.RESEARCHER),
    }
    # The polling request (htmx) gets only the live part; its final render stops the polling.
    partial = request.htmx and not request.htmx.history_restore_request
    template = "campaigns/_live.html" if partial else "campaigns/detail.html"
    response = render(request, template, context)
    patch_vary_headers(response, ("HX-Request",))
    return response


@require_POST
@project_view
def campaign_action(
    request: HttpRequest, project: Project, campaign_id: UUID, action: str
) -> HttpResponse:
    if not project_user_has_role(project=project, user=request.user, role=Role.RESEARCHER):
        raise PermissionDenied("Pausing, resuming or stopping campaigns needs the researcher role.")
    campaign = campaign_get(project=project, campaign_id=campaign_id)
    if action not in ("pause", "resume", "stop"):
        raise Http404(f"No action {action!r}.")
    try:
        if action == "stop":
            campaign_stop(campaign=campaign, reason=f"stopped by {request.user.get_username()}")
        else:
            ACTIONS[action](campaign=campaign)
        messages.success(request, f"Campaign {action}{'p' if action == 'stop' else ''}ed.")
    except CoevoError as exc:
        messages.error(request, str(exc))
    return redirect("web:campaign", project.slug, campaign.id)
