"""The one place where the dashboard turns domain errors into HTTP answers."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import redirect_to_login
from django.http import Http404, HttpRequest, HttpResponse

from coevo.errors import NotFound
from coevo.projects.models import Project
from coevo.projects.selectors import project_get_for_user

ProjectView = Callable[..., HttpResponse]


def project_view(view: ProjectView) -> Callable[..., HttpResponse]:
    """Log in, resolve ``slug`` to a project the user is a member of, and call
    ``view(request, project, **kwargs)``.

    Any NotFound the view raises (no such project, or not yours; no such candidate, file,
    evaluation or rollout in this project) becomes a 404, so outsiders learn nothing.
    """

    @wraps(view)
    def wrapper(request: HttpRequest, slug: str, **kwargs: Any) -> HttpResponse:
        if not request.user.is_authenticated and getattr(request, "htmx", False):
            # A poll after the session expired: send the whole page to the login form
            # instead of swapping the login page into a fragment.
            return HttpResponse(
                status=204, headers={"HX-Redirect": redirect_to_login(request.get_full_path()).url}
            )
        return _logged_in(request, slug, **kwargs)

    @login_required
    def _logged_in(request: HttpRequest, slug: str, **kwargs: Any) -> HttpResponse:
        try:
            project: Project = project_get_for_user(user=request.user, slug=slug)
            return view(request, project, **kwargs)
        except NotFound as exc:
            raise Http404(str(exc)) from exc

    return wrapper
