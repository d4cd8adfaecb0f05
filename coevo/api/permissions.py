"""Scope checks (the token) and role checks (the token's user on the object's project).

Both must pass: a token never does more than its scopes allow, nor more than its user's role
on the project allows. A project the user is not a member of does not exist for them (404).
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from coevo.accounts.models import ApiToken, TokenKind
from coevo.errors import NotAuthenticated, PermissionDenied, ScopeMissing
from coevo.projects.models import Project, Role
from coevo.projects.selectors import project_get_for_user, project_user_has_role

READ_METHODS = ("GET", "HEAD", "OPTIONS")


def required_scope(view: Any, method: str) -> str | None:
    scopes = getattr(view, "required_scopes", {})
    if method in scopes:
        return scopes[method]
    return "read" if method in READ_METHODS else None


class TokenHasScope(BasePermission):
    """A live token with the scope the view declares for the request's method."""

    def has_permission(self, request: Request, view: Any) -> bool:
        token = request.auth
        if not isinstance(token, ApiToken):
            raise NotAuthenticated(
                "This API needs a token: send 'Authorization: Bearer <token>' "
                "(create one at /settings/tokens/)."
            )
        scope = required_scope(view, request.method)
        if scope is None:
            # A method the view did not declare a scope for is refused, never allowed.
            raise ScopeMissing(f"{request.method} is not allowed with any scope here.")
        if scope not in token.scopes:
            raise ScopeMissing(
                f"This token lacks the {scope!r} scope; create a token that has it.",
            )
        return True


def project_for_request(*, request: Request, slug: str, role: Role = Role.VIEWER) -> Project:
    """The project, if the token's user is a member (else 404) with ``role`` or above (else 403)."""
    project = project_get_for_user(user=request.user, slug=slug)
    if role != Role.VIEWER and not project_user_has_role(
        project=project, user=request.user, role=role
    ):
        raise PermissionDenied(
            f"You are not a {role.value} (or above) of project {project.slug}: ask one of its "
            "admins for the role."
        )
    return project


def can_see_heldout(*, request: Request, project: Project) -> bool:
    """Held-out results are sealed (docs/architecture.md, "The held-out seal"): only reviewers, with a personal token."""
    token = request.auth
    user: AbstractBaseUser = request.user
    return (
        isinstance(token, ApiToken)
        and token.kind == TokenKind.PERSONAL
        and project_user_has_role(project=project, user=user, role=Role.REVIEWER)
    )
