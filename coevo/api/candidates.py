"""API: candidates (see docs/api.md)."""

from __future__ import annotations

import re

from django.http import HttpResponse
from django.urls import path, register_converter
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from coevo.accounts.models import TokenKind
from coevo.api.base import PAGE_PARAMETERS, ApiView, paginate, paginated
from coevo.api.fields import MethodField, OutSerializer
from coevo.errors import NotFound
from coevo.projects.models import Role
from harness_store.models import Candidate, CandidateOrigin
from harness_store.selectors import (
    candidate_diff,
    candidate_files,
    candidate_get,
    candidate_list,
    candidate_parent,
    candidate_read_file,
    candidate_shas_known,
)
from harness_store.services import candidate_import_bundle, candidate_import_tarball

MAX_KNOWN_SHAS = 1000
_SHA = re.compile(r"[0-9a-f]{7,40}")


class ApiShaConverter:
    """A full commit SHA or a prefix of at least 7 hex digits (docs/api.md)."""

    regex = "[0-9a-fA-F]{7,40}"

    def to_python(self, value: str) -> str:
        return value.lower()

    def to_url(self, value: str) -> str:
        return value


register_converter(ApiShaConverter, "api_sha")


class CandidateOut(OutSerializer):
    sha = serializers.CharField()
    parent_shas = serializers.ListField(child=serializers.CharField())
    message = serializers.CharField()
    author_name = serializers.CharField()
    authored_at = serializers.DateTimeField()
    origin = serializers.ChoiceField(choices=CandidateOrigin.choices)
    url = MethodField(serializers.URLField())
    dashboard_url = MethodField(serializers.URLField())

    def get_url(self, candidate: Candidate) -> str:
        return self.view.absolute("api:candidate", self.view.project.slug, candidate.sha)

    def get_dashboard_url(self, candidate: Candidate) -> str:
        return self.view.absolute("web:candidate", self.view.project.slug, candidate.sha)


class FileOut(serializers.Serializer):
    path = serializers.CharField()
    size = serializers.IntegerField()


# Of {"base": Candidate | None, "head": Candidate, "diff": str}.
class DiffOut(serializers.Serializer):
    base = serializers.CharField(
        source="base.sha", allow_null=True, help_text="null: the empty tree"
    )
    head = serializers.CharField(source="head.sha")
    diff = serializers.CharField()


class KnownIn(serializers.Serializer):
    shas = serializers.ListField(
        child=serializers.CharField(max_length=40), max_length=MAX_KNOWN_SHAS
    )


class KnownOut(serializers.Serializer):
    known = serializers.ListField(child=serializers.CharField())


class BundleIn(serializers.Serializer):
    bundle = serializers.FileField(help_text="A `git bundle` file.")
    ref = serializers.CharField(max_length=255, help_text="A ref name or commit SHA in it.")


class TarballIn(serializers.Serializer):
    archive = serializers.FileField(help_text="A tar or tar.gz of the harness directory.")
    message = serializers.CharField(max_length=10_000)
    parent = serializers.RegexField(
        r"^[0-9a-fA-F]{7,40}$", required=False, help_text="The parent candidate's SHA."
    )


class CandidateListView(ApiView):
    @extend_schema(
        operation_id="candidates_list",
        parameters=PAGE_PARAMETERS,
        responses=paginated(CandidateOut),
    )
    def get(self, request: Request, slug: str) -> Response:
        return paginate(self, candidate_list(project=self.project), CandidateOut)


class CandidateDetailView(ApiView):
    @extend_schema(operation_id="candidates_retrieve", responses=CandidateOut)
    def get(self, request: Request, slug: str, sha: str) -> Response:
        candidate = candidate_get(project=self.project, sha=sha)
        return Response(self.out(CandidateOut, candidate))


class CandidateFilesView(ApiView):
    @extend_schema(operation_id="candidates_files", responses=FileOut(many=True))
    def get(self, request: Request, slug: str, sha: str) -> Response:
        candidate = candidate_get(project=self.project, sha=sha)
        entries = candidate_files(candidate=candidate)
        return Response(self.out(FileOut, entries, many=True))


class CandidateRawFileView(ApiView):
    @extend_schema(
        operation_id="candidates_file_raw",
        responses={
            (200, "application/octet-stream"): OpenApiResponse(
                OpenApiTypes.BINARY, description="The file's bytes."
            )
        },
    )
    def get(self, request: Request, slug: str, sha: str, path: str) -> HttpResponse:
        candidate = candidate_get(project=self.project, sha=sha)
        data = candidate_read_file(candidate=candidate, path=path)
        response = HttpResponse(data, content_type="application/octet-stream")
        response["Content-Disposition"] = 'attachment; filename="{}"'.format(
            path.rsplit("/", 1)[-1].replace('"', "")
        )
        return response


class CandidateDiffView(ApiView):
    @extend_schema(
        operation_id="candidates_diff",
        parameters=[
            OpenApiParameter("against", str, description="Base SHA (default: the first parent).")
        ],
        responses=DiffOut,
    )
    def get(self, request: Request, slug: str, sha: str) -> Response:
        candidate = candidate_get(project=self.project, sha=sha)
        against = request.query_params.get("against")
        if against:
            if not _SHA.fullmatch(against.lower()):
                raise NotFound(f"{against!r} is not a SHA (7 to 40 hex digits).")
            base = candidate_get(project=self.project, sha=against)
        else:
            base = candidate_parent(candidate=candidate)
        diff = candidate_diff(candidate=candidate, base=base)
        return Response(self.out(DiffOut, {"base": base, "head": candidate, "diff": diff}))


class CandidateKnownView(ApiView):
    required_scopes = {"POST": "read"}

    @extend_schema(operation_id="candidates_known", request=KnownIn, responses=KnownOut)
    def post(self, request: Request, slug: str) -> Response:
        data = KnownIn(data=request.data)
        data.is_valid(raise_exception=True)
        known = candidate_shas_known(project=self.project, shas=data.validated_data["shas"])
        return Response(self.out(KnownOut, {"known": known}))


def _origin(request: Request) -> CandidateOrigin:
    return CandidateOrigin.CI if request.auth.kind == TokenKind.CI else CandidateOrigin.MANUAL


class CandidateImportBundleView(ApiView):
    required_scopes = {"POST": "candidates:write"}
    required_roles = {"POST": Role.RESEARCHER}
    accepts_upload = True

    @extend_schema(
        operation_id="candidates_import_bundle",
        request={"multipart/form-data": BundleIn},
        responses={200: CandidateOut, 201: CandidateOut},
    )
    def post(self, request: Request, slug: str) -> Response:
        data = BundleIn(data=request.data)
        data.is_valid(raise_exception=True)
        candidate, created = candidate_import_bundle(
            project=self.project,
            bundle=data.validated_data["bundle"].read(),
            ref=data.validated_data["ref"],
            created_by=request.user,
            origin=_origin(request),
        )
        return Response(self.out(CandidateOut, candidate), status=201 if created else 200)


class CandidateImportTarballView(ApiView):
    required_scopes = {"POST": "candidates:write"}
    required_roles = {"POST": Role.RESEARCHER}
    accepts_upload = True

    @extend_schema(
        operation_id="candidates_import_tarball",
        request={"multipart/form-data": TarballIn},
        responses={200: CandidateOut, 201: CandidateOut},
    )
    def post(self, request: Request, slug: str) -> Response:
        data = TarballIn(data=request.data)
        data.is_valid(raise_exception=True)
        parent_sha = data.validated_data.get("parent")
        parent = candidate_get(project=self.project, sha=parent_sha) if parent_sha else None
        user = request.user
        candidate, created = candidate_import_tarball(
            project=self.project,
            archive=data.validated_data["archive"].read(),
            message=data.validated_data["message"],
            author_name=user.get_full_name() or user.get_username(),
            author_email=user.email or "",
            parent=parent,
            created_by=user,
            origin=_origin(request),
        )
        return Response(self.out(CandidateOut, candidate), status=201 if created else 200)


_C = "projects/<slug:slug>/candidates/"
urlpatterns = [
    path(_C, CandidateListView.as_view(), name="candidates"),
    path(f"{_C}known/", CandidateKnownView.as_view(), name="candidates_known"),
    path(f"{_C}import-bundle/", CandidateImportBundleView.as_view(), name="import_bundle"),
    path(f"{_C}import-tarball/", CandidateImportTarballView.as_view(), name="import_tarball"),
    path(f"{_C}<api_sha:sha>/", CandidateDetailView.as_view(), name="candidate"),
    path(f"{_C}<api_sha:sha>/files/", CandidateFilesView.as_view(), name="candidate_files"),
    path(
        f"{_C}<api_sha:sha>/files/<path:path>",
        CandidateRawFileView.as_view(),
        name="candidate_file",
    ),
    path(f"{_C}<api_sha:sha>/diff/", CandidateDiffView.as_view(), name="candidate_diff"),
]
