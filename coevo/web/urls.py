from django.urls import path, register_converter

from coevo.web import (
    audit_views,
    campaign_views,
    export_views,
    gate_views,
    matrix_views,
    member_views,
    promotion_views,
    suite_views,
    training_views,
    views,
    webhook_views,
)


class ShaConverter:
    """A full commit SHA or a prefix of at least 4 hex digits."""

    regex = "[0-9a-fA-F]{4,40}"

    def to_python(self, value: str) -> str:
        return value.lower()

    def to_url(self, value: str) -> str:
        return value


register_converter(ShaConverter, "sha")


class FilePathConverter:
    """A path inside a candidate, newlines included: git allows them in names, and Django's
    <path:> (".+") stops at one, so reversing a link to such a file failed the whole page."""

    regex = "(?s:.+)"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(FilePathConverter, "filepath")

app_name = "web"

urlpatterns = [
    path("", views.home, name="home"),
    path("p/<slug:slug>/", views.project_detail, name="project"),
    path("p/<slug:slug>/c/<sha:sha>/", views.candidate_detail, name="candidate"),
    path(
        "p/<slug:slug>/c/<sha:sha>/files/<filepath:path>",
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
    path("p/<slug:slug>/exports/", export_views.exports_page, name="exports"),
    path(
        "p/<slug:slug>/exports/<uuid:export_id>/download",
        export_views.export_download,
        name="export_download",
    ),
    path("p/<slug:slug>/campaigns/new/", campaign_views.campaign_new, name="campaign_new"),
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
    path("p/<slug:slug>/training/", training_views.training_run_list_page, name="training_runs"),
    path(
        "p/<slug:slug>/training/<uuid:run_id>/",
        training_views.training_run_detail,
        name="training_run",
    ),
    path(
        "p/<slug:slug>/training/<uuid:run_id>/log",
        training_views.training_run_log,
        name="training_run_log",
    ),
    path(
        "p/<slug:slug>/training/<uuid:run_id>/cancel/",
        training_views.training_run_cancel_action,
        name="training_run_cancel",
    ),
    path("p/<slug:slug>/matrices/", matrix_views.matrix_list_page, name="matrices"),
    path("p/<slug:slug>/matrices/<uuid:matrix_id>/", matrix_views.matrix_detail, name="matrix"),
    path("p/<slug:slug>/channels/", promotion_views.channel_list_page, name="channels"),
    path(
        "p/<slug:slug>/channels/new/",
        promotion_views.channel_create_action,
        name="channel_create",
    ),
    path(
        "p/<slug:slug>/channels/<slug:name>/rollback/",
        promotion_views.channel_rollback_action,
        name="channel_rollback",
    ),
    path("p/<slug:slug>/promotions/", promotion_views.promotion_list_page, name="promotions"),
    path("p/<slug:slug>/promotions/new/", promotion_views.promotion_new, name="promotion_new"),
    path(
        "p/<slug:slug>/promotions/<uuid:request_id>/",
        promotion_views.promotion_detail,
        name="promotion",
    ),
    path(
        "p/<slug:slug>/promotions/<uuid:request_id>/r/<uuid:rollout_id>/",
        promotion_views.promotion_rollout,
        name="promotion_rollout",
    ),
    path(
        "p/<slug:slug>/promotions/<uuid:request_id>/<str:action>/",
        promotion_views.promotion_action,
        name="promotion_action",
    ),
    # Audit log, members and webhooks (coevo/audit).
    path("audit/", audit_views.global_audit, name="global_audit"),
    path("p/<slug:slug>/audit/", audit_views.project_audit, name="audit"),
    path("p/<slug:slug>/members/", member_views.member_list_page, name="members"),
    path("p/<slug:slug>/members/<str:action>/", member_views.member_action, name="member_action"),
    path("p/<slug:slug>/webhooks/", webhook_views.webhook_list_page, name="webhooks"),
    path(
        "p/<slug:slug>/webhooks/<uuid:webhook_id>/<str:action>/",
        webhook_views.webhook_action,
        name="webhook_action",
    ),
    path(
        "p/<slug:slug>/webhooks/deliveries/<uuid:delivery_id>/redeliver/",
        webhook_views.webhook_redeliver_action,
        name="webhook_redeliver",
    ),
]
