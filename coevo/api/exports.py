"""API: trajectory exports (see docs/api.md, Exports). Included under ``projects/<slug:slug>/``."""

from __future__ import annotations

from uuid import UUID

from django.http import HttpResponse
from django.urls import path
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from coevo.api.base import PAGE_PARAMETERS, ApiView, paginate, paginated, policy_version_named
from coevo.api.fields import MethodField, OutSerializer
from coevo.errors import NotFound
from coevo.evaluations.models import Evaluation
from coevo.exports.downloads import export_file_response
from coevo.exports.models import ExportFormat, ExportState, TrajectoryExport
from coevo.exports.selectors import (
    trajectory_export_evaluation_ids,
    trajectory_export_file,
    trajectory_export_get,
    trajectory_export_list,
)
from coevo.exports.services import trajectory_export_create
from coevo.projects.models import Role
from coevo.suites.selectors import suite_get
from harness_store.selectors import candidate_get


class ExportIn(serializers.Serializer):
    format = serializers.ChoiceField(choices=ExportFormat.choices, default=ExportFormat.CHAT)
    splits = serializers.ListField(
        child=serializers.CharField(max_length=16),
        min_length=1,
        max_length=3,
        default=lambda: ["search"],
        help_text="search (default) and/or validation; heldout is refused.",
    )
    candidate = serializers.RegexField(
        r"^[0-9a-fA-F]{7,40}$",
        required=False,
        help_text="Harness-matched: only rollouts produced under this candidate.",
    )
    policy_version = serializers.CharField(max_length=100, required=False)
    suite = serializers.CharField(max_length=64, required=False)
    suite_version = serializers.CharField(max_length=32, required=False)
    successful_only = serializers.BooleanField(default=False)
    min_score = serializers.FloatField(required=False, min_value=0.0, max_value=1.0)
    last_turns = serializers.IntegerField(required=False, min_value=1, max_value=10_000)
    evaluations = serializers.ListField(
        child=serializers.UUIDField(), required=False, max_length=1000
    )


class ExportCreatedOut(OutSerializer):
    id = serializers.UUIDField()
    state = serializers.ChoiceField(choices=ExportState.choices)
    status_url = MethodField(serializers.URLField())
    dashboard_url = MethodField(serializers.URLField())

    def get_status_url(self, export: TrajectoryExport) -> str:
        return self.view.absolute("api:export", self.view.project.slug, export.id)

    def get_dashboard_url(self, export: TrajectoryExport) -> str:
        return self.view.absolute("web:exports", self.view.project.slug)


class ExportOut(OutSerializer):
    id = serializers.UUIDField()
    format = serializers.ChoiceField(choices=ExportFormat.choices)
    filters = serializers.DictField()
    state = serializers.ChoiceField(choices=ExportState.choices)
    state_detail = serializers.CharField()
    sha256 = MethodField(serializers.CharField(allow_null=True))
    size_bytes = serializers.IntegerField()
    rows = serializers.IntegerField()
    rollouts = serializers.IntegerField()
    evaluations = MethodField(serializers.ListField(child=serializers.UUIDField()))
    created_by = serializers.CharField(source="created_by.get_username", allow_null=True)
    created_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)
    url = MethodField(serializers.URLField())
    download_url = MethodField(serializers.URLField(allow_null=True))
    dashboard_url = MethodField(serializers.URLField())

    def get_sha256(self, export: TrajectoryExport) -> str | None:
        return export.sha256 or None  # blank until the file is written

    def get_evaluations(self, export: TrajectoryExport) -> list[str]:
        return [str(i) for i in trajectory_export_evaluation_ids(export=export)]

    def get_url(self, export: TrajectoryExport) -> str:
        return self.view.absolute("api:export", self.view.project.slug, export.id)

    def get_download_url(self, export: TrajectoryExport) -> str | None:
        if export.state != ExportState.READY:
            return None
        return self.view.absolute("api:export_download", self.view.project.slug, export.id)

    def get_dashboard_url(self, export: TrajectoryExport) -> str:
        return self.view.absolute("web:exports", self.view.project.slug)


class ExportListView(ApiView):
    required_scopes = {"POST": "evaluations:run"}
    enqueues = frozenset({"POST"})
    required_roles = {"POST": Role.RESEARCHER}

    @extend_schema(
        operation_id="exports_list", parameters=PAGE_PARAMETERS, responses=paginated(ExportOut)
    )
    def get(self, request: Request, slug: str) -> Response:
        return paginate(self, trajectory_export_list(project=self.project), ExportOut)

    @extend_schema(
        operation_id="exports_create", request=ExportIn, responses={202: ExportCreatedOut}
    )
    def post(self, request: Request, slug: str) -> Response:
        data = ExportIn(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        policy_version = policy_version_named(values.get("policy_version"))
        suite = (
            suite_get(
                project=self.project, name=values["suite"], version=values.get("suite_version")
            )
            if values.get("suite")
            else None
        )
        evaluations = None
        if "evaluations" in values:
            wanted = set(values["evaluations"])
            evaluations = list(Evaluation.objects.filter(project=self.project, id__in=wanted))
            missing = wanted - {e.id for e in evaluations}
            if missing:
                raise NotFound(f"No evaluation {sorted(missing)[0]} in project {slug}.")
        export = trajectory_export_create(
            project=self.project,
            format=values["format"],
            splits=list(values["splits"]),
            candidate=(
                candidate_get(project=self.project, sha=values["candidate"])
                if values.get("candidate")
                else None
            ),
            policy_version=policy_version,
            suite=suite,
            successful_only=values["successful_only"],
            min_score=values.get("min_score"),
            last_turns=values.get("last_turns"),
            evaluations=evaluations,
            created_by=request.user,
        )
        body = self.out(ExportCreatedOut, export)
        return Response(body, status=202, headers={"Location": body["status_url"]})


class ExportDetailView(ApiView):
    @extend_schema(operation_id="exports_retrieve", responses=ExportOut)
    def get(self, request: Request, slug: str, export_id: UUID) -> Response:
        export = trajectory_export_get(project=self.project, export_id=export_id)
        return Response(self.out(ExportOut, export))


class ExportDownloadView(ApiView):
    @extend_schema(
        operation_id="exports_download",
        responses={
            (200, "application/x-ndjson"): OpenApiResponse(
                OpenApiTypes.BINARY, description="The export's JSONL, streamed."
            )
        },
    )
    def get(self, request: Request, slug: str, export_id: UUID) -> HttpResponse:
        export = trajectory_export_get(project=self.project, export_id=export_id)
        return export_file_response(
            path=trajectory_export_file(export=export), filename=export.filename
        )


# Relative to projects/<slug:slug>/ (coevo/api/urls.py).
urlpatterns = [
    path("exports/", ExportListView.as_view(), name="exports"),
    path("exports/<uuid:export_id>/", ExportDetailView.as_view(), name="export"),
    path(
        "exports/<uuid:export_id>/download/",
        ExportDownloadView.as_view(),
        name="export_download",
    ),
]
