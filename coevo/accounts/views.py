"""Logging in and changing one's password (both behind the login throttle), and the token
settings page: list your tokens, create one (shown once), revoke one."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.forms import Form
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse_lazy
from django.views.decorators.http import require_http_methods, require_POST

from coevo.accounts.forms import THROTTLED, LoginForm, PasswordChangeForm, TokenCreateForm
from coevo.accounts.login_throttle import client_address, login_block_get
from coevo.accounts.selectors import token_get_for_user, token_list_for_user
from coevo.accounts.services import token_create, token_revoke
from coevo.errors import CoevoError, NotFound


def _throttled(response: HttpResponse, form: Form, *, username: str | None) -> HttpResponse:
    """429 with Retry-After when the throttle refused the attempt (the page says when too)."""
    if not form.has_error("__all__", THROTTLED) and not form.has_error("old_password", THROTTLED):
        return response
    blocked = login_block_get(username=username, address=client_address(form.request))
    response.status_code = 429
    if blocked is not None:
        response["Retry-After"] = str(blocked.retry_after_s)
    return response


class LoginView(auth_views.LoginView):
    form_class = LoginForm

    def form_invalid(self, form: LoginForm) -> HttpResponse:
        response = super().form_invalid(form)
        return _throttled(response, form, username=form.cleaned_data.get("username"))


class PasswordChangeView(auth_views.PasswordChangeView):
    form_class = PasswordChangeForm
    template_name = "accounts/password_change.html"
    success_url = reverse_lazy("accounts:password_change_done")

    def get_form_kwargs(self) -> dict[str, Any]:
        return {**super().get_form_kwargs(), "request": self.request}

    def form_invalid(self, form: PasswordChangeForm) -> HttpResponse:
        response = super().form_invalid(form)
        return _throttled(response, form, username=self.request.user.get_username())


@login_required
@require_http_methods(["GET", "POST"])
def token_settings(request: HttpRequest) -> HttpResponse:
    form = TokenCreateForm(request.POST or None)
    created = None
    status = 200
    if request.method == "POST":
        if form.is_valid():
            try:
                token, raw = token_create(
                    user=request.user, created_by=request.user, **form.cleaned_token_args()
                )
            except CoevoError as exc:
                form.add_error(None, str(exc))
                status = 400
            else:
                # Rendered, not redirected: the plaintext exists only in this response.
                created = {"token": token, "raw": raw}
                form = TokenCreateForm()
                status = 201
        else:
            status = 400
    context = {"tokens": token_list_for_user(user=request.user), "form": form, "created": created}
    response = render(request, "accounts/tokens.html", context, status=status)
    response["Cache-Control"] = "no-store"
    return response


@login_required
@require_POST
def token_revoke_view(request: HttpRequest, token_id: str) -> HttpResponse:
    try:
        token = token_get_for_user(user=request.user, token_id=token_id)
    except NotFound as exc:
        raise Http404(str(exc)) from None
    if token_revoke(token=token, actor=request.user):
        messages.success(request, f"Token {token.name} ({token.prefix}…) revoked.")
    return redirect("accounts:tokens")
