"""The webhooks page: project admins create webhooks (the secret is shown once), see the
delivery log, redeliver, pause and delete."""

from __future__ import annotations

from uuid import UUID

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from coevo.audit.selectors import (
    webhook_delivery_get,
    webhook_delivery_list,
    webhook_get,
    webhook_list,
)
from coevo.audit.webhooks import (
    ALL_EVENTS,
    WEBHOOK_EVENTS,
    webhook_create,
    webhook_delete,
    webhook_redeliver,
    webhook_set_active,
)
from coevo.errors import CoevoError, NotFound
from coevo.projects.models import Project, Role
from coevo.projects.selectors import project_user_has_role
from coevo.web.access import project_view

# The secret of a webhook just created, kept in the session for exactly one page view.
_SECRET_KEY = "coevo_webhook_secret_once"


def _require_admin(request: HttpRequest, project: Project) -> None:
    if not project_user_has_role(project=project, user=request.user, role=Role.ADMIN):
        raise PermissionDenied("Only the project's admins manage webhooks.")


@project_view
def webhook_list_page(request: HttpRequest, project: Project) -> HttpResponse:
    _require_admin(request, project)
    if request.method == "POST":
        try:
            webhook, secret = webhook_create(
                project=project,
                url=request.POST.get("url", ""),
                events=request.POST.getlist("events"),
                created_by=request.user,
            )
        except CoevoError as exc:
            messages.error(request, str(exc))
        else:
            request.session[_SECRET_KEY] = {"id": str(webhook.pk), "secret": secret}
        return redirect(reverse("web:webhooks", args=[project.slug]))
    new_secret = request.session.pop(_SECRET_KEY, None)
    response = render(
        request,
        "webhooks/list.html",
        {
            "project": project,
            "webhooks": webhook_list(project=project),
            "deliveries": webhook_delivery_list(project=project),
            "events": [ALL_EVENTS, *WEBHOOK_EVENTS],
            "new_secret": new_secret,
        },
    )
    if new_secret:
        response["Cache-Control"] = "no-store"
    return response


@require_POST
@project_view
def webhook_action(
    request: HttpRequest, project: Project, webhook_id: UUID, action: str
) -> HttpResponse:
    _require_admin(request, project)
    webhook = webhook_get(project=project, webhook_id=str(webhook_id))
    if action in ("pause", "resume"):
        webhook_set_active(webhook=webhook, active=action == "resume", actor=request.user)
        messages.success(request, f"Webhook {webhook.url} {action}d.")
    elif action == "delete":
        webhook_delete(webhook=webhook, actor=request.user)
        messages.success(request, f"Webhook {webhook.url} deleted.")
    else:
        raise NotFound(f"No webhook action {action!r}.")
    return redirect(reverse("web:webhooks", args=[project.slug]))


@require_POST
@project_view
def webhook_redeliver_action(
    request: HttpRequest, project: Project, delivery_id: UUID
) -> HttpResponse:
    _require_admin(request, project)
    delivery = webhook_delivery_get(project=project, delivery_id=str(delivery_id))
    webhook_redeliver(delivery=delivery, actor=request.user)
    messages.success(request, f"Queued {delivery.event} again for {delivery.webhook.url}.")
    return redirect(reverse("web:webhooks", args=[project.slug]))
