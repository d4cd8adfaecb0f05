"""The members page: project admins add users, change roles and remove members (audited)."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from coevo.errors import CoevoError, InvalidInput, NotFound
from coevo.projects.models import Project, Role
from coevo.projects.selectors import (
    membership_list,
    project_member_get,
    project_user_has_role,
    user_find_active,
)
from coevo.projects.services import membership_add, membership_remove, membership_set
from coevo.web.access import project_view


def _require_admin(request: HttpRequest, project: Project) -> None:
    if not project_user_has_role(project=project, user=request.user, role=Role.ADMIN):
        raise PermissionDenied("Only the project's admins manage members.")


def _role(raw: str) -> Role:
    try:
        return Role(raw)
    except ValueError:
        raise InvalidInput(
            f"{raw!r} is not a role: choose viewer, researcher, reviewer or admin."
        ) from None


@project_view
def member_list_page(request: HttpRequest, project: Project) -> HttpResponse:
    _require_admin(request, project)
    return render(
        request,
        "members/list.html",
        {"project": project, "members": membership_list(project=project), "roles": list(Role)},
    )


@require_POST
@project_view
def member_action(request: HttpRequest, project: Project, action: str) -> HttpResponse:
    _require_admin(request, project)
    if action not in ("add", "role", "remove"):
        raise NotFound(f"No member action {action!r}.")
    try:
        if action == "add":
            user = user_find_active(identifier=request.POST.get("user", ""))
            role = _role(request.POST.get("role", ""))
            membership_add(project=project, user=user, role=role, actor=request.user)
            messages.success(request, f"Added {user.get_username()} as {role.label.lower()}.")
        elif action == "role":
            user = project_member_get(project=project, username=request.POST.get("username", ""))
            role = _role(request.POST.get("role", ""))
            membership_set(project=project, user=user, role=role, actor=request.user)
            messages.success(request, f"{user.get_username()} is now {role.label.lower()}.")
        else:
            user = project_member_get(project=project, username=request.POST.get("username", ""))
            membership_remove(project=project, user=user, actor=request.user)
            messages.success(request, f"Removed {user.get_username()} from {project.slug}.")
    except CoevoError as exc:
        messages.error(request, str(exc))
    return redirect(reverse("web:members", args=[project.slug]))
