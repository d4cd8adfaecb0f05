from django.urls import path

from coevo.ops import views

app_name = "ops"

# Included at the site root: load balancers and Prometheus expect these exact paths.
urlpatterns = [
    path("healthz", views.healthz, name="healthz"),
    path("readyz", views.readyz, name="readyz"),
    path("metrics", views.metrics, name="metrics"),
    path("system/", views.system, name="system"),
]
