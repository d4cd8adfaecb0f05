from django.contrib.auth import views as auth_views
from django.urls import path

from coevo.accounts import views

app_name = "accounts"
urlpatterns = [
    path("settings/tokens/", views.token_settings, name="tokens"),
    path("settings/tokens/<uuid:token_id>/revoke/", views.token_revoke_view, name="token_revoke"),
    path("settings/password/", views.PasswordChangeView.as_view(), name="password_change"),
    path(
        "settings/password/done/",
        auth_views.PasswordChangeDoneView.as_view(template_name="accounts/password_done.html"),
        name="password_change_done",
    ),
]
