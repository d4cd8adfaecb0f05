"""API: compatibility matrices (see docs/api.md, Compatibility matrices). Included under
``projects/<slug:slug>/``.

Creating a matrix needs the ``evaluations:run`` scope and the researcher role and answers
``202`` with its status URL: the cells' evaluations run on the workers.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.urls import path
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from coevo.api.base import PAGE_PARAMETERS, ApiView, paginate, paginated, policy_version_named
from coevo.api.fields import FiniteFloatField, MethodField, OutSerializer, finite
from coevo.evaluations.ledger import BudgetLimits
from coevo.evaluations.stats.base import Interval
from coevo.matrices.models import CompatibilityMatrix, MatrixState
from coevo.matrices.selectors import (
    GridCell,
    GridColumn,
    GridRow,
    matrix_get,
    matrix_grid,
    matrix_list,
    matrix_listed_state,
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
    # Held-out is sealed (docs/architecture.md, "The held-out seal"): not a choice here.
    split = serializers.ChoiceField(choices=OPEN_SPLITS)
    name = serializers.CharField(max_length=200, required=False, allow_blank=True)
    epochs = serializers.IntegerField(min_value=1, max_value=100, default=1)
    seed = serializers.IntegerField(min_value=0, max_value=MAX_SEED, default=0)
    task_limit = serializers.IntegerField(min_value=1, max_value=100_000, required=False)
    budget = MatrixBudgetIn(required=False)


class MatrixAcceptedOut(OutSerializer):
    id = serializers.UUIDField()
    state = MethodField(serializers.ChoiceField(choices=MatrixState.choices))
    status_url = MethodField(serializers.URLField())
    dashboard_url = MethodField(serializers.URLField())

    def get_state(self, matrix: CompatibilityMatrix) -> str:
        return matrix_state(matrix=matrix)

    def get_status_url(self, matrix: CompatibilityMatrix) -> str:
        return self.view.absolute("api:matrix", self.view.project.slug, matrix.id)

    def get_dashboard_url(self, matrix: CompatibilityMatrix) -> str:
        return self.view.absolute("web:matrix", self.view.project.slug, matrix.id)


class MatrixOut(OutSerializer):
    id = serializers.UUIDField()
    name = serializers.CharField(allow_blank=True)
    state = MethodField(serializers.ChoiceField(choices=MatrixState.choices))
    suite = serializers.CharField(source="suite.name")
    suite_version = serializers.CharField(source="suite.version")
    split = serializers.CharField()
    epochs = serializers.IntegerField()
    seed = serializers.IntegerField()
    task_limit = serializers.IntegerField(allow_null=True)
    created_at = serializers.DateTimeField()
    url = MethodField(serializers.URLField())
    dashboard_url = MethodField(serializers.URLField())

    def get_state(self, matrix: CompatibilityMatrix) -> str:
        # The detail reads its grid once; a list computes each matrix's state.
        grid = self.context.get("grid")
        return grid.state if grid is not None else matrix_listed_state(matrix=matrix)

    def get_url(self, matrix: CompatibilityMatrix) -> str:
        return self.view.absolute("api:matrix", self.view.project.slug, matrix.id)

    def get_dashboard_url(self, matrix: CompatibilityMatrix) -> str:
        return self.view.absolute("web:matrix", self.view.project.slug, matrix.id)


class IntervalOut(serializers.Serializer):
    low = serializers.FloatField()
    high = serializers.FloatField()


def _interval(interval: Interval | None) -> dict[str, float] | None:
    if interval is None or finite(interval.low) is None or finite(interval.high) is None:
        return None
    return IntervalOut(interval).data


# Of a grid cell with a mismatch (coevo.matrices.selectors.Mismatch).
class MismatchOut(OutSerializer):
    best_policy_version = serializers.CharField(
        source="mismatch.best_policy_version.name", help_text="The row's best column."
    )
    best_evaluation = serializers.UUIDField(source="mismatch.best_evaluation.id")
    tuned_for = MethodField(
        serializers.ListField(
            child=serializers.CharField(),
            help_text="Policy versions this harness is the best under.",
        )
    )
    difference = FiniteFloatField(
        source="mismatch.comparison.difference",
        allow_null=True,
        help_text="This cell − the best cell.",
    )
    interval = MethodField(IntervalOut(allow_null=True))
    p_value = serializers.FloatField(source="mismatch.comparison.p_value")
    test = serializers.CharField(source="mismatch.comparison.test")
    tasks = serializers.IntegerField(source="mismatch.comparison.tasks", help_text="Tasks paired.")
    reason = serializers.CharField(source="mismatch.reason")
    comparison_url = MethodField(serializers.URLField())

    def get_tuned_for(self, cell: GridCell) -> list[str]:
        return [policy_version.name for policy_version in cell.mismatch.tuned_for]

    def get_interval(self, cell: GridCell) -> dict[str, float] | None:
        return _interval(cell.mismatch.comparison.interval)

    def get_comparison_url(self, cell: GridCell) -> str:
        return self.view.absolute(
            "web:comparison",
            self.view.project.slug,
            query=f"reference={cell.mismatch.best_evaluation.id}&candidate={cell.evaluation.id}",
        )


class CellOut(OutSerializer):
    policy_version = serializers.CharField(source="policy_version.name")
    evaluation = serializers.UUIDField(source="evaluation.id")
    evaluation_url = MethodField(serializers.URLField())
    state = serializers.CharField()
    mean = FiniteFloatField(allow_null=True)
    interval = MethodField(IntervalOut(allow_null=True))
    n = serializers.IntegerField(help_text="Tasks scored.")
    best_in_row = serializers.BooleanField()
    best_in_column = serializers.BooleanField()
    mismatch = MethodField(MismatchOut(allow_null=True))

    def get_evaluation_url(self, cell: GridCell) -> str:
        return self.view.absolute("api:evaluation", self.view.project.slug, cell.evaluation.id)

    def get_interval(self, cell: GridCell) -> dict[str, float] | None:
        return _interval(cell.interval)

    def get_mismatch(self, cell: GridCell) -> dict[str, Any] | None:
        if cell.mismatch is None:
            return None
        return MismatchOut(cell, context=self.context).data


# Context: grid (matrix_grid), for the names of the best columns.
class RowOut(serializers.Serializer):
    candidate = serializers.CharField(source="candidate.sha", help_text="SHA.")
    best_under = MethodField(serializers.ListField(child=serializers.CharField()))
    cells = CellOut(many=True)

    def get_best_under(self, row: GridRow) -> list[str]:
        names = {c.index: c.policy_version.name for c in self.context["grid"].columns}
        return [names[k] for k in row.best_columns]


# Context: grid (matrix_grid), for the SHAs of the best rows.
class ColumnOut(serializers.Serializer):
    policy_version = serializers.CharField(source="policy_version.name")
    best = MethodField(
        serializers.ListField(child=serializers.CharField(), help_text="Best harness SHAs.")
    )

    def get_best(self, column: GridColumn) -> list[str]:
        shas = {r.index: r.candidate.sha for r in self.context["grid"].rows}
        return [shas[r] for r in column.best_rows]


# Context: grid (matrix_grid).
class MatrixDetailOut(MatrixOut):
    confidence = MethodField(serializers.FloatField())
    columns = MethodField(ColumnOut(many=True))
    rows = MethodField(RowOut(many=True))
    mismatches = MethodField(serializers.IntegerField())

    def get_confidence(self, matrix: CompatibilityMatrix) -> float:
        return self.context["grid"].confidence

    def get_columns(self, matrix: CompatibilityMatrix) -> list[dict[str, Any]]:
        return ColumnOut(self.context["grid"].columns, many=True, context=self.context).data

    def get_rows(self, matrix: CompatibilityMatrix) -> list[dict[str, Any]]:
        return RowOut(self.context["grid"].rows, many=True, context=self.context).data

    def get_mismatches(self, matrix: CompatibilityMatrix) -> int:
        return len(self.context["grid"].mismatches)


# --- views ------------------------------------------------------------------------------------


class MatrixListView(ApiView):
    required_scopes = {"POST": "evaluations:run"}
    enqueues = frozenset({"POST"})
    required_roles = {"POST": Role.RESEARCHER}

    @extend_schema(
        operation_id="matrices_list", parameters=PAGE_PARAMETERS, responses=paginated(MatrixOut)
    )
    def get(self, request: Request, slug: str) -> Response:
        return paginate(self, matrix_list(project=self.project), MatrixOut)

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
        body = self.out(MatrixAcceptedOut, matrix)
        return Response(body, status=202, headers={"Location": body["status_url"]})


class MatrixDetailView(ApiView):
    @extend_schema(operation_id="matrices_retrieve", responses=MatrixDetailOut)
    def get(self, request: Request, slug: str, matrix_id: UUID) -> Response:
        matrix = matrix_get(project=self.project, matrix_id=matrix_id)
        body = self.out(MatrixDetailOut, matrix, grid=matrix_grid(matrix=matrix))
        return Response(body)


# Relative to projects/<slug:slug>/ (coevo/api/urls.py).
urlpatterns = [
    path("matrices/", MatrixListView.as_view(), name="matrices"),
    path("matrices/<uuid:matrix_id>/", MatrixDetailView.as_view(), name="matrix"),
]
