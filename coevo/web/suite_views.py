"""Dashboard pages for task suites: the list, one suite's tasks, and the import form.

Held-out tasks are sealed (docs/architecture.md, "The held-out seal"): their pages show key and split only, never inputs.
No page shows a task's ``verifier`` payload (expected answers, hidden tests, verifier source).
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django import forms
from django.contrib import messages
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt, csrf_protect

from coevo.errors import CoevoError
from coevo.projects.audience import Audience
from coevo.projects.models import Project, Role
from coevo.projects.selectors import project_user_has_role
from coevo.suites.harbor import (
    HarborReport,
    suite_import_harbor_archive,
    suite_import_workspace_basic,
)
from coevo.suites.jsonl import MAX_FILE_BYTES, SCORERS, SuiteImportError, scorer_spec_build
from coevo.suites.models import Split, Suite
from coevo.suites.selectors import (
    suite_get_by_id,
    suite_image_rows,
    suite_summaries,
    task_catalogue,
)
from coevo.suites.services import suite_import_humaneval, suite_import_jsonl
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


class JsonlImportForm(forms.Form):
    name = forms.SlugField(max_length=64, help_text="lowercase letters, digits, - and _")
    file = forms.FileField(help_text="one JSON object per line: id, input, expected, …")
    scorer = forms.ChoiceField(choices=[(s, s) for s in SCORERS])
    tolerance = forms.FloatField(required=False, help_text="numeric: absolute tolerance")
    rel_tolerance = forms.FloatField(required=False, help_text="numeric: relative tolerance")
    verifier = forms.FileField(
        required=False, help_text="python: a .py module with score(answer, expected, metadata)"
    )
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    split_seed = forms.CharField(max_length=64, initial="0", required=False)


class HarborImportForm(forms.Form):
    name = forms.SlugField(max_length=64, help_text="lowercase letters, digits, - and _")
    file = forms.FileField(
        help_text="a tar.gz of a directory of Harbor task directories (or of one task)"
    )
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    split_seed = forms.CharField(max_length=64, initial="0", required=False)
    allow_dockerfile = forms.BooleanField(
        required=False,
        help_text="take tasks that need their container (a Dockerfile that runs commands, a "
        "prebuilt image) with only the files their Dockerfile copies; without it they are "
        "refused, unless the container backend is on (COEVO_CONTAINER_BACKEND), which imports "
        "them as they are",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Its fields share names with the JSONL form's on the same page; their ids may not.
        kwargs.setdefault("auto_id", "harbor_%s")
        super().__init__(*args, **kwargs)


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
    return _render_import(
        request, project, JsonlImportForm(), HarborImportForm(), [error], 0, status=413
    )


def _max_megabytes() -> int:
    return min(MAX_FILE_BYTES, upload_limit_bytes()) // 1024**2


@csrf_protect
def _suite_import(request: HttpRequest, project: Project) -> HttpResponse:
    form = JsonlImportForm()
    harbor_form = HarborImportForm()
    errors: list[str] = []
    total_errors = 0
    if request.method == "POST":
        kind = request.POST.get("kind", "jsonl")
        report: HarborReport | None = None
        try:
            if kind == "jsonl":
                form = JsonlImportForm(request.POST, request.FILES)
                suite, created = _import_jsonl(project=project, form=form, actor=request.user)
            elif kind == "harbor":
                harbor_form = HarborImportForm(request.POST, request.FILES)
                suite, created, report = _import_harbor(
                    project=project, form=harbor_form, actor=request.user
                )
            elif kind == "workspace":
                suite, created, report = suite_import_workspace_basic(
                    project=project, actor=request.user
                )
            else:
                suite, created = _import_bundled(project=project, kind=kind, actor=request.user)
        except SuiteImportError as exc:
            errors, total_errors = exc.errors[:MAX_ERRORS_SHOWN], exc.total
        except CoevoError as exc:
            errors, total_errors = [str(exc)], 1
        else:
            _announce(request, suite=suite, created=created)
            if report is not None:
                _announce_report(request, report)
            return redirect(reverse("web:suite", args=[project.slug, suite.id]))
    return _render_import(
        request, project, form, harbor_form, errors, total_errors, status=400 if errors else 200
    )


def _render_import(
    request: HttpRequest,
    project: Project,
    form: JsonlImportForm,
    harbor_form: HarborImportForm,
    errors: list[str],
    total_errors: int,
    *,
    status: int,
) -> HttpResponse:
    return render(
        request,
        "web/suite_import.html",
        {
            "project": project,
            "form": form,
            "harbor_form": harbor_form,
            "errors": errors,
            "more_errors": max(0, total_errors - len(errors)),
            "max_megabytes": _max_megabytes(),
        },
        status=status,
    )


def _import_jsonl(
    *, project: Project, form: JsonlImportForm, actor: AbstractBaseUser
) -> tuple[Suite, bool]:
    if not form.is_valid():
        raise SuiteImportError(
            [f"{name}: {' '.join(problems)}" for name, problems in form.errors.items()]
        )
    data = form.cleaned_data
    upload = data["file"]
    if upload.size > MAX_FILE_BYTES:
        raise SuiteImportError(
            [
                f"file: {upload.size / 1024**2:.1f} MiB is over the {MAX_FILE_BYTES // 1024**2} MiB "
                "limit; split it into several suites"
            ]
        )
    verifier = data["verifier"]
    scorer = scorer_spec_build(
        kind=data["scorer"],
        abs_tol=data["tolerance"],
        rel_tol=data["rel_tolerance"],
        verifier_name=verifier.name if verifier else "",
        verifier_source=verifier.read() if verifier else None,
    )
    return suite_import_jsonl(
        project=project,
        name=data["name"],
        data=upload.read(),
        scorer=scorer,
        description=data["description"],
        split_seed=data["split_seed"] or "0",
        actor=actor,
    )


def _import_harbor(
    *, project: Project, form: HarborImportForm, actor: AbstractBaseUser
) -> tuple[Suite, bool, HarborReport]:
    if not form.is_valid():
        raise SuiteImportError(
            [f"{name}: {' '.join(problems)}" for name, problems in form.errors.items()]
        )
    data = form.cleaned_data
    # The upload is bounded already (suite_import_page); the archive's content is bounded
    # while it is unpacked (harness_store.archives).
    return suite_import_harbor_archive(
        project=project,
        name=data["name"],
        archive=data["file"].read(),
        split_seed=data["split_seed"] or "0",
        description=data["description"],
        allow_dockerfile=data["allow_dockerfile"],
        actor=actor,
    )


def _import_bundled(*, project: Project, kind: str, actor: AbstractBaseUser) -> tuple[Suite, bool]:
    if kind == "humaneval":
        return suite_import_humaneval(project=project, actor=actor)
    if kind == "textworld":
        try:
            from coevo.suites.textworld import suite_import_textworld
        except ImportError as exc:
            raise CoevoError(
                "TextWorld suites are not available on this server: install coevo's "
                f"textworld dependencies ({exc})."
            ) from exc
        return suite_import_textworld(project=project, actor=actor)
    raise SuiteImportError([f"kind: unknown suite kind {kind!r}"])


def _announce(request: HttpRequest, *, suite: Suite, created: bool) -> None:
    if created:
        messages.success(request, f"Imported {suite.name} {suite.version}.")
    else:
        messages.info(
            request,
            f"{suite.name} {suite.version} already has exactly this content; nothing new "
            "was imported.",
        )


def _announce_report(request: HttpRequest, report: HarborReport) -> None:
    notes = [f"refused {key}: {reason}" for key, reason in report.refused]
    notes += [f"{key}: {warning}" for key, warning in report.warnings]
    refused = f"; refused {len(report.refused)}" if report.refused else ""
    messages.info(request, f"Tasks taken: {len(report.taken)}{refused}.")
    for note in notes[:MAX_ERRORS_SHOWN]:
        messages.warning(request, note)
    if len(notes) > MAX_ERRORS_SHOWN:
        messages.warning(request, f"… and {len(notes) - MAX_ERRORS_SHOWN} more notes.")
