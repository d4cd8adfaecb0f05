"""API: suites (see docs/api.md)."""

from __future__ import annotations

import json
import math
from typing import Any

from django.urls import path
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from coevo.api.base import PAGE_PARAMETERS, ApiView, paginate, paginated
from coevo.api.fields import MethodField, OutSerializer
from coevo.errors import InvalidInput
from coevo.projects.models import Role
from coevo.suites.harbor import HarborReport, suite_import_harbor_archive
from coevo.suites.jsonl import scorer_spec_build
from coevo.suites.models import Suite, SuiteKind
from coevo.suites.selectors import suite_get, suite_summaries
from coevo.suites.services import suite_import_jsonl


# Of a suite from suite_summaries (its per-split counts).
class TaskCountsOut(serializers.Serializer):
    search = serializers.IntegerField(source="search_count")
    validation = serializers.IntegerField(source="validation_count")
    heldout = serializers.IntegerField(source="heldout_count")


# Of a suite from suite_summaries.
class SuiteOut(OutSerializer):
    id = serializers.UUIDField()
    name = serializers.CharField()
    version = serializers.CharField()
    kind = serializers.ChoiceField(choices=SuiteKind.choices)
    content_hash = serializers.CharField(help_text="The hash of the tasks and the scorer.")
    split_seed = serializers.CharField(
        help_text="With content_hash, the suite's identity: the same tasks split another way "
        "are another suite (results are never shared between the two)."
    )
    description = serializers.CharField()
    task_counts = TaskCountsOut(source="*")
    url = MethodField(serializers.URLField())

    def get_url(self, suite: Suite) -> str:
        return self.view.absolute(
            "api:suite", self.view.project.slug, suite.name, query=f"version={suite.version}"
        )


class SuiteImportIn(serializers.Serializer):
    name = serializers.CharField(max_length=64)
    file = serializers.FileField(help_text="JSONL: one task per line.")
    scorer = serializers.CharField(
        max_length=10_000,
        help_text='JSON: {"kind": "exact|normalized|numeric|regex|python", '
        '"abs_tol"?: number, "rel_tol"?: number}',
    )
    verifier = serializers.FileField(
        required=False, help_text="The Python verifier module (scorer kind python)."
    )
    description = serializers.CharField(max_length=10_000, required=False, allow_blank=True)
    split_seed = serializers.CharField(max_length=64, required=False)


class SuiteImportHarborIn(serializers.Serializer):
    name = serializers.CharField(max_length=64)
    file = serializers.FileField(
        help_text="A tar or tar.gz of a directory of Harbor task directories, or of one task "
        "directory (docs/workspace-suites.md)."
    )
    description = serializers.CharField(max_length=10_000, required=False, allow_blank=True)
    split_seed = serializers.CharField(max_length=64, required=False)
    allow_dockerfile = serializers.BooleanField(
        default=False,
        help_text="Take tasks that need their container (a Dockerfile that does more than "
        "copy files, a prebuilt docker_image) with only the files their Dockerfile copies into "
        "/app. Without it they are refused, unless the container backend is on "
        "(COEVO_CONTAINER_BACKEND), which imports them as they are.",
    )


# The report's (task key, text) pairs, as HarborReportOut renders them.
class RefusedTaskOut(serializers.Serializer):
    task = serializers.CharField()
    reason = serializers.CharField()


class TaskWarningOut(serializers.Serializer):
    task = serializers.CharField()
    message = serializers.CharField()


class HarborReportOut(serializers.Serializer):
    taken = serializers.ListField(child=serializers.CharField(), help_text="Task keys imported.")
    refused = MethodField(RefusedTaskOut(many=True), help_text="Tasks left out, and why.")
    warnings = MethodField(TaskWarningOut(many=True))

    def get_refused(self, report: HarborReport) -> list[dict[str, str]]:
        return [{"task": key, "reason": reason} for key, reason in report.refused]

    def get_warnings(self, report: HarborReport) -> list[dict[str, str]]:
        return [{"task": key, "message": message} for key, message in report.warnings]


# Of {"suite": a suite from suite_summaries, "report": its HarborReport}.
class SuiteImportHarborOut(OutSerializer):
    suite = SuiteOut()
    report = HarborReportOut()


class SuiteListView(ApiView):
    @extend_schema(
        operation_id="suites_list", parameters=PAGE_PARAMETERS, responses=paginated(SuiteOut)
    )
    def get(self, request: Request, slug: str) -> Response:
        return paginate(self, suite_summaries(project=self.project), SuiteOut)


class SuiteDetailView(ApiView):
    @extend_schema(
        operation_id="suites_retrieve",
        parameters=[OpenApiParameter("version", str, description="e.g. v2 (default: latest)")],
        responses=SuiteOut,
    )
    def get(self, request: Request, slug: str, name: str) -> Response:
        found = suite_get(
            project=self.project, name=name, version=request.query_params.get("version")
        )
        suite = suite_summaries(project=self.project).get(pk=found.pk)
        return Response(self.out(SuiteOut, suite))


class SuiteImportJsonlView(ApiView):
    required_scopes = {"POST": "suites:write"}
    required_roles = {"POST": Role.RESEARCHER}
    accepts_upload = True

    @extend_schema(
        operation_id="suites_import_jsonl",
        request={"multipart/form-data": SuiteImportIn},
        responses={200: SuiteOut, 201: SuiteOut},
    )
    def post(self, request: Request, slug: str) -> Response:
        data = SuiteImportIn(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        options = _scorer_options(values["scorer"])
        verifier = values.get("verifier")
        scorer = scorer_spec_build(
            kind=options["kind"],
            abs_tol=options.get("abs_tol"),
            rel_tol=options.get("rel_tol"),
            verifier_name=verifier.name if verifier else "",
            verifier_source=verifier.read() if verifier else None,
        )
        suite, created = suite_import_jsonl(
            project=self.project,
            name=values["name"],
            data=values["file"].read(),
            scorer=scorer,
            description=values.get("description", ""),
            split_seed=values.get("split_seed") or "0",
            actor=request.user,
        )
        suite = suite_summaries(project=self.project).get(pk=suite.pk)
        return Response(self.out(SuiteOut, suite), status=201 if created else 200)


class SuiteImportHarborView(ApiView):
    required_scopes = {"POST": "suites:write"}
    required_roles = {"POST": Role.RESEARCHER}
    accepts_upload = True

    @extend_schema(
        operation_id="suites_import_harbor",
        request={"multipart/form-data": SuiteImportHarborIn},
        responses={200: SuiteImportHarborOut, 201: SuiteImportHarborOut},
    )
    def post(self, request: Request, slug: str) -> Response:
        data = SuiteImportHarborIn(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        suite, created, report = suite_import_harbor_archive(
            project=self.project,
            name=values["name"],
            archive=values["file"].read(),
            split_seed=values.get("split_seed") or "0",
            description=values.get("description", ""),
            allow_dockerfile=values["allow_dockerfile"],
            actor=request.user,
        )
        suite = suite_summaries(project=self.project).get(pk=suite.pk)
        return Response(
            self.out(SuiteImportHarborOut, {"suite": suite, "report": report}),
            status=201 if created else 200,
        )


def _scorer_options(raw: str) -> dict[str, Any]:
    try:
        options = json.loads(raw)
    except ValueError:
        raise InvalidInput('scorer: not JSON; send e.g. {"kind": "exact"}.') from None
    if not isinstance(options, dict) or not isinstance(options.get("kind"), str):
        raise InvalidInput('scorer: a JSON object with a "kind", e.g. {"kind": "exact"}.')
    unknown = sorted(set(options) - {"kind", "abs_tol", "rel_tol"})
    if unknown:
        raise InvalidInput(f"scorer: unknown option(s) {', '.join(unknown)}.")
    for key in ("abs_tol", "rel_tol"):
        value = options.get(key)
        if value is not None and (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
        ):
            raise InvalidInput(f"scorer: {key} must be a finite number.")
    return options


_S = "projects/<slug:slug>/suites/"
urlpatterns = [
    path(_S, SuiteListView.as_view(), name="suites"),
    # Before the name route: "import-jsonl" and "import-harbor" would also match <slug:name>.
    path(f"{_S}import-jsonl/", SuiteImportJsonlView.as_view(), name="suite_import_jsonl"),
    path(f"{_S}import-harbor/", SuiteImportHarborView.as_view(), name="suite_import_harbor"),
    path(f"{_S}<slug:name>/", SuiteDetailView.as_view(), name="suite"),
]
