"""API: gates (see docs/api.md, Gates). Included under ``projects/<slug:slug>/``."""

from __future__ import annotations

from uuid import UUID

from django.db.models import QuerySet
from django.urls import path
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from coevo.api.base import PAGE_PARAMETERS, ApiView, paginate, paginated, policy_version_named
from coevo.gates.models import Gate, GateState, Verdict
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


class GateCreatedOut(serializers.Serializer):
    id = serializers.UUIDField()
    state = serializers.ChoiceField(choices=GateState.choices)
    status_url = serializers.URLField()
    dashboard_url = serializers.URLField()


class ReasonOut(serializers.Serializer):
    rule = serializers.CharField()
    outcome = serializers.ChoiceField(choices=Verdict.choices)
    message = serializers.CharField()


class GateEvaluationOut(serializers.Serializer):
    id = serializers.UUIDField()
    state = serializers.CharField()
    dashboard_url = serializers.URLField()


class GateEvaluationsOut(serializers.Serializer):
    candidate = GateEvaluationOut()
    baseline = GateEvaluationOut()
    comparison_url = serializers.URLField(help_text="The paired comparison page.")


class GateOut(serializers.Serializer):
    id = serializers.UUIDField()
    state = serializers.ChoiceField(choices=GateState.choices)
    state_detail = serializers.CharField()
    verdict = serializers.ChoiceField(choices=Verdict.choices, allow_null=True)
    reasons = ReasonOut(many=True)
    statistics = serializers.DictField(
        help_text="{confidence, candidate: summary, baseline: summary, comparison, errors}"
    )
    policy = serializers.DictField()
    candidate = serializers.CharField()
    baseline = serializers.CharField()
    against = serializers.CharField()
    suite = serializers.CharField()
    split = serializers.CharField()
    policy_version = serializers.CharField()
    epochs = serializers.IntegerField()
    seed = serializers.IntegerField()
    evaluations = GateEvaluationsOut()
    created_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)
    url = serializers.URLField()
    dashboard_url = serializers.URLField()


def gate_out(view: ApiView, gate: Gate) -> dict:
    slug = view.project.slug
    when = serializers.DateTimeField().to_representation

    def evaluation(evaluation_id: UUID, state: str) -> dict:
        return {
            "id": str(evaluation_id),
            "state": state,
            "dashboard_url": view.absolute("web:evaluation", slug, evaluation_id),
        }

    return {
        "id": str(gate.id),
        "state": gate.state,
        "state_detail": gate.state_detail,
        "verdict": gate.verdict or None,
        "reasons": list(gate.reasons),
        "statistics": dict(gate.statistics),
        "policy": dict(gate.policy),
        "candidate": gate.candidate.sha,
        "baseline": gate.baseline.sha,
        "against": gate.against,
        "suite": f"{gate.suite.name}@{gate.suite.version}",
        "split": gate.split,
        "policy_version": gate.policy_version.name,
        "epochs": gate.epochs,
        "seed": gate.seed,
        "evaluations": {
            "candidate": evaluation(gate.candidate_evaluation_id, gate.candidate_evaluation.state),
            "baseline": evaluation(gate.baseline_evaluation_id, gate.baseline_evaluation.state),
            "comparison_url": view.absolute(
                "web:comparison",
                slug,
                query=f"reference={gate.baseline_evaluation_id}"
                f"&candidate={gate.candidate_evaluation_id}",
            ),
        },
        "created_at": when(gate.created_at),
        "finished_at": when(gate.finished_at) if gate.finished_at else None,
        "url": view.absolute("api:gate", slug, gate.id),
        "dashboard_url": view.absolute("web:gate", slug, gate.id),
    }


def _gates(view: ApiView) -> QuerySet[Gate]:
    return gate_list(project=view.project).select_related(
        "candidate_evaluation", "baseline_evaluation"
    )


class GateListView(ApiView):
    required_scopes = {"POST": "evaluations:run"}
    required_roles = {"POST": Role.RESEARCHER}

    @extend_schema(
        operation_id="gates_list", parameters=PAGE_PARAMETERS, responses=paginated(GateOut)
    )
    def get(self, request: Request, slug: str) -> Response:
        return paginate(self, _gates(self), lambda gate: gate_out(self, gate))

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
            created_by=request.user,
        )
        status_url = self.absolute("api:gate", self.project.slug, gate.id)
        body = {
            "id": str(gate.id),
            "state": gate.state,
            "status_url": status_url,
            "dashboard_url": self.absolute("web:gate", self.project.slug, gate.id),
        }
        return Response(body, status=202, headers={"Location": status_url})


class GateDetailView(ApiView):
    @extend_schema(operation_id="gates_retrieve", responses=GateOut)
    def get(self, request: Request, slug: str, gate_id: UUID) -> Response:
        gate = gate_get(project=self.project, gate_id=gate_id)
        return Response(gate_out(self, gate))


# Relative to projects/<slug:slug>/ (coevo/api/urls.py).
urlpatterns = [
    path("gates/", GateListView.as_view(), name="gates"),
    path("gates/<uuid:gate_id>/", GateDetailView.as_view(), name="gate"),
]
