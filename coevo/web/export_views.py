"""Trajectory exports: the project's exports page (a create form for researchers and up, the
list for every member) and the streaming download."""

from __future__ import annotations

from uuid import UUID

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from coevo.errors import CoevoError, InvalidState, NotFound
from coevo.exports.downloads import export_file_response
from coevo.exports.models import ExportFormat
from coevo.exports.selectors import (
    trajectory_export_file,
    trajectory_export_get,
    trajectory_export_list,
)
from coevo.exports.services import trajectory_export_create
from coevo.policies.models import PolicyVersion
from coevo.projects.models import Project, Role
from coevo.projects.selectors import project_user_has_role
from coevo.suites.models import Split, Suite
from coevo.web.access import project_view
from harness_store.selectors import candidate_get

SPLIT_CHOICES = [(Split.SEARCH.value, "search"), (Split.VALIDATION.value, "validation")]


class ExportForm(forms.Form):
    format = forms.ChoiceField(choices=ExportFormat.choices, initial=ExportFormat.CHAT)
    splits = forms.MultipleChoiceField(
        choices=SPLIT_CHOICES,
        initial=[Split.SEARCH.value],
        widget=forms.CheckboxSelectMultiple,
        help_text="Held-out rollouts are never exported.",
    )
    candidate = forms.RegexField(
        regex=r"^[0-9a-fA-F]{7,40}$",
        required=False,
        help_text="Harness-matched: only rollouts produced under this candidate (SHA).",
    )
    policy_version = forms.CharField(max_length=100, required=False)
    suite = forms.ModelChoiceField(queryset=Suite.objects.none(), required=False)
    successful_only = forms.BooleanField(required=False)
    min_score = forms.FloatField(required=False, min_value=0.0, max_value=1.0)
    last_turns = forms.IntegerField(
        required=False,
        min_value=1,
        help_text="Weight 0 for a rollout's turns before its last N model calls.",
    )

    def __init__(self, *args: object, project: Project, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.fields["suite"].queryset = Suite.objects.filter(project=project).order_by(
            "name", "-created_at"
        )


@project_view
def exports_page(request: HttpRequest, project: Project) -> HttpResponse:
    can_create = project_user_has_role(project=project, user=request.user, role=Role.RESEARCHER)
    form = ExportForm(project=project)
    if request.method == "POST":
        if not can_create:
            raise PermissionDenied("Creating exports needs the researcher role.")
        form = ExportForm(request.POST, project=project)
        if form.is_valid():
            try:
                export = _create(request, project, form.cleaned_data)
            except (CoevoError, NotFound) as exc:
                form.add_error(None, str(exc))
            else:
                messages.success(request, f"Export {export.id} is being built.")
                return redirect("web:exports", project.slug)
    exports = list(trajectory_export_list(project=project)[:100])
    context = {
        "project": project,
        "exports": exports,
        "form": form,
        "can_create": can_create,
        "building": any(not e.is_final for e in exports),
    }
    return render(request, "exports/list.html", context, status=400 if form.errors else 200)


def _create(request: HttpRequest, project: Project, data: dict):
    policy_version = None
    if data.get("policy_version"):
        policy_version = PolicyVersion.objects.filter(name=data["policy_version"]).first()
        if policy_version is None:
            raise NotFound(f"No policy version {data['policy_version']!r}.")
    candidate = candidate_get(project=project, sha=data["candidate"]) if data["candidate"] else None
    return trajectory_export_create(
        project=project,
        format=data["format"],
        splits=list(data["splits"]),
        candidate=candidate,
        policy_version=policy_version,
        suite=data.get("suite"),
        successful_only=data["successful_only"],
        min_score=data.get("min_score"),
        last_turns=data.get("last_turns"),
        created_by=request.user,
    )


@project_view
def export_download(request: HttpRequest, project: Project, export_id: UUID) -> HttpResponse:
    export = trajectory_export_get(project=project, export_id=export_id)
    try:
        path = trajectory_export_file(export=export)
    except InvalidState as exc:
        return HttpResponse(str(exc), status=409, content_type="text/plain")
    return export_file_response(path=path, filename=export.filename)
