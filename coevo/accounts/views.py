"""The token settings page: list your tokens, create one (shown once), revoke one."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from coevo.accounts.forms import TokenCreateForm
from coevo.accounts.selectors import token_get_for_user, token_list_for_user
from coevo.accounts.services import token_create, token_revoke
from coevo.errors import CoevoError, NotFound


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
