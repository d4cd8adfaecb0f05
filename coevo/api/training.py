"""API: trainers and training runs (see docs/api.md, Training).

Runs are included under ``projects/<slug:slug>/``; reading needs ``read`` (any member),
cancelling the ``campaigns:run`` scope and the researcher role (policy steps are campaign
work). Trainers are listed to project members (and staff) without their command or
environment, and a run never shows its argv: those are the operator's (they run outside any
sandbox, and the command and environment may hold internal hosts, paths or secrets).
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.urls import path
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from coevo.api.base import PAGE_PARAMETERS, ApiView, paginate, paginated
from coevo.projects.models import Role
from coevo.training.models import Trainer, TrainingRun, TrainingState
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


class TrainingRunOut(serializers.Serializer):
    id = serializers.UUIDField()
    trainer = serializers.SlugField()
    state = serializers.ChoiceField(choices=TrainingState.choices)
    state_detail = serializers.CharField(allow_blank=True)
    cancel_requested = serializers.BooleanField()
    export = serializers.UUIDField(help_text="The trajectory export it trains on.")
    parent_policy = serializers.CharField(help_text="The policy version it starts from.")
    policy_version = serializers.CharField(
        allow_null=True, help_text="The policy version registered from its adapter (succeeded)."
    )
    time_limit_s = serializers.IntegerField()
    exit_code = serializers.IntegerField(allow_null=True)
    duration_s = serializers.FloatField(allow_null=True, help_text="So far, while it runs.")
    log_bytes = serializers.IntegerField()
    created_by = serializers.CharField(allow_null=True)
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    url = serializers.URLField()
    export_url = serializers.URLField()
    dashboard_url = serializers.URLField()


class TrainingRunDetailOut(TrainingRunOut):
    adapter_sha256 = serializers.CharField(allow_blank=True)
    log_tail = serializers.CharField(allow_blank=True, help_text="The log's last part.")


class TrainingRunAcceptedOut(serializers.Serializer):
    id = serializers.UUIDField()
    state = serializers.ChoiceField(choices=TrainingState.choices)
    cancel_requested = serializers.BooleanField()
    status_url = serializers.URLField()
    dashboard_url = serializers.URLField()


def _when(value: Any) -> str | None:
    return serializers.DateTimeField().to_representation(value) if value else None


def trainer_out(trainer: Trainer) -> dict[str, Any]:
    return {
        "name": trainer.name,
        "description": trainer.description,
        "time_limit_s": trainer.time_limit_s,
        "enabled": trainer.enabled,
    }


def training_run_out(view: ApiView, run: TrainingRun, *, detail: bool = False) -> dict[str, Any]:
    slug = view.project.slug
    body: dict[str, Any] = {
        "id": str(run.id),
        "trainer": run.trainer.name,
        "state": run.state,
        "state_detail": run.state_detail,
        "cancel_requested": run.cancel_requested,
        "export": str(run.export_id),
        "parent_policy": run.parent_policy.name,
        "policy_version": run.policy_version.name if run.policy_version else None,
        "time_limit_s": run.time_limit_s,
        "exit_code": run.exit_code,
        "duration_s": run.duration_s,
        "log_bytes": run.log_bytes,
        "created_by": run.created_by.get_username() if run.created_by else None,
        "created_at": _when(run.created_at),
        "started_at": _when(run.started_at),
        "finished_at": _when(run.finished_at),
        "url": view.absolute("api:training_run", slug, run.id),
        "export_url": view.absolute("api:export", slug, run.export_id),
        "dashboard_url": view.absolute("web:training_run", slug, run.id),
    }
    if detail:
        body.update(
            adapter_sha256=run.adapter_sha256,
            log_tail=training_run_log_tail_for(run=run, user=view.request.user),
        )
    return body


class TrainerListView(ApiView):
    @extend_schema(
        operation_id="trainers_list", parameters=PAGE_PARAMETERS, responses=paginated(TrainerOut)
    )
    def get(self, request: Request) -> Response:
        return paginate(self, trainer_list_for_user(user=request.user), trainer_out)


class TrainingRunListView(ApiView):
    @extend_schema(
        operation_id="training_runs_list",
        parameters=PAGE_PARAMETERS,
        responses=paginated(TrainingRunOut),
    )
    def get(self, request: Request, slug: str) -> Response:
        return paginate(
            self, training_run_list(project=self.project), lambda r: training_run_out(self, r)
        )


class TrainingRunDetailView(ApiView):
    @extend_schema(operation_id="training_runs_retrieve", responses=TrainingRunDetailOut)
    def get(self, request: Request, slug: str, run_id: UUID) -> Response:
        run = training_run_get(project=self.project, run_id=run_id)
        return Response(training_run_out(self, run, detail=True))


class TrainingRunCancelView(ApiView):
    required_scopes = {"POST": "campaigns:run"}
    required_roles = {"POST": Role.RESEARCHER}

    @extend_schema(
        operation_id="training_runs_cancel", request=None, responses={202: TrainingRunAcceptedOut}
    )
    def post(self, request: Request, slug: str, run_id: UUID) -> Response:
        run = training_run_get(project=self.project, run_id=run_id)
        run = training_run_cancel(run=run, actor=request.user)
        status_url = self.absolute("api:training_run", slug, run.id)
        body = {
            "id": str(run.id),
            "state": run.state,
            "cancel_requested": run.cancel_requested,
            "status_url": status_url,
            "dashboard_url": self.absolute("web:training_run", slug, run.id),
        }
        return Response(body, status=202, headers={"Location": status_url})


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
