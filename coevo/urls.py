from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from coevo.accounts.views import LoginView

urlpatterns = [
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
