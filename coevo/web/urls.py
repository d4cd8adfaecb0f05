from django.urls import path, register_converter

from coevo.web import campaign_views, gate_views, suite_views, views


class ShaConverter:
    """A full commit SHA or a prefix of at least 4 hex digits."""

    regex = "[0-9a-fA-F]{4,40}"

    def to_python(self, value: str) -> str:
        return value.lower()

    def to_url(self, value: str) -> str:
        return value


register_converter(ShaConverter, "sha")

app_name = "web"

urlpatterns = [
    path("", views.home, name="home"),
    path("p/<slug:slug>/", views.project_detail, name="project"),
    path("p/<slug:slug>/c/<sha:sha>/", views.candidate_detail, name="candidate"),
    path(
        "p/<slug:slug>/c/<sha:sha>/files/<path:path>",
        views.candidate_file,
        name="candidate_file",
    ),
    path("p/<slug:slug>/c/<sha:sha>/diff/", views.candidate_diff_page, name="candidate_diff"),
    path("p/<slug:slug>/e/<uuid:evaluation_id>/", views.evaluation_detail, name="evaluation"),
    path(
        "p/<slug:slug>/e/<uuid:evaluation_id>/<str:action>/",
        views.evaluation_action,
        name="evaluation_action",
    ),
    path("p/<slug:slug>/compare/", views.evaluation_comparison, name="comparison"),
    path("p/<slug:slug>/gates/<uuid:gate_id>/", gate_views.gate_detail, name="gate"),
    path("p/<slug:slug>/r/<uuid:rollout_id>/", views.rollout_detail, name="rollout"),
    path("p/<slug:slug>/suites/", suite_views.suite_list_page, name="suites"),
    path("p/<slug:slug>/suites/import/", suite_views.suite_import_page, name="suite_import"),
    path("p/<slug:slug>/suites/<uuid:suite_id>/", suite_views.suite_detail, name="suite"),
    path("p/<slug:slug>/campaigns/", campaign_views.campaign_list_page, name="campaigns"),
    path(
        "p/<slug:slug>/campaigns/<uuid:campaign_id>/",
        campaign_views.campaign_detail,
        name="campaign",
    ),
    path(
        "p/<slug:slug>/campaigns/<uuid:campaign_id>/<str:action>/",
        campaign_views.campaign_action,
        name="campaign_action",
    ),
]
