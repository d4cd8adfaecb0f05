from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from django.views.generic import RedirectView

from coevo.accounts.views import LoginView

urlpatterns = [
    # The admin's own password page checks the old password outside the login throttle: staff
    # change theirs on the dashboard's page, which counts failures like a login.
    path(
        "admin/password_change/",
        RedirectView.as_view(pattern_name="accounts:password_change", query_string=True),
    ),
    path("admin/", admin.site.urls),
    # The login throttle's form (coevo/accounts/login_throttle.py); the admin's is set in
    # coevo/accounts/admin.py.
    path("login/", LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("api/v1/", include("coevo.api.urls")),
    path("", include("coevo.ops.urls")),
    path("", include("coevo.accounts.urls")),
    path("", include("coevo.web.urls")),
]
