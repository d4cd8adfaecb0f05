"""The audit log pages: one project's (reviewers and admins) and the global one (staff)."""

from __future__ import annotations

import datetime

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import render
from django.utils import timezone

from coevo.audit.selectors import audit_event_list, audit_event_page, audit_target_types
from coevo.errors import InvalidInput
from coevo.projects.models import Project, Role
from coevo.projects.selectors import project_user_has_role
from coevo.web.access import project_view
from coevo.web.presenters import audit_changes

PAGE_SIZE = 50


def _date(params: QueryDict, name: str, *, end: bool = False) -> datetime.datetime | None:
    raw = params.get(name, "").strip()
    if not raw:
        return None
    try:
        day = datetime.date.fromisoformat(raw)
    except ValueError:
        raise InvalidInput(f"{name}: {raw!r} is not a date (YYYY-MM-DD).") from None
    if end:
        day += datetime.timedelta(days=1)  # "until" includes the whole day
    return timezone.make_aware(datetime.datetime.combine(day, datetime.time.min))


def _render_log(
    request: HttpRequest, *, project: Project | None, template_context: dict
) -> HttpResponse:
    params = request.GET
    filters = {
        "actor": params.get("actor", "").strip(),
        "action": params.get("action", "").strip(),
        "target_type": params.get("target_type", "").strip(),
        "since": params.get("since", "").strip(),
        "until": params.get("until", "").strip(),
    }
    error = None
    page = None
    try:
        events = audit_event_list(
            project=project,
            actor=filters["actor"] or None,
            action_prefix=filters["action"] or None,
            target_type=filters["target_type"] or None,
            since=_date(params, "since"),
            until=_date(params, "until", end=True),
        )
        page = audit_event_page(events=events, cursor=params.get("cursor"), limit=PAGE_SIZE)
    except InvalidInput as exc:
        error = str(exc)
    rows = [(event, audit_changes(event)) for event in page.events] if page else []
    next_query = None
    if page and page.next_cursor:
        query = params.copy()
        query["cursor"] = page.next_cursor
        next_query = query.urlencode()
    return render(
        request,
        "audit/log.html",
        {
            **template_context,
            "rows": rows,
            "filters": filters,
            "error": error,
            "next_query": next_query,
            "paged": bool(params.get("cursor")),
            "target_types": audit_target_types(project=project),
        },
        status=400 if error else 200,
    )


@project_view
def project_audit(request: HttpRequest, project: Project) -> HttpResponse:
    if not project_user_has_role(project=project, user=request.user, role=Role.REVIEWER):
        raise PermissionDenied("The audit log is for the project's reviewers and admins.")
    return _render_log(request, project=project, template_context={"project": project})


@login_required
def global_audit(request: HttpRequest) -> HttpResponse:
    if not request.user.is_staff:
        raise PermissionDenied("The global audit log is for staff.")
    return _render_log(request, project=None, template_context={"global_log": True})
