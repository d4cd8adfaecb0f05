from __future__ import annotations

import re

from django.urls import reverse

from coevo.accounts.models import ApiToken
from coevo.accounts.services import token_authenticate
from tests.conftest import PASSWORD


def test_it_asks_for_a_login(client):
    response = client.get(reverse("accounts:tokens"))
    assert response.status_code == 302
    assert reverse("login") in response["Location"]


def test_it_creates_a_token_shows_it_once_and_revokes_it(client, owner):
    client.force_login(owner)
    response = client.post(
        reverse("accounts:tokens"),
        {"name": "CI main", "kind": "ci", "scopes": ["read", "candidates:write"]},
    )
    assert response.status_code == 201
    html = response.content.decode()
    raw = re.search(r'id="token-value">(coevo_[^<]+)<', html).group(1)
    token = token_authenticate(raw=raw)
    assert token.user == owner and token.kind == "ci"
    assert token.scopes == ["read", "candidates:write"]
    assert response["Cache-Control"] == "no-store"

    listing = client.get(reverse("accounts:tokens")).content.decode()
    assert token.prefix in listing and raw not in listing

    response = client.post(reverse("accounts:token_revoke", args=[token.id]))
    assert response.status_code == 302
    assert ApiToken.objects.get(pk=token.pk).revoked_at is not None
    assert "revoked" in client.get(reverse("accounts:tokens")).content.decode()


def test_it_shows_why_a_token_was_refused(client, owner):
    client.force_login(owner)
    response = client.post(
        reverse("accounts:tokens"),
        {"name": "CI", "kind": "ci", "scopes": ["promotions:approve"]},
    )
    assert response.status_code == 400
    assert "CI token cannot hold" in response.content.decode()
    assert not ApiToken.objects.exists()


def test_it_does_not_revoke_another_users_token(client, owner, outsider):
    client.force_login(owner)
    client.post(
        reverse("accounts:tokens"), {"name": "mine", "kind": "personal", "scopes": ["read"]}
    )
    token = ApiToken.objects.get(user=owner)
    client.force_login(outsider)
    response = client.post(reverse("accounts:token_revoke", args=[token.id]))
    assert response.status_code == 404
    assert ApiToken.objects.get(pk=token.pk).revoked_at is None


def test_it_needs_the_csrf_token_to_create(owner):
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)
    response = client.post(
        reverse("accounts:tokens"), {"name": "x", "kind": "personal", "scopes": ["read"]}
    )
    assert response.status_code == 403
    assert not ApiToken.objects.exists()


def test_it_changes_the_password(client, owner):
    client.force_login(owner)
    assert client.get(reverse("accounts:password_change")).status_code == 200
    response = client.post(
        reverse("accounts:password_change"),
        {
            "old_password": PASSWORD,
            "new_password1": "a-new-long-passphrase",
            "new_password2": "a-new-long-passphrase",
        },
    )
    assert response.status_code == 302
    owner.refresh_from_db()
    assert owner.check_password("a-new-long-passphrase")
