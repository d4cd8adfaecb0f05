"""The browser dashboard: server-rendered pages, htmx for the live evaluation progress.

Every project page goes through ``project_view``, which scopes it to a project the user is a
member of; every read below is a selector call on that project.
"""

from __future__ import annotations

from uuid import UUID

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.cache import patch_vary_headers

from coevo.errors import HarnessStoreError
from coevo.evaluations.selectors import (
    evaluation_get,
    evaluation_progress,
    evaluation_summaries,
    rollout_get,
    rollout_list,
)
from coevo.projects.models import Project
from coevo.suites.selectors import suite_list
from coevo.web.access import project_view
from coevo.web.highlight import diff_files, file_view
from coevo.web.presenters import (
    membership_role,
    project_summaries_for_user,
    task_prompt,
    trace_attempts,
)
from harness_store.selectors import (
    candidate_diff,
    candidate_files,
    candidate_get,
    candidate_list,
    candidate_parent,
    candidate_read_file,
)

CANDIDATES_PER_PAGE = 50


@login_required
def home(request: HttpRequest) -> HttpResponse:
    projects = project_summaries_for_user(user=request.user)
    return render(request, "web/home.html", {"projects": projects})


@project_view
def project_detail(request: HttpRequest, project: Project) -> HttpResponse:
    candidates = Paginator(candidate_list(project=project), CANDIDATES_PER_PAGE)
    return render(
        request,
        "web/project.html",
        {
            "project": project,
            "role": membership_role(project=project, user=request.user),
            "candidates": candidates.get_page(request.GET.get("page")),
            "suites": suite_list(project=project),
            "evaluations": evaluation_summaries(project=project, limit=20),
        },
    )


@project_view
def candidate_detail(request: HttpRequest, project: Project, sha: str) -> HttpResponse:
    candidate = candidate_get(project=project, sha=sha)
    return render(
        request,
        "web/candidate.html",
        {
            "project": project,
            "candidate": candidate,
            "parent": candidate_parent(candidate=candidate),
            "files": candidate_files(candidate=candidate),
            "evaluations": evaluation_summaries(project=project, candidate=candidate, limit=50),
        },
    )


@project_view
def candidate_file(request: HttpRequest, project: Project, sha: str, path: str) -> HttpResponse:
    candidate = candidate_get(project=project, sha=sha)
    error = view = None
    try:
        view = file_view(path=path, data=candidate_read_file(candidate=candidate, path=path))
    except HarnessStoreError as exc:
        error = str(exc)
    return render(
        request,
        "web/file.html",
        {"project": project, "candidate": candidate, "path": path, "file": view, "error": error},
    )


@project_view
def candidate_diff_page(request: HttpRequest, project: Project, sha: str) -> HttpResponse:
    candidate = candidate_get(project=project, sha=sha)
    base_sha = request.GET.get("base", "").strip()
    # Default: the first parent; a root commit diffs against the empty tree (base None).
    base = (
        candidate_get(project=project, sha=base_sha)
        if base_sha
        else candidate_parent(candidate=candidate)
    )
    diff = candidate_diff(candidate=candidate, base=base)
    return render(
        request,
        "web/diff.html",
        {
            "project": project,
            "candidate": candidate,
            "base": base,
            "base_requested": base_sha,
            "files": diff_files(diff),
        },
    )


@project_view
def evaluation_detail(request: HttpRequest, project: Project, evaluation_id: UUID) -> HttpResponse:
    evaluation = evaluation_get(project=project, evaluation_id=evaluation_id)
    context = {
        "project": project,
        "evaluation": evaluation,
        "progress": evaluation_progress(evaluation=evaluation),
        "rollouts": rollout_list(evaluation=evaluation),
    }
    # The polling request (htmx) gets only the live part; its final render stops the polling.
    partial = request.htmx and not request.htmx.history_restore_request
    template = "web/_evaluation_progress.html" if partial else "web/evaluation.html"
    response = render(request, template, context)
    patch_vary_headers(response, ("HX-Request",))
    return response


@project_view
def rollout_detail(request: HttpRequest, project: Project, rollout_id: UUID) -> HttpResponse:
    rollout = rollout_get(project=project, rollout_id=rollout_id)
    return render(
        request,
        "web/rollout.html",
        {
            "project": project,
            "evaluation": rollout.evaluation,
            "rollout": rollout,
            "prompt": task_prompt(rollout=rollout),
            "attempts": trace_attempts(rollout=rollout),
        },
    )
