"""API: evaluations and comparisons (see docs/api.md)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any
from uuid import UUID

from django.urls import path
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from coevo.api.base import PAGE_PARAMETERS, ApiView, paginate, paginated, policy_version_named
from coevo.api.fields import FiniteFloatField, MethodField, OutSerializer, finite
from coevo.errors import NotFound, PermissionDenied
from coevo.evaluations.ledger import BudgetLimits
from coevo.evaluations.lifecycle import evaluation_cancel
from coevo.evaluations.models import (
    Evaluation,
    EvaluationState,
    RolloutState,
)
from coevo.evaluations.selectors import (
    evaluation_compare,
    evaluation_get,
    evaluation_list,
    evaluation_progress,
    evaluation_statistics,
    rollout_list,
)
from coevo.evaluations.services import evaluation_create
from coevo.policies.services import policy_version_get_default
from coevo.projects.models import Role
from coevo.suites.models import Split
from coevo.suites.selectors import suite_get
from harness_store.selectors import candidate_get
from workers.outcomes import RolloutOutcome

MAX_SEED = 2**31 - 1


# --- serializers ------------------------------------------------------------------------------


class EvaluationStartIn(serializers.Serializer):
    candidate = serializers.RegexField(r"^[0-9a-fA-F]{7,40}$", help_text="Candidate SHA.")
    suite = serializers.SlugField(max_length=64, help_text="Suite name (latest version).")
    suite_version = serializers.CharField(max_length=32, required=False)
    split = serializers.ChoiceField(choices=[Split.SEARCH.value, Split.VALIDATION.value])
    policy_version = serializers.CharField(
        max_length=100, required=False, help_text="Policy version name or id (default policy)."
    )
    epochs = serializers.IntegerField(min_value=1, max_value=100, default=1)
    task_limit = serializers.IntegerField(min_value=1, max_value=100_000, required=False)
    seed = serializers.IntegerField(min_value=0, max_value=MAX_SEED, default=0)
    knobs = serializers.DictField(required=False)
    budget_usd = serializers.DecimalField(
        max_digits=18,
        decimal_places=6,
        min_value=Decimal("0.000001"),
        required=False,
        help_text="US dollars it may spend: refused (409) when its worst case (every token the "
        "manifest allows, at the endpoints' prices) exceeds it.",
    )

    def to_internal_value(self, data: Any) -> Any:
        # Refused before validation of the split's choices: held-out is sealed (403, not 400).
        if isinstance(data, dict) and data.get("split") in ("heldout", "held-out"):
            raise PermissionDenied(
                "Held-out evaluations run only inside a promotion request, never from the API."
            )
        return super().to_internal_value(data)


class AcceptedOut(OutSerializer):
    id = serializers.UUIDField()
    state = serializers.ChoiceField(choices=EvaluationState.choices)
    status_url = MethodField(serializers.URLField())
    dashboard_url = MethodField(serializers.URLField())

    def get_status_url(self, evaluation: Evaluation) -> str:
        return self.view.absolute("api:evaluation", self.view.project.slug, evaluation.id)

    def get_dashboard_url(self, evaluation: Evaluation) -> str:
        return self.view.absolute("web:evaluation", self.view.project.slug, evaluation.id)


# Of evaluation_progress's figures.
class ProgressOut(serializers.Serializer):
    total = serializers.IntegerField()
    done = serializers.IntegerField()
    running = serializers.IntegerField()
    pending = serializers.IntegerField()
    cancelled = serializers.IntegerField()
    passed = serializers.IntegerField()
    failed = MethodField(serializers.IntegerField(help_text="Done and not passed (any outcome)."))

    def get_failed(self, progress: Any) -> int:
        return progress.done - progress.passed


# Of evaluation_statistics's figures.
class SummaryOut(serializers.Serializer):
    method = serializers.CharField(source="mean.method")
    mean = FiniteFloatField(source="mean.mean", allow_null=True)
    ci_low = FiniteFloatField(source="mean.interval.low", allow_null=True)
    ci_high = FiniteFloatField(source="mean.interval.high", allow_null=True)
    confidence = serializers.FloatField(source="mean.confidence")
    n_tasks = serializers.IntegerField(source="tasks")
    pass_at_k = MethodField(
        serializers.DictField(child=serializers.FloatField(), help_text="k -> pass@k")
    )

    def get_pass_at_k(self, statistics: Any) -> dict[str, float]:
        return {str(k): v for k, v in statistics.pass_at_k.items() if finite(v) is not None}


# Of evaluation_progress's figures.
class ErrorsOut(serializers.Serializer):
    harness_error = serializers.IntegerField(source="harness_errors")
    infra_error = serializers.IntegerField(source="infra_errors")


class EvaluationOut(OutSerializer):
    id = serializers.UUIDField()
    candidate = serializers.CharField(source="candidate.sha", help_text="Candidate SHA.")
    suite = serializers.CharField(source="suite.name")
    suite_version = serializers.CharField(source="suite.version")
    split = serializers.ChoiceField(choices=Split.choices)
    policy_version = serializers.CharField(source="policy_version.name")
    epochs = serializers.IntegerField()
    state = serializers.ChoiceField(choices=EvaluationState.choices)
    stop_reason = serializers.CharField()
    created_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)
    url = MethodField(serializers.URLField())
    dashboard_url = MethodField(serializers.URLField())

    def get_url(self, evaluation: Evaluation) -> str:
        return self.view.absolute("api:evaluation", self.view.project.slug, evaluation.id)

    def get_dashboard_url(self, evaluation: Evaluation) -> str:
        return self.view.absolute("web:evaluation", self.view.project.slug, evaluation.id)


# Context: progress and statistics, the evaluation's figures (read once for the three parts).
class EvaluationDetailOut(EvaluationOut):
    progress = MethodField(ProgressOut())
    summary = MethodField(SummaryOut())
    errors = MethodField(ErrorsOut())
    cost_usd = MethodField(
        serializers.DecimalField(
            max_digits=24,
            decimal_places=12,
            allow_null=True,
            help_text="US dollars of its rollouts' model calls, each at the price that applied "
            "(decimal string); null where its endpoints have no price.",
        )
    )

    def get_cost_usd(self, evaluation: Evaluation) -> str | None:
        cost = self.context["progress"].cost_usd
        return None if cost is None else format(cost.normalize(), "f")

    def get_progress(self, evaluation: Evaluation) -> dict[str, Any]:
        return ProgressOut(self.context["progress"]).data

    def get_summary(self, evaluation: Evaluation) -> dict[str, Any]:
        return SummaryOut(self.context["statistics"]).data

    def get_errors(self, evaluation: Evaluation) -> dict[str, Any]:
        return ErrorsOut(self.context["progress"]).data


class EvaluationFilterIn(serializers.Serializer):
    candidate = serializers.RegexField(r"^[0-9a-fA-F]{4,40}$", required=False)
    suite = serializers.SlugField(max_length=64, required=False)
    state = serializers.ChoiceField(choices=EvaluationState.choices, required=False)


class TaskResultOut(serializers.Serializer):
    task = serializers.CharField()
    epochs = serializers.IntegerField()
    passed = serializers.IntegerField()
    mean_score = serializers.FloatField(allow_null=True)
    outcomes = serializers.ListField(
        child=serializers.CharField(), help_text="Per epoch: the outcome, or the state if open."
    )


class ComparisonIn(serializers.Serializer):
    reference = serializers.UUIDField()
    candidate = serializers.UUIDField()


class FlipsOut(serializers.Serializer):
    fixed = serializers.ListField(child=serializers.CharField(), source="improved")
    broken = serializers.ListField(child=serializers.CharField(), source="regressed")


# Of evaluation_compare's statistics; context: the reference and candidate evaluations.
class ComparisonOut(OutSerializer):
    kind = serializers.ChoiceField(choices=["binary", "graded"])
    n_tasks = serializers.IntegerField(source="tasks")
    reference_mean = FiniteFloatField(allow_null=True)
    candidate_mean = FiniteFloatField(allow_null=True)
    delta = FiniteFloatField(source="difference", allow_null=True)
    ci_low = FiniteFloatField(source="interval.low", allow_null=True)
    ci_high = FiniteFloatField(source="interval.high", allow_null=True)
    confidence = serializers.FloatField()
    p_value = FiniteFloatField(allow_null=True)
    test = serializers.CharField()
    significant = serializers.BooleanField()
    verdict = serializers.CharField()
    # Graded results (k epochs, fractional scores): improved / regressed tasks.
    flips = FlipsOut(source="*")
    dashboard_url = MethodField(serializers.URLField())

    def get_dashboard_url(self, statistics: Any) -> str:
        reference, candidate = self.context["reference"], self.context["candidate"]
        return self.view.absolute(
            "web:comparison",
            self.view.project.slug,
            query=f"reference={reference.id}&candidate={candidate.id}",
        )


# --- helpers ----------------------------------------------------------------------------------


class EvaluationViewMixin(ApiView):
    def evaluation(self, evaluation_id: Any) -> Evaluation:
        try:
            return evaluation_get(
                project=self.project, evaluation_id=evaluation_id, audience=self.audience()
            )
        except NotFound:
            # Sealed: not even its existence is shown to a non-reviewer (the same answer as
            # for an id that names nothing).
            raise NotFound(
                f"No evaluation {evaluation_id} in project {self.project.slug}."
            ) from None


# --- views ------------------------------------------------------------------------------------


class EvaluationListView(EvaluationViewMixin):
    required_scopes = {"POST": "evaluations:run"}
    enqueues = frozenset({"POST"})
    required_roles = {"POST": Role.RESEARCHER}

    @extend_schema(
        operation_id="evaluations_list",
        parameters=[EvaluationFilterIn, *PAGE_PARAMETERS],
        responses=paginated(EvaluationOut),
    )
    def get(self, request: Request, slug: str) -> Response:
        values = self.query(EvaluationFilterIn)
        evaluations = evaluation_list(project=self.project, audience=self.audience())
        evaluations = evaluations.select_related("policy_version")
        if values.get("candidate"):
            evaluations = evaluations.filter(candidate__sha__startswith=values["candidate"].lower())
        if values.get("suite"):
            evaluations = evaluations.filter(suite__name=values["suite"])
        if values.get("state"):
            evaluations = evaluations.filter(state=values["state"])
        return paginate(self, evaluations, EvaluationOut)

    @extend_schema(
        operation_id="evaluations_start",
        request=EvaluationStartIn,
        responses={202: AcceptedOut},
    )
    def post(self, request: Request, slug: str) -> Response:
        data = EvaluationStartIn(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        evaluation = evaluation_create(
            candidate=candidate_get(project=self.project, sha=values["candidate"]),
            suite=suite_get(
                project=self.project, name=values["suite"], version=values.get("suite_version")
            ),
            split=values["split"],
            policy_version=(
                policy_version_named(values.get("policy_version")) or policy_version_get_default()
            ),
            epochs=values["epochs"],
            task_limit=values.get("task_limit"),
            seed=values["seed"],
            knobs=values.get("knobs") or {},
            budget_limits=BudgetLimits(usd=values.get("budget_usd")),
            created_by=request.user,
        )
        body = self.out(AcceptedOut, evaluation)
        return Response(body, status=202, headers={"Location": body["status_url"]})


class EvaluationDetailView(EvaluationViewMixin):
    @extend_schema(operation_id="evaluations_retrieve", responses=EvaluationDetailOut)
    def get(self, request: Request, slug: str, evaluation_id: UUID) -> Response:
        evaluation = self.evaluation(evaluation_id)
        body = self.out(
            EvaluationDetailOut,
            evaluation,
            progress=evaluation_progress(evaluation=evaluation),
            statistics=evaluation_statistics(evaluation=evaluation),
        )
        return Response(body)


class EvaluationTasksView(EvaluationViewMixin):
    @extend_schema(operation_id="evaluations_tasks", responses=TaskResultOut(many=True))
    def get(self, request: Request, slug: str, evaluation_id: UUID) -> Response:
        evaluation = self.evaluation(evaluation_id)
        rows: dict[str, dict[str, Any]] = {}
        # Four columns, not whole rollouts and tasks (5,000 rollouts: 1.2 s, of it 71 ms SQL).
        fields = ("task__key", "state", "outcome", "score")
        for key, state, outcome, score in rollout_list(evaluation=evaluation).values_list(*fields):
            row = rows.setdefault(
                key, {"task": key, "epochs": 0, "passed": 0, "scores": [], "outcomes": []}
            )
            row["epochs"] += 1
            done = state == RolloutState.DONE
            row["outcomes"].append(outcome if done else state)
            if done and outcome == RolloutOutcome.PASSED:
                row["passed"] += 1
            if done and outcome != RolloutOutcome.INFRA_ERROR:
                # As the statistics count it: harness errors score 0, infra errors not at all.
                if score is None:
                    score = 1.0 if outcome == RolloutOutcome.PASSED else 0.0
                row["scores"].append(float(score))
        results = [
            {
                "task": row["task"],
                "epochs": row["epochs"],
                "passed": row["passed"],
                "mean_score": sum(row["scores"]) / len(row["scores"]) if row["scores"] else None,
                "outcomes": row["outcomes"],
            }
            for row in rows.values()
        ]
        return Response(self.out(TaskResultOut, results, many=True))


class EvaluationCancelView(EvaluationViewMixin):
    required_scopes = {"POST": "evaluations:run"}
    required_roles = {"POST": Role.RESEARCHER}

    @extend_schema(operation_id="evaluations_cancel", request=None, responses={202: AcceptedOut})
    def post(self, request: Request, slug: str, evaluation_id: UUID) -> Response:
        evaluation = self.evaluation(evaluation_id)
        evaluation_cancel(
            evaluation=evaluation, reason=f"cancelled through the API by {request.user}"
        )
        body = self.out(AcceptedOut, evaluation)
        return Response(body, status=202, headers={"Location": body["status_url"]})


class ComparisonView(EvaluationViewMixin):
    @extend_schema(
        operation_id="comparisons_retrieve",
        parameters=[
            OpenApiParameter("reference", UUID, required=True, description="Evaluation id."),
            OpenApiParameter("candidate", UUID, required=True, description="Evaluation id."),
        ],
        responses=ComparisonOut,
    )
    def get(self, request: Request, slug: str) -> Response:
        query = self.query(ComparisonIn)
        reference = self.evaluation(query["reference"])
        candidate = self.evaluation(query["candidate"])
        statistics = evaluation_compare(reference=reference, candidate=candidate).statistics
        return Response(
            self.out(ComparisonOut, statistics, reference=reference, candidate=candidate)
        )


_E = "projects/<slug:slug>/evaluations/"
urlpatterns = [
    path(_E, EvaluationListView.as_view(), name="evaluations"),
    path(f"{_E}<uuid:evaluation_id>/", EvaluationDetailView.as_view(), name="evaluation"),
    path(
        f"{_E}<uuid:evaluation_id>/tasks/",
        EvaluationTasksView.as_view(),
        name="evaluation_tasks",
    ),
    path(
        f"{_E}<uuid:evaluation_id>/cancel/",
        EvaluationCancelView.as_view(),
        name="evaluation_cancel",
    ),
    path("projects/<slug:slug>/comparisons/", ComparisonView.as_view(), name="comparisons"),
]
