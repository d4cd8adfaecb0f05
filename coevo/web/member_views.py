"""The members page: project admins add users, change roles and remove members (audited)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.db.models import Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from coevo.errors import CoevoError, InvalidInput, NotFound
from coevo.projects.models import ROLE_ORDER, Membership, Project, Role
from coevo.projects.selectors import project_user_has_role
from coevo.projects.services import membership_remove, membership_set
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


def _user_find(identifier: str):  # noqa: ANN202 - the user model is swappable
    identifier = identifier.strip()
    if not identifier:
        raise InvalidInput("Give a username or an email address.")
    users = list(
        get_user_model()
        .objects.filter(Q(username__iexact=identifier) | Q(email__iexact=identifier))
        .filter(is_active=True)[:2]
    )
    if len(users) != 1:
        # One message for "none" and "several": no hint about which accounts exist.
        raise NotFound(f"No single active user with username or email {identifier!r}.")
    return users[0]


def _member(project: Project, username: str):  # noqa: ANN202
    membership = (
        Membership.objects.select_related("user")
        .filter(project=project, user__username=username)
        .first()
    )
    if membership is None:
        raise NotFound(f"{username!r} is not a member of {project.slug}.")
    return membership.user


@project_view
def member_list_page(request: HttpRequest, project: Project) -> HttpResponse:
    _require_admin(request, project)
    members = Membership.objects.filter(project=project).select_related("user")
    members = sorted(members, key=lambda m: (-ROLE_ORDER.index(Role(m.role)), m.user.username))
    return render(
        request,
        "members/list.html",
        {"project": project, "members": members, "roles": list(Role)},
    )


@require_POST
@project_view
def member_action(request: HttpRequest, project: Project, action: str) -> HttpResponse:
    _require_admin(request, project)
    if action not in ("add", "role", "remove"):
        raise NotFound(f"No member action {action!r}.")
    try:
        if action == "add":
            user = _user_find(request.POST.get("user", ""))
            if Membership.objects.filter(project=project, user=user).exists():
                raise InvalidInput(f"{user.get_username()} is already a member: change the role.")
            role = _role(request.POST.get("role", ""))
            membership_set(project=project, user=user, role=role, actor=request.user)
            messages.success(request, f"Added {user.get_username()} as {role.label.lower()}.")
        elif action == "role":
            user = _member(project, request.POST.get("username", ""))
            role = _role(request.POST.get("role", ""))
            membership_set(project=project, user=user, role=role, actor=request.user)
            messages.success(request, f"{user.get_username()} is now {role.label.lower()}.")
        else:
            user = _member(project, request.POST.get("username", ""))
            membership_remove(project=project, user=user, actor=request.user)
            messages.success(request, f"Removed {user.get_username()} from {project.slug}.")
    except CoevoError as exc:
        messages.error(request, str(exc))
    return redirect(reverse("web:members", args=[project.slug]))
