"""Compatibility matrix pages: the list with the create form (researchers), and one matrix's
grid (htmx polling while cells run, stopping when every cell is final)."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.cache import patch_vary_headers

from coevo.errors import CoevoError
from coevo.matrices.selectors import (
    matrix_get,
    matrix_grid,
    matrix_list,
    matrix_listed_state,
)
from coevo.matrices.services import MAX_COLUMNS, MAX_ROWS, matrix_create
from coevo.policies.models import PolicyVersion
from coevo.policies.selectors import policy_versions_list
from coevo.projects.models import Project, Role
from coevo.projects.selectors import project_user_has_role
from coevo.suites.models import Split, Suite
from coevo.suites.selectors import suite_list
from coevo.web.access import project_view
from harness_store.models import Candidate
from harness_store.selectors import candidate_list

CANDIDATE_CHOICES = 100


def can_create_matrices(*, project: Project, user: Any) -> bool:
    return project_user_has_role(project=project, user=user, role=Role.RESEARCHER)


class MatrixCreateForm(forms.Form):
    name = forms.CharField(max_length=200, required=False)
    candidates = forms.ModelMultipleChoiceField(
        queryset=Candidate.objects.none(),
        widget=forms.CheckboxSelectMultiple,
        help_text=f"the rows (at most {MAX_ROWS}; the {CANDIDATE_CHOICES} most recent shown)",
    )
    policy_versions = forms.ModelMultipleChoiceField(
        queryset=PolicyVersion.objects.none(),
        widget=forms.CheckboxSelectMultiple,
        label="policy versions",
        help_text=f"the columns (at most {MAX_COLUMNS})",
    )
    suite = forms.ModelChoiceField(queryset=Suite.objects.none())
    # Held-out is sealed (docs/architecture.md, "The held-out seal"): not even offered.
    split = forms.ChoiceField(
        choices=[(Split.SEARCH.value, "search"), (Split.VALIDATION.value, "validation")],
        initial=Split.VALIDATION.value,
    )
    epochs = forms.IntegerField(min_value=1, max_value=100, initial=1)
    random_seed = forms.IntegerField(min_value=0, max_value=2**31 - 1, initial=0, label="seed")
    task_limit = forms.IntegerField(min_value=1, required=False, label="task limit")

    def __init__(self, *args: Any, project: Project, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        recent = candidate_list(project=project).order_by("-authored_at")
        ids = list(recent.values_list("id", flat=True)[:CANDIDATE_CHOICES])
        self.fields["candidates"].queryset = recent.filter(id__in=ids)
        self.fields["candidates"].label_from_instance = lambda c: f"{c.short_sha} {c.subject}"
        self.fields["policy_versions"].queryset = policy_versions_list()
        self.fields["suite"].queryset = suite_list(project=project).order_by("name", "-created_at")
        self.fields["suite"].label_from_instance = lambda s: f"{s.name} {s.version}"


@project_view
def matrix_list_page(request: HttpRequest, project: Project) -> HttpResponse:
    can_create = can_create_matrices(project=project, user=request.user)
    form = MatrixCreateForm(project=project) if can_create else None
    if request.method == "POST":
        if not can_create:
            raise PermissionDenied("Creating a compatibility matrix needs the researcher role.")
        form = MatrixCreateForm(request.POST, project=project)
        if form.is_valid():
            data = form.cleaned_data
            try:
                matrix = matrix_create(
                    project=project,
                    candidates=list(data["candidates"]),
                    policy_versions=list(data["policy_versions"]),
                    suite=data["suite"],
                    split=data["split"],
                    epochs=data["epochs"],
                    seed=data["random_seed"],
                    task_limit=data["task_limit"],
                    name=data["name"],
                    created_by=request.user,
                )
            except CoevoError as exc:
                form.add_error(None, str(exc))
            else:
                messages.success(request, "Matrix created: its cells are being evaluated.")
                return redirect("web:matrix", project.slug, matrix.id)
    matrices = list(matrix_list(project=project)[:100])
    rows = [(m, matrix_listed_state(matrix=m)) for m in matrices]
    status = 400 if form is not None and form.is_bound and form.errors else 200
    return render(
        request,
        "matrices/list.html",
        {"project": project, "rows": rows, "form": form, "can_create": can_create},
        status=status,
    )


@project_view
def matrix_detail(request: HttpRequest, project: Project, matrix_id: UUID) -> HttpResponse:
    matrix = matrix_get(project=project, matrix_id=matrix_id)
    grid = matrix_grid(matrix=matrix)
    context = {"project": project, "matrix": matrix, "grid": grid}
    # The polling request (htmx) gets only the grid; its final render stops the polling.
    partial = request.htmx and not request.htmx.history_restore_request
    template = "matrices/_grid.html" if partial else "matrices/detail.html"
    response = render(request, template, context)
    patch_vary_headers(response, ("HX-Request",))
    return response
