"""API: trainers and training runs (see docs/api.md, Training).

Runs are included under ``projects/<slug:slug>/``; reading needs ``read`` (any member),
cancelling the ``campaigns:run`` scope and the researcher role (policy steps are campaign
work). Trainers are listed to project members (and staff) without their command or
environment, and a run never shows its argv: those are the operator's (they run outside any
sandbox, and the command and environment may hold internal hosts, paths or secrets).
"""

from __future__ import annotations

from uuid import UUID

from django.urls import path
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from coevo.api.base import PAGE_PARAMETERS, ApiView, paginate, paginated
from coevo.api.fields import MethodField, OutSerializer
from coevo.projects.models import Role
from coevo.training.models import TrainingRun, TrainingState
from coevo.training.selectors import (
    trainer_list_for_user,
    training_run_get,
    training_run_list,
    training_run_log_tail_for,
)
from coevo.training.services import training_run_cancel


class TrainerOut(serializers.Serializer):
    name = serializers.SlugField()
    description = serializers.CharField(allow_blank=True)
    time_limit_s = serializers.IntegerField(help_text="The longest one run may take.")
    enabled = serializers.BooleanField()


class TrainingRunOut(OutSerializer):
    id = serializers.UUIDField()
    trainer = serializers.SlugField(source="trainer.name")
    state = serializers.ChoiceField(choices=TrainingState.choices)
    state_detail = serializers.CharField(allow_blank=True)
    cancel_requested = serializers.BooleanField()
    export = serializers.UUIDField(
        source="export_id", help_text="The trajectory export it trains on."
    )
    parent_policy = serializers.CharField(
        source="parent_policy.name", help_text="The policy version it starts from."
    )
    policy_version = serializers.CharField(
        source="policy_version.name",
        allow_null=True,
        help_text="The policy version registered from its adapter (succeeded).",
    )
    time_limit_s = serializers.IntegerField()
    exit_code = serializers.IntegerField(allow_null=True)
    duration_s = serializers.FloatField(allow_null=True, help_text="So far, while it runs.")
    log_bytes = serializers.IntegerField()
    created_by = serializers.CharField(source="created_by.get_username", allow_null=True)
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    url = MethodField(serializers.URLField())
    export_url = MethodField(serializers.URLField())
    dashboard_url = MethodField(serializers.URLField())

    def get_url(self, run: TrainingRun) -> str:
        return self.view.absolute("api:training_run", self.view.project.slug, run.id)

    def get_export_url(self, run: TrainingRun) -> str:
        return self.view.absolute("api:export", self.view.project.slug, run.export_id)

    def get_dashboard_url(self, run: TrainingRun) -> str:
        return self.view.absolute("web:training_run", self.view.project.slug, run.id)


class TrainingRunDetailOut(TrainingRunOut):
    adapter_sha256 = serializers.CharField(allow_blank=True)
    log_tail = MethodField(
        serializers.CharField(allow_blank=True, help_text="The log's last part.")
    )

    def get_log_tail(self, run: TrainingRun) -> str:
        return training_run_log_tail_for(run=run, user=self.view.request.user)


class TrainingRunAcceptedOut(OutSerializer):
    id = serializers.UUIDField()
    state = serializers.ChoiceField(choices=TrainingState.choices)
    cancel_requested = serializers.BooleanField()
    status_url = MethodField(serializers.URLField())
    dashboard_url = MethodField(serializers.URLField())

    def get_status_url(self, run: TrainingRun) -> str:
        return self.view.absolute("api:training_run", self.view.project.slug, run.id)

    def get_dashboard_url(self, run: TrainingRun) -> str:
        return self.view.absolute("web:training_run", self.view.project.slug, run.id)


class TrainerListView(ApiView):
    @extend_schema(
        operation_id="trainers_list", parameters=PAGE_PARAMETERS, responses=paginated(TrainerOut)
    )
    def get(self, request: Request) -> Response:
        return paginate(self, trainer_list_for_user(user=request.user), TrainerOut)


class TrainingRunListView(ApiView):
    @extend_schema(
        operation_id="training_runs_list",
        parameters=PAGE_PARAMETERS,
        responses=paginated(TrainingRunOut),
    )
    def get(self, request: Request, slug: str) -> Response:
        return paginate(self, training_run_list(project=self.project), TrainingRunOut)


class TrainingRunDetailView(ApiView):
    @extend_schema(operation_id="training_runs_retrieve", responses=TrainingRunDetailOut)
    def get(self, request: Request, slug: str, run_id: UUID) -> Response:
        run = training_run_get(project=self.project, run_id=run_id)
        return Response(self.out(TrainingRunDetailOut, run))


class TrainingRunCancelView(ApiView):
    required_scopes = {"POST": "campaigns:run"}
    required_roles = {"POST": Role.RESEARCHER}

    @extend_schema(
        operation_id="training_runs_cancel", request=None, responses={202: TrainingRunAcceptedOut}
    )
    def post(self, request: Request, slug: str, run_id: UUID) -> Response:
        run = training_run_get(project=self.project, run_id=run_id)
        run = training_run_cancel(run=run, actor=request.user)
        body = self.out(TrainingRunAcceptedOut, run)
        return Response(body, status=202, headers={"Location": body["status_url"]})


# Relative to projects/<slug:slug>/ (coevo/api/urls.py).
urlpatterns = [
    path("training-runs/", TrainingRunListView.as_view(), name="training_runs"),
    path("training-runs/<uuid:run_id>/", TrainingRunDetailView.as_view(), name="training_run"),
    path(
        "training-runs/<uuid:run_id>/cancel/",
        TrainingRunCancelView.as_view(),
        name="training_run_cancel",
    ),
]
# At the top level (not per project): trainers are the operator's, shared by all projects.
trainer_urlpatterns = [path("trainers/", TrainerListView.as_view(), name="trainers")]
