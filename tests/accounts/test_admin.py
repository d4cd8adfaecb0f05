from __future__ import annotations

from django.contrib.auth import get_user_model
from django.urls import reverse

from coevo.accounts.models import ApiToken
from coevo.accounts.services import token_authenticate, token_create


def _admin(db):
    return get_user_model().objects.create_superuser("root", "root@example.com", "pw-long-enough")


def test_it_creates_a_token_in_the_admin_and_shows_it_once(client, db, owner):
    client.force_login(_admin(db))
    response = client.post(
        reverse("admin:accounts_apitoken_add"),
        {"user": owner.pk, "name": "deploy", "kind": "ci", "scopes": ["read"]},
        follow=True,
    )
    assert response.status_code == 200
    token = ApiToken.objects.get(name="deploy")
    message = next(str(m) for m in response.context["messages"] if token.prefix in str(m))
    raw = next(word for word in message.split() if word.startswith("coevo_"))
    assert token_authenticate(raw=raw).pk == token.pk
    assert token.created_by.username == "root"


def test_it_revokes_tokens_with_the_admin_action(client, db, owner):
    token, _ = token_create(
        user=owner, name="old", kind="personal", scopes=["read"], created_by=owner
    )
    client.force_login(_admin(db))
    response = client.post(
        reverse("admin:accounts_apitoken_changelist"),
        {"action": "revoke", "_selected_action": [str(token.pk)]},
    )
    assert response.status_code == 302
    assert ApiToken.objects.get(pk=token.pk).revoked_at is not None
