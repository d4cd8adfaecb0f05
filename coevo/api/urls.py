from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularRedocView, SpectacularSwaggerView

from coevo.api import candidates, evaluations, projects, suites, training
from coevo.api.views import CachedSchemaView, api_not_found

app_name = "api"
urlpatterns = [
    path("schema/", CachedSchemaView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api:schema"), name="docs"),
    path("redoc/", SpectacularRedocView.as_view(url_name="api:schema"), name="redoc"),
    # Other work plugs its resources in here (same framework: coevo.api.base.ApiView).
    path("projects/<slug:slug>/", include("coevo.api.gates")),
    path("projects/<slug:slug>/", include("coevo.api.channels")),
    path("projects/<slug:slug>/", include("coevo.api.campaigns")),
    path("projects/<slug:slug>/", include("coevo.api.matrices")),
    path("projects/<slug:slug>/", include("coevo.api.promotions")),
    path("projects/<slug:slug>/", include("coevo.api.exports")),
    path("projects/<slug:slug>/", include("coevo.api.training")),
    *training.trainer_urlpatterns,
    *projects.urlpatterns,
    *candidates.urlpatterns,
    *suites.urlpatterns,
    *evaluations.urlpatterns,
    # Anything else under /api/v1/ is a JSON 404, not the dashboard's HTML page.
    re_path(r"^.*$", api_not_found),
]
