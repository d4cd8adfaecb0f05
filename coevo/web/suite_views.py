"""Dashboard pages for task suites: the list, one suite's tasks, and the import form.

Held-out tasks are sealed (docs/architecture.md, "The held-out seal"): their pages show key and split only, never inputs.
No page shows a task's ``verifier`` payload (expected answers, hidden tests, verifier source).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe
from django.views.decorators.csrf import csrf_exempt, csrf_protect

from coevo.errors import CoevoError
from coevo.projects.audience import Audience
from coevo.projects.models import Project, Role
from coevo.projects.selectors import project_user_has_role
from coevo.suites.jsonl import MAX_FILE_BYTES, SuiteImportError
from coevo.suites.kinds import Imported, ImportReport, shipped_imports, upload_imports
from coevo.suites.models import Split, Suite
from coevo.suites.selectors import (
    suite_get_by_id,
    suite_image_rows,
    suite_summaries,
    task_catalogue,
)
from coevo.web.access import project_view
from coevo.web.presenters import task_row
from coevo.web.uploads import (
    MULTIPART_SLACK,
    declared_length,
    upload_limit_bytes,
    upload_limit_install,
)

TASKS_PER_PAGE = 100
MAX_ERRORS_SHOWN = 20


@dataclass(frozen=True)
class UploadCard:
    """A registered upload import as the page shows it: its form, bound when it was posted."""

    name: str
    title: str
    description: SafeString
    notes: SafeString
    form: forms.Form


def can_import_suites(*, project: Project, user: Any) -> bool:
    return project_user_has_role(project=project, user=user, role=Role.RESEARCHER)


@project_view
def suite_list_page(request: HttpRequest, project: Project) -> HttpResponse:
    return render(
        request,
        "web/suite_list.html",
        {
            "project": project,
            "suites": suite_summaries(project=project),
            "can_import": can_import_suites(project=project, user=request.user),
        },
    )


@project_view
def suite_detail(request: HttpRequest, project: Project, suite_id: UUID) -> HttpResponse:
    suite = suite_get_by_id(project=project, suite_id=suite_id)
    split = request.GET.get("split", "")
    chosen = Split(split) if split in Split.values else None
    # Not a review page: held-out tasks are listed by key, sealed (Audience.MEMBER).
    tasks = task_catalogue(suite=suite, audience=Audience.MEMBER, split=chosen)
    page = Paginator(tasks, TASKS_PER_PAGE).get_page(request.GET.get("page"))
    return render(
        request,
        "web/suite_detail.html",
        {
            "project": project,
            "suite": suite,
            "split": chosen.value if chosen else "",
            "splits": Split.choices,
            "page": page,
            "tasks": [task_row(task) for task in page],
            # The images of this page's tasks that run in their container (sealed when held
            # out): a page of them, as each may carry a build log.
            "images": suite_image_rows(suite=suite, task_ids=[task.id for task in page]),
        },
    )


@csrf_exempt  # checked in _suite_import, once the upload limit is in place (CSRF reads the body)
@project_view
def suite_import_page(request: HttpRequest, project: Project) -> HttpResponse:
    if not can_import_suites(project=project, user=request.user):
        raise PermissionDenied("Importing suites needs the researcher role or above.")
    if request.method == "POST":
        limit = upload_limit_bytes()
        length = declared_length(request)
        if length > limit + MULTIPART_SLACK:
            # From the declared length alone: not a byte of the body has been read.
            return _too_large(request, project, f"the upload is {length / 1024**2:.1f} MiB")
        limiter = upload_limit_install(request)
        _ = request.FILES  # parsed here, under the limit
        if limiter.exceeded:
            return _too_large(request, project, f"its files pass {limit // 1024**2} MiB")
    return _suite_import(request, project)


def _too_large(request: HttpRequest, project: Project, what: str) -> HttpResponse:
    limit_mib = upload_limit_bytes() // 1024**2
    error = f"file: {what}, over the {limit_mib} MiB limit on uploads; split it into several suites"
    return _render_import(request, project, {}, [error], 0, status=413)


def _max_megabytes() -> int:
    return min(MAX_FILE_BYTES, upload_limit_bytes()) // 1024**2


@csrf_protect
def _suite_import(request: HttpRequest, project: Project) -> HttpResponse:
    # The upload's form that was posted, bound: the page shows it again with its values.
    posted: dict[str, forms.Form] = {}
    errors: list[str] = []
    total_errors = 0
    if request.method == "POST":
        kind = request.POST.get("kind", "")
        upload = upload_imports().get(kind)
        if upload is not None:
            posted[kind] = upload.form(request.POST, request.FILES)
        try:
            imported = _import(request, project, kind, posted.get(kind))
        except SuiteImportError as exc:
            errors, total_errors = exc.errors[:MAX_ERRORS_SHOWN], exc.total
        except CoevoError as exc:
            errors, total_errors = [str(exc)], 1
        else:
            _announce(request, suite=imported.suite, created=imported.created)
            if imported.report is not None:
                _announce_report(request, imported.report)
            return redirect(reverse("web:suite", args=[project.slug, imported.suite.id]))
    return _render_import(
        request, project, posted, errors, total_errors, status=400 if errors else 200
    )


def _import(request: HttpRequest, project: Project, kind: str, form: forms.Form | None) -> Imported:
    """The import the posted ``kind`` names: a shipped suite's button, or an upload's ``form``."""
    shipped = shipped_imports().get(kind)
    if shipped is not None:
        return shipped.run(project=project, actor=request.user)
    if form is None:
        raise SuiteImportError([f"kind: unknown suite kind {kind!r}"])
    if not form.is_valid():
        raise SuiteImportError(
            [f"{name}: {' '.join(problems)}" for name, problems in form.errors.items()]
        )
    return upload_imports()[kind].run(project=project, data=form.cleaned_data, actor=request.user)


def _render_import(
    request: HttpRequest,
    project: Project,
    posted: dict[str, forms.Form],
    errors: list[str],
    total_errors: int,
    *,
    status: int,
) -> HttpResponse:
    max_megabytes = _max_megabytes()
    uploads = [
        UploadCard(
            name=upload.name,
            title=upload.title,
            description=format_html(upload.description, max_megabytes=max_megabytes),
            # Declared by the kind's module, not by a user: HTML as written.
            notes=mark_safe(upload.notes),
            form=posted[upload.name] if upload.name in posted else upload.form(),
        )
        for upload in upload_imports().values()
    ]
    return render(
        request,
        "web/suite_import.html",
        {
            "project": project,
            "shipped": list(shipped_imports().values()),
            "uploads": uploads,
            "errors": errors,
            "more_errors": max(0, total_errors - len(errors)),
        },
        status=status,
    )


def _announce(request: HttpRequest, *, suite: Suite, created: bool) -> None:
    if created:
        messages.success(request, f"Imported {suite.name} {suite.version}.")
    else:
        messages.info(
            request,
            f"{suite.name} {suite.version} already has exactly this content; nothing new "
            "was imported.",
        )


def _announce_report(request: HttpRequest, report: ImportReport) -> None:
    notes = [f"refused {key}: {reason}" for key, reason in report.refused]
    notes += [f"{key}: {warning}" for key, warning in report.warnings]
    refused = f"; refused {len(report.refused)}" if report.refused else ""
    messages.info(request, f"Tasks taken: {len(report.taken)}{refused}.")
    for note in notes[:MAX_ERRORS_SHOWN]:
        messages.warning(request, note)
    if len(notes) > MAX_ERRORS_SHOWN:
        messages.warning(request, f"… and {len(notes) - MAX_ERRORS_SHOWN} more notes.")
