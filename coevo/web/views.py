"""The browser dashboard: server-rendered pages, htmx for the live evaluation progress.

Every project page goes through ``project_view``, which scopes it to a project the user is a
member of; every read below is a selector call on that project. None of these pages is a
promotion request's review, so their audience is ``Audience.MEMBER`` whatever the user's role:
held-out evaluations and rollouts are not found here, for reviewers too.
"""

from __future__ import annotations

from urllib.parse import urlencode
from uuid import UUID

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_POST

from coevo.errors import CoevoError, HarnessStoreError, InvalidInput
from coevo.evaluations.lifecycle import evaluation_cancel, evaluation_resume
from coevo.evaluations.models import Rollout, RolloutState
from coevo.evaluations.selectors import (
    candidate_split_gaps,
    evaluation_budget,
    evaluation_comparable_list,
    evaluation_compare,
    evaluation_errors,
    evaluation_get,
    evaluation_progress,
    evaluation_stages,
    evaluation_statistics,
    evaluation_summaries,
    rollout_get,
    rollout_list_page,
)
from coevo.policies.selectors import policy_slot_wait
from coevo.projects.audience import Audience
from coevo.projects.models import Project, Role
from coevo.projects.selectors import project_user_has_role
from coevo.suites.selectors import suite_list, task_is_sealed
from coevo.web.access import project_view
from coevo.web.highlight import diff_files, file_view
from coevo.web.presenters import (
    FLIP_NAMES,
    flip_table,
    membership_role,
    project_summaries_for_user,
    task_prompt,
    trace_viewer,
)
from harness_store.diffs import DiffTooLarge
from harness_store.selectors import (
    candidate_diff_files,
    candidate_diff_names,
    candidate_files,
    candidate_get,
    candidate_list,
    candidate_page,
    candidate_parent,
    candidate_read_file,
)

CANDIDATES_PER_PAGE = 50
ROLLOUTS_PER_PAGE = 100


@login_required
def home(request: HttpRequest) -> HttpResponse:
    projects = project_summaries_for_user(user=request.user)
    return render(request, "web/home.html", {"projects": projects})


@project_view
def project_detail(request: HttpRequest, project: Project) -> HttpResponse:
    """The project's candidates a page at a time (``?cursor=``: older ones), its suites and
    recent evaluations."""
    cursor = request.GET.get("cursor")
    try:
        page = candidate_page(project=project, cursor=cursor, limit=CANDIDATES_PER_PAGE)
    except InvalidInput as exc:
        raise Http404(str(exc)) from exc
    return render(
        request,
        "web/project.html",
        {
            "project": project,
            "role": membership_role(project=project, user=request.user),
            "candidates": page.candidates,
            "candidate_count": candidate_list(project=project).count(),
            "older_query": urlencode({"cursor": page.next_cursor}) if page.next_cursor else None,
            "paged": bool(cursor),
            "suites": suite_list(project=project),
            "evaluations": evaluation_summaries(
                project=project, audience=Audience.MEMBER, limit=20
            ),
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
            "evaluations": evaluation_summaries(
                project=project, audience=Audience.MEMBER, candidate=candidate, limit=50
            ),
            "gaps": candidate_split_gaps(candidate=candidate),
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
    files, names, too_large, error = [], [], None, None
    try:
        files = diff_files(candidate_diff_files(candidate=candidate, base=base))
    except DiffTooLarge as exc:
        # Not shown, but named: a reviewer still sees every file the candidate changes.
        too_large = str(exc)
        try:
            names = candidate_diff_names(candidate=candidate, base=base)
        except HarnessStoreError as names_exc:
            error = str(names_exc)
    except HarnessStoreError as exc:
        error = str(exc)
    return render(
        request,
        "web/diff.html",
        {
            "project": project,
            "candidate": candidate,
            "base": base,
            "base_requested": base_sha,
            "files": files,
            "names": names,
            "too_large": too_large,
            "error": error,
        },
    )


@project_view
def evaluation_detail(request: HttpRequest, project: Project, evaluation_id: UUID) -> HttpResponse:
    evaluation = evaluation_get(
        project=project, evaluation_id=evaluation_id, audience=Audience.MEMBER
    )
    cursor = request.GET.get("cursor")
    try:
        rollouts = rollout_list_page(evaluation=evaluation, cursor=cursor, limit=ROLLOUTS_PER_PAGE)
    except InvalidInput as exc:
        raise Http404(str(exc)) from exc
    context = {
        "project": project,
        "evaluation": evaluation,
        "progress": evaluation_progress(evaluation=evaluation),
        "statistics": evaluation_statistics(evaluation=evaluation),
        "stages": evaluation_stages(evaluation=evaluation),
        "budget": evaluation_budget(evaluation=evaluation),
        "errors": evaluation_errors(evaluation=evaluation),
        "rollouts": rollouts.rollouts,
        "rollouts_next": urlencode({"cursor": rollouts.next_cursor})
        if rollouts.next_cursor
        else None,
        "rollouts_paged": bool(cursor),
        "can_run": project_user_has_role(project=project, user=request.user, role=Role.RESEARCHER),
        "comparable": evaluation_comparable_list(evaluation=evaluation)[:20],
    }
    # The polling request (htmx) gets only the live part; its final render stops the polling.
    partial = request.htmx and not request.htmx.history_restore_request
    template = "web/_evaluation_progress.html" if partial else "web/evaluation.html"
    response = render(request, template, context)
    patch_vary_headers(response, ("HX-Request",))
    return response


@project_view
def rollout_detail(request: HttpRequest, project: Project, rollout_id: UUID) -> HttpResponse:
    """A rollout and its trace, a page of steps at a time (``?from=attempt.index``), searched
    with ``?q=``; htmx's "load more" gets only the next page's steps."""
    rollout = rollout_get(project=project, rollout_id=rollout_id, audience=Audience.MEMBER)
    # Held-out inputs are sealed (docs/architecture.md, "The held-out seal"): the prompt is in the task and in every model
    # call of the trace, so neither is shown. Reviewers reach held-out rollouts only through a
    # promotion request (coevo.web.promotion_views.promotion_rollout), which unseals them.
    return rollout_page(request, project, rollout, sealed=task_is_sealed(task=rollout.task))


def rollout_page(
    request: HttpRequest, project: Project, rollout: Rollout, *, sealed: bool
) -> HttpResponse:
    """Render a rollout's page; ``sealed`` hides the task's inputs and the trace."""
    partial = request.htmx and not request.htmx.history_restore_request
    trace = None
    if not sealed:
        trace = trace_viewer(
            rollout=rollout,
            cursor=request.GET.get("from"),
            query=request.GET.get("q", ""),
            workspace=not partial,
        )
    slot_wait = None
    if rollout.state == RolloutState.RUNNING:
        slot_wait = policy_slot_wait(
            version=rollout.evaluation.policy_version, holder=f"rollout {rollout.id}"
        )
    context = {
        "project": project,
        "evaluation": rollout.evaluation,
        "rollout": rollout,
        "slot_wait": slot_wait,
        "sealed": sealed,
        "prompt": "" if sealed else task_prompt(rollout=rollout),
        "trace": trace,
    }
    template = "web/_trace_page.html" if partial else "web/rollout.html"
    response = render(request, template, context)
    patch_vary_headers(response, ("HX-Request",))
    return response


@require_POST
@project_view
def evaluation_action(
    request: HttpRequest, project: Project, evaluation_id: UUID, action: str
) -> HttpResponse:
    """Cancel or resume an evaluation (researchers and above)."""
    if not project_user_has_role(project=project, user=request.user, role=Role.RESEARCHER):
        raise PermissionDenied("Cancelling or resuming evaluations needs the researcher role.")
    evaluation = evaluation_get(
        project=project, evaluation_id=evaluation_id, audience=Audience.MEMBER
    )
    if action not in ("cancel", "resume"):
        raise Http404(f"No action {action!r}.")
    try:
        if action == "cancel":
            stopped = evaluation_cancel(
                evaluation=evaluation, reason=f"cancelled by {request.user.get_username()}"
            )
            messages.success(request, f"Evaluation cancelled; {stopped} rollouts stopped.")
        else:
            rerun = evaluation_resume(evaluation=evaluation)
            messages.success(request, f"Evaluation resumed; {rerun} rollouts will run again.")
    except CoevoError as exc:
        messages.error(request, str(exc))
    return redirect("web:evaluation", project.slug, evaluation.id)


@project_view
def evaluation_comparison(request: HttpRequest, project: Project) -> HttpResponse:
    """Two evaluations of the same suite split, task by task: ``?reference=…&candidate=…``."""
    # Held-out comparisons are part of a promotion request's evidence, never shown here.
    reference = evaluation_get(
        project=project, evaluation_id=request.GET.get("reference"), audience=Audience.MEMBER
    )
    candidate = evaluation_get(
        project=project, evaluation_id=request.GET.get("candidate"), audience=Audience.MEMBER
    )
    context: dict[str, object] = {
        "project": project,
        "reference": reference,
        "candidate": candidate,
    }
    try:
        comparison = evaluation_compare(reference=reference, candidate=candidate)
    except CoevoError as exc:
        return render(request, "web/comparison.html", {**context, "error": str(exc)}, status=400)
    table = flip_table(
        project=project,
        comparison=comparison,
        flip=request.GET.get("flip"),
        show_all=request.GET.get("all") == "1",
    )
    query = {"reference": reference.id, "candidate": candidate.id}
    context.update(
        comparison=comparison,
        statistics=comparison.statistics,
        flips=table,
        flip_names=FLIP_NAMES,
        # Links that keep the pair: one kind of flip, or all of the shown kind.
        flip_query=urlencode(query),
        all_query=urlencode({**query, **({"flip": table.flip} if table.flip else {}), "all": 1}),
    )
    return render(request, "web/comparison.html", context)
