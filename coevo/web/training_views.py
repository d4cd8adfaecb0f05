"""Training run pages: the project's runs, one run (its log tail refreshed by htmx while it is
open, the polling stopping once it is final), its full log, and cancel for researchers. The
argv a run ran is shown to operators only (trainer_command_visible)."""

from __future__ import annotations

import shlex
from typing import Any
from uuid import UUID

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import FileResponse, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_POST

from coevo.campaigns.selectors import proposal_for_training_run
from coevo.errors import CoevoError, NotFound
from coevo.projects.models import Project, Role
from coevo.projects.selectors import project_user_has_role
from coevo.training.selectors import (
    trainer_command_visible,
    training_run_get,
    training_run_legacy_command_line,
    training_run_list,
    training_run_log_tail_for,
)
from coevo.training.services import training_run_cancel, training_run_log_path
from coevo.web.access import project_view

LIST_LIMIT = 100


def can_cancel_training(*, project: Project, user: Any) -> bool:
    return project_user_has_role(project=project, user=user, role=Role.RESEARCHER)


@project_view
def training_run_list_page(request: HttpRequest, project: Project) -> HttpResponse:
    runs = list(training_run_list(project=project)[:LIST_LIMIT])
    context = {"project": project, "runs": runs, "open": any(not r.is_final for r in runs)}
    return render(request, "training/list.html", context)


@project_view
def training_run_detail(request: HttpRequest, project: Project, run_id: UUID) -> HttpResponse:
    run = training_run_get(project=project, run_id=run_id)
    step = proposal_for_training_run(project=project, run=run)
    show_command = trainer_command_visible(user=request.user)
    context = {
        "project": project,
        "run": run,
        "show_command": show_command,
        "command": shlex.join(run.command) if run.command and show_command else "",
        "log_tail": training_run_log_tail_for(run=run, user=request.user),
        "step": step,
        "can_cancel": can_cancel_training(project=project, user=request.user),
        "full_log": training_run_log_path(run=run) is not None,
    }
    # The polling request (htmx) gets only the live part; its final render stops the polling.
    partial = request.htmx and not request.htmx.history_restore_request
    template = "training/_live.html" if partial else "training/detail.html"
    response = render(request, template, context)
    patch_vary_headers(response, ("HX-Request",))
    return response


@project_view
def training_run_log(request: HttpRequest, project: Project, run_id: UUID) -> HttpResponse:
    """The whole log, streamed, while it is on this machine (the training worker's disk)."""
    run = training_run_get(project=project, run_id=run_id)
    path = training_run_log_path(run=run)
    if path is None:
        raise NotFound(
            f"The full log of training run {run.id} is not on this machine (it stays on the "
            "training worker that ran it); the page shows its last part."
        )
    log = path.open("rb")
    # Older runs' logs start with the argv: members who may not see the command get the rest.
    line = training_run_legacy_command_line(run=run)
    if not line or trainer_command_visible(user=request.user) or log.read(len(line)) != line:
        log.seek(0)
    return FileResponse(
        log,
        as_attachment=False,
        filename=f"training-{run.id}.log",
        content_type="text/plain; charset=utf-8",
    )


@require_POST
@project_view
def training_run_cancel_action(
    request: HttpRequest, project: Project, run_id: UUID
) -> HttpResponse:
    if not can_cancel_training(project=project, user=request.user):
        raise PermissionDenied("Cancelling a training run needs the researcher role.")
    run = training_run_get(project=project, run_id=run_id)
    try:
        run = training_run_cancel(run=run, actor=request.user)
    except CoevoError as exc:
        messages.error(request, str(exc))
    else:
        if run.is_final:
            messages.success(request, "Training run cancelled.")
        else:
            messages.success(request, "Cancel requested: the worker stops the command shortly.")
    return redirect("web:training_run", project.slug, run.id)
