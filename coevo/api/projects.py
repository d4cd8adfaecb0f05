"""API: projects (see docs/api.md)."""

from __future__ import annotations

from django.db.models import OuterRef, QuerySet, Subquery
from django.urls import path
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from coevo.api.base import PAGE_PARAMETERS, ApiView, paginate, paginated
from coevo.api.fields import MethodField, OutSerializer
from coevo.projects.models import Membership, Project, Role
from coevo.projects.selectors import project_list_for_user


class ProjectOut(OutSerializer):
    slug = serializers.SlugField()
    name = serializers.CharField()
    description = serializers.CharField()
    role = MethodField(
        serializers.ChoiceField(choices=Role.choices, help_text="The token user's role.")
    )
    url = MethodField(serializers.URLField())

    def get_role(self, project: Project) -> str:
        # Staff see every project; where they are not members they act as admins.
        return getattr(project, "member_role", None) or Role.ADMIN

    def get_url(self, project: Project) -> str:
        return self.view.absolute("api:project", project.slug)


def _projects_with_role(request: Request) -> QuerySet[Project]:
    role = Membership.objects.filter(project=OuterRef("pk"), user=request.user).values("role")
    return project_list_for_user(user=request.user).annotate(member_role=Subquery(role[:1]))


class ProjectListView(ApiView):
    @extend_schema(
        operation_id="projects_list", parameters=PAGE_PARAMETERS, responses=paginated(ProjectOut)
    )
    def get(self, request: Request) -> Response:
        return paginate(self, _projects_with_role(request), ProjectOut)


class ProjectDetailView(ApiView):
    @extend_schema(operation_id="projects_retrieve", responses=ProjectOut)
    def get(self, request: Request, slug: str) -> Response:
        project = _projects_with_role(request).get(pk=self.project.pk)
        return Response(self.out(ProjectOut, project))


urlpatterns = [
    path("projects/", ProjectListView.as_view(), name="projects"),
    path("projects/<slug:slug>/", ProjectDetailView.as_view(), name="project"),
]
