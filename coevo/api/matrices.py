"""API: compatibility matrices (see docs/api.md, Compatibility matrices). Included under
``projects/<slug:slug>/``.

Creating a matrix needs the ``evaluations:run`` scope and the researcher role and answers
``202`` with its status URL: the cells' evaluations run on the workers.
"""

from __future__ import annotations

import math
from typing import Any
from uuid import UUID

from django.urls import path, reverse
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from coevo.api.base import PAGE_PARAMETERS, ApiView, paginate, paginated, policy_version_named
from coevo.evaluations.ledger import BudgetLimits
from coevo.evaluations.stats.base import Interval
from coevo.matrices.models import CompatibilityMatrix, MatrixState
from coevo.matrices.selectors import (
    GridCell,
    matrix_get,
    matrix_grid,
    matrix_list,
    matrix_state,
)
from coevo.matrices.services import MAX_COLUMNS, MAX_ROWS, matrix_create
from coevo.projects.models import Role
from coevo.suites.models import Split
from coevo.suites.selectors import suite_get
from harness_store.selectors import candidate_get

SHA = r"^[0-9a-fA-F]{7,40}$"
MAX_SEED = 2**31 - 1
MAX_BUDGET = 2**62


def _finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


# --- serializers ------------------------------------------------------------------------------


# The splits a matrix may run (held-out is sealed); named in SPECTACULAR_SETTINGS' enums.
OPEN_SPLITS = [Split.SEARCH.value, Split.VALIDATION.value]


class MatrixBudgetIn(serializers.Serializer):
    rollouts = serializers.IntegerField(min_value=1, max_value=MAX_BUDGET, required=False)
    tokens = serializers.IntegerField(min_value=1, max_value=MAX_BUDGET, required=False)
    wall_s = serializers.IntegerField(min_value=1, max_value=MAX_BUDGET, required=False)


class MatrixCreateIn(serializers.Serializer):
    candidates = serializers.ListField(
        child=serializers.RegexField(SHA),
        min_length=1,
        max_length=MAX_ROWS,
        help_text="The rows: candidate SHAs (7+ hex digits), in order.",
    )
    policy_versions = serializers.ListField(
        child=serializers.CharField(max_length=100),
        min_length=1,
        max_length=MAX_COLUMNS,
        help_text="The columns: policy version names, in order.",
    )
    suite = serializers.SlugField(max_length=64, help_text="Suite name (latest version).")
    suite_version = serializers.CharField(max_length=32, required=False)
    # Held-out is sealed (DESIGN.md §8): not a choice here.
    split = serializers.ChoiceField(choices=OPEN_SPLITS)
    name = serializers.CharField(max_length=200, required=False, allow_blank=True)
    epochs = serializers.IntegerField(min_value=1, max_value=100, default=1)
    seed = serializers.IntegerField(min_value=0, max_value=MAX_SEED, default=0)
    task_limit = serializers.IntegerField(min_value=1, max_value=100_000, required=False)
    budget = MatrixBudgetIn(required=False)


class MatrixAcceptedOut(serializers.Serializer):
    id = serializers.UUIDField()
    state = serializers.ChoiceField(choices=MatrixState.choices)
    status_url = serializers.URLField()
    dashboard_url = serializers.URLField()


class MatrixOut(serializers.Serializer):
    id = serializers.UUIDField()
    name = serializers.CharField(allow_blank=True)
    state = serializers.ChoiceField(choices=MatrixState.choices)
    suite = serializers.CharField()
    suite_version = serializers.CharField()
    split = serializers.CharField()
    epochs = serializers.IntegerField()
    seed = serializers.IntegerField()
    task_limit = serializers.IntegerField(allow_null=True)
    created_at = serializers.DateTimeField()
    url = serializers.URLField()
    dashboard_url = serializers.URLField()


class IntervalOut(serializers.Serializer):
    low = serializers.FloatField()
    high = serializers.FloatField()


class MismatchOut(serializers.Serializer):
    best_policy_version = serializers.CharField(help_text="The row's best column.")
    best_evaluation = serializers.UUIDField()
    tuned_for = serializers.ListField(
        child=serializers.CharField(), help_text="Policy versions this harness is the best under."
    )
    difference = serializers.FloatField(allow_null=True, help_text="This cell − the best cell.")
    interval = IntervalOut(allow_null=True)
    p_value = serializers.FloatField()
    test = serializers.CharField()
    tasks = serializers.IntegerField(help_text="Tasks paired.")
    reason = serializers.CharField()
    comparison_url = serializers.URLField()


class CellOut(serializers.Serializer):
    policy_version = serializers.CharField()
    evaluation = serializers.UUIDField()
    evaluation_url = serializers.URLField()
    state = serializers.CharField()
    mean = serializers.FloatField(allow_null=True)
    interval = IntervalOut(allow_null=True)
    n = serializers.IntegerField(help_text="Tasks scored.")
    best_in_row = serializers.BooleanField()
    best_in_column = serializers.BooleanField()
    mismatch = MismatchOut(allow_null=True)


class RowOut(serializers.Serializer):
    candidate = serializers.CharField(help_text="SHA.")
    best_under = serializers.ListField(child=serializers.CharField())
    cells = CellOut(many=True)


class ColumnOut(serializers.Serializer):
    policy_version = serializers.CharField()
    best = serializers.ListField(child=serializers.CharField(), help_text="Best harness SHAs.")


class MatrixDetailOut(MatrixOut):
    confidence = serializers.FloatField()
    columns = ColumnOut(many=True)
    rows = RowOut(many=True)
    mismatches = serializers.IntegerField()


# --- views ------------------------------------------------------------------------------------


def _interval(interval: Interval | None) -> dict[str, float] | None:
    if interval is None or _finite(interval.low) is None or _finite(interval.high) is None:
        return None
    return {"low": float(interval.low), "high": float(interval.high)}


class MatrixViewMixin(ApiView):
    def links(self, matrix: CompatibilityMatrix) -> dict[str, str]:
        slug = self.project.slug
        return {
            "url": self.absolute("api:matrix", slug, matrix.id),
            "dashboard_url": self.absolute("web:matrix", slug, matrix.id),
        }

    def matrix_out(self, matrix: CompatibilityMatrix, state: str) -> dict[str, Any]:
        return {
            "id": str(matrix.id),
            "name": matrix.name,
            "state": state,
            "suite": matrix.suite.name,
            "suite_version": matrix.suite.version,
            "split": matrix.split,
            "epochs": matrix.epochs,
            "seed": matrix.seed,
            "task_limit": matrix.task_limit,
            "created_at": serializers.DateTimeField().to_representation(matrix.created_at),
            **self.links(matrix),
        }


class MatrixListView(MatrixViewMixin):
    required_scopes = {"POST": "evaluations:run"}
    required_roles = {"POST": Role.RESEARCHER}

    @extend_schema(
        operation_id="matrices_list", parameters=PAGE_PARAMETERS, responses=paginated(MatrixOut)
    )
    def get(self, request: Request, slug: str) -> Response:
        return paginate(
            self,
            matrix_list(project=self.project),
            lambda m: self.matrix_out(m, matrix_state(matrix=m)),
        )

    @extend_schema(
        operation_id="matrices_create",
        request=MatrixCreateIn,
        responses={202: MatrixAcceptedOut},
    )
    def post(self, request: Request, slug: str) -> Response:
        data = MatrixCreateIn(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        candidates = [candidate_get(project=self.project, sha=sha) for sha in values["candidates"]]
        policy_versions = [policy_version_named(name) for name in values["policy_versions"]]
        suite = suite_get(
            project=self.project, name=values["suite"], version=values.get("suite_version")
        )
        budget = values.get("budget") or {}
        matrix = matrix_create(
            project=self.project,
            candidates=candidates,
            policy_versions=policy_versions,
            suite=suite,
            split=values["split"],
            epochs=values["epochs"],
            seed=values["seed"],
            task_limit=values.get("task_limit"),
            name=values.get("name") or "",
            budget_limits=BudgetLimits(
                rollouts=budget.get("rollouts"),
                tokens=budget.get("tokens"),
                wall_s=budget.get("wall_s"),
            ),
            created_by=request.user,
        )
        links = self.links(matrix)
        body = {
            "id": str(matrix.id),
            "state": matrix_state(matrix=matrix),
            "status_url": links["url"],
            "dashboard_url": links["dashboard_url"],
        }
        return Response(body, status=202, headers={"Location": links["url"]})


class MatrixDetailView(MatrixViewMixin):
    @extend_schema(operation_id="matrices_retrieve", responses=MatrixDetailOut)
    def get(self, request: Request, slug: str, matrix_id: UUID) -> Response:
        matrix = matrix_get(project=self.project, matrix_id=matrix_id)
        grid = matrix_grid(matrix=matrix)
        names = {c.index: c.policy_version.name for c in grid.columns}
        shas = {r.index: r.candidate.sha for r in grid.rows}
        body = self.matrix_out(matrix, grid.state)
        body.update(
            confidence=grid.confidence,
            columns=[
                {"policy_version": c.policy_version.name, "best": [shas[r] for r in c.best_rows]}
                for c in grid.columns
            ],
            rows=[
                {
                    "candidate": r.candidate.sha,
                    "best_under": [names[k] for k in r.best_columns],
                    "cells": [self.cell_out(cell) for cell in r.cells],
                }
                for r in grid.rows
            ],
            mismatches=len(grid.mismatches),
        )
        return Response(body)

    def cell_out(self, cell: GridCell) -> dict[str, Any]:
        slug = self.project.slug
        mismatch = None
        if cell.mismatch is not None:
            m, c = cell.mismatch, cell.mismatch.comparison
            query = f"reference={m.best_evaluation.id}&candidate={cell.evaluation.id}"
            mismatch = {
                "best_policy_version": m.best_policy_version.name,
                "best_evaluation": str(m.best_evaluation.id),
                "tuned_for": [p.name for p in m.tuned_for],
                "difference": _finite(c.difference),
                "interval": _interval(c.interval),
                "p_value": float(c.p_value),
                "test": c.test,
                "tasks": c.tasks,
                "reason": m.reason,
                "comparison_url": self.request.build_absolute_uri(
                    f"{reverse('web:comparison', args=[slug])}?{query}"
                ),
            }
        return {
            "policy_version": cell.policy_version.name,
            "evaluation": str(cell.evaluation.id),
            "evaluation_url": self.absolute("api:evaluation", slug, cell.evaluation.id),
            "state": cell.state,
            "mean": _finite(cell.mean),
            "interval": _interval(cell.interval),
            "n": cell.n,
            "best_in_row": cell.best_in_row,
            "best_in_column": cell.best_in_column,
            "mismatch": mismatch,
        }


# Relative to projects/<slug:slug>/ (coevo/api/urls.py).
urlpatterns = [
    path("matrices/", MatrixListView.as_view(), name="matrices"),
    path("matrices/<uuid:matrix_id>/", MatrixDetailView.as_view(), name="matrix"),
]
