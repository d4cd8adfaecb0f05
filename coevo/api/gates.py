"""API: gates (see docs/api.md, Gates). Included under ``projects/<slug:slug>/``."""

from __future__ import annotations

from decimal import Decimal
from uuid import UUID

from django.db.models import QuerySet
from django.urls import path
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from coevo.api.base import PAGE_PARAMETERS, ApiView, paginate, paginated, policy_version_named
from coevo.api.fields import MethodField, OutSerializer
from coevo.evaluations.models import Evaluation
from coevo.gates.models import Gate, GateState, GateVerdict
from coevo.gates.selectors import gate_get, gate_list
from coevo.gates.services import gate_create
from coevo.projects.models import Role
from coevo.suites.models import Split
from coevo.suites.selectors import suite_get
from harness_store.selectors import candidate_get


class GateIn(serializers.Serializer):
    candidate = serializers.RegexField(r"^[0-9a-fA-F]{7,40}$", help_text="The candidate's SHA.")
    against = serializers.CharField(
        max_length=100, help_text="The baseline: a channel name (e.g. production) or a SHA."
    )
    suite = serializers.CharField(max_length=64, help_text="Suite name (its latest version).")
    split = serializers.ChoiceField(choices=Split.choices, default=Split.VALIDATION)
    policy_version = serializers.CharField(
        max_length=100,
        required=False,
        help_text="Policy version name (default: the channel's, else the configured one).",
    )
    epochs = serializers.IntegerField(min_value=1, max_value=100, default=1)
    seed = serializers.IntegerField(min_value=0, max_value=2**31 - 1, default=0)
    min_score = serializers.FloatField(required=False, allow_null=True)
    max_regression = serializers.FloatField(required=False, allow_null=True)
    confidence = serializers.FloatField(default=0.95)
    critical_tasks = serializers.ListField(
        child=serializers.CharField(max_length=200), max_length=1000, default=list
    )
    max_error_rate = serializers.FloatField(required=False, allow_null=True)
    budget_usd = serializers.DecimalField(
        max_digits=18,
        decimal_places=6,
        min_value=Decimal("0.000001"),
        required=False,
        help_text="US dollars both evaluations may spend together: refused (409) when their "
        "worst case (every token the manifest allows, at the endpoints' prices) exceeds it.",
    )


class GateCreatedOut(OutSerializer):
    id = serializers.UUIDField()
    state = serializers.ChoiceField(choices=GateState.choices)
    status_url = MethodField(serializers.URLField())
    dashboard_url = MethodField(serializers.URLField())

    def get_status_url(self, gate: Gate) -> str:
        return self.view.absolute("api:gate", self.view.project.slug, gate.id)

    def get_dashboard_url(self, gate: Gate) -> str:
        return self.view.absolute("web:gate", self.view.project.slug, gate.id)


class ReasonOut(serializers.Serializer):
    rule = serializers.CharField()
    outcome = serializers.ChoiceField(choices=GateVerdict.choices)
    message = serializers.CharField()


class GateEvaluationOut(OutSerializer):
    id = serializers.UUIDField()
    state = serializers.CharField()
    dashboard_url = MethodField(serializers.URLField())

    def get_dashboard_url(self, evaluation: Evaluation) -> str:
        return self.view.absolute("web:evaluation", self.view.project.slug, evaluation.id)


class GateEvaluationsOut(OutSerializer):
    candidate = GateEvaluationOut(source="candidate_evaluation")
    baseline = GateEvaluationOut(source="baseline_evaluation")
    comparison_url = MethodField(serializers.URLField(help_text="The paired comparison page."))

    def get_comparison_url(self, gate: Gate) -> str:
        return self.view.absolute(
            "web:comparison",
            self.view.project.slug,
            query=f"reference={gate.baseline_evaluation_id}"
            f"&candidate={gate.candidate_evaluation_id}",
        )


class GateOut(OutSerializer):
    id = serializers.UUIDField()
    state = serializers.ChoiceField(choices=GateState.choices)
    state_detail = serializers.CharField()
    verdict = MethodField(serializers.ChoiceField(choices=GateVerdict.choices, allow_null=True))
    # As stored: one per declared rule (coevo.gates.verdict).
    reasons = MethodField(ReasonOut(many=True))
    statistics = serializers.DictField(
        help_text="{confidence, candidate: summary, baseline: summary, comparison, errors}"
    )
    policy = serializers.DictField()
    candidate = serializers.CharField(source="candidate.sha")
    baseline = serializers.CharField(source="baseline.sha")
    against = serializers.CharField()
    suite = MethodField(serializers.CharField())
    split = serializers.CharField()
    policy_version = serializers.CharField(source="policy_version.name")
    epochs = serializers.IntegerField()
    seed = serializers.IntegerField()
    evaluations = GateEvaluationsOut(source="*")
    created_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)
    url = MethodField(serializers.URLField())
    dashboard_url = MethodField(serializers.URLField())

    def get_verdict(self, gate: Gate) -> str | None:
        return gate.verdict or None  # blank until the gate decides

    def get_reasons(self, gate: Gate) -> list[dict]:
        return list(gate.reasons)

    def get_suite(self, gate: Gate) -> str:
        return f"{gate.suite.name}@{gate.suite.version}"

    def get_url(self, gate: Gate) -> str:
        return self.view.absolute("api:gate", self.view.project.slug, gate.id)

    def get_dashboard_url(self, gate: Gate) -> str:
        return self.view.absolute("web:gate", self.view.project.slug, gate.id)


def _gates(view: ApiView) -> QuerySet[Gate]:
    return gate_list(project=view.project).select_related(
        "candidate_evaluation", "baseline_evaluation"
    )


class GateListView(ApiView):
    required_scopes = {"POST": "evaluations:run"}
    enqueues = frozenset({"POST"})
    required_roles = {"POST": Role.RESEARCHER}

    @extend_schema(
        operation_id="gates_list", parameters=PAGE_PARAMETERS, responses=paginated(GateOut)
    )
    def get(self, request: Request, slug: str) -> Response:
        return paginate(self, _gates(self), GateOut)

    @extend_schema(operation_id="gates_create", request=GateIn, responses={202: GateCreatedOut})
    def post(self, request: Request, slug: str) -> Response:
        data = GateIn(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        policy_version = policy_version_named(values.get("policy_version"))
        gate = gate_create(
            project=self.project,
            candidate=candidate_get(project=self.project, sha=values["candidate"]),
            against=values["against"],
            suite=suite_get(project=self.project, name=values["suite"]),
            split=values["split"],
            policy_version=policy_version,
            epochs=values["epochs"],
            seed=values["seed"],
            min_score=values.get("min_score"),
            max_regression=values.get("max_regression"),
            confidence=values["confidence"],
            critical_tasks=values["critical_tasks"],
            max_error_rate=values.get("max_error_rate"),
            budget_usd=values.get("budget_usd"),
            created_by=request.user,
        )
        body = self.out(GateCreatedOut, gate)
        return Response(body, status=202, headers={"Location": body["status_url"]})


class GateDetailView(ApiView):
    @extend_schema(operation_id="gates_retrieve", responses=GateOut)
    def get(self, request: Request, slug: str, gate_id: UUID) -> Response:
        gate = gate_get(project=self.project, gate_id=gate_id)
        return Response(self.out(GateOut, gate))


# Relative to projects/<slug:slug>/ (coevo/api/urls.py).
urlpatterns = [
    path("gates/", GateListView.as_view(), name="gates"),
    path("gates/<uuid:gate_id>/", GateDetailView.as_view(), name="gate"),
]
