from __future__ import annotations

import hashlib
from datetime import timedelta

import pytest
from django.utils import timezone

from coevo.accounts.models import ApiToken, TokenKind
from coevo.accounts.services import token_authenticate, token_create, token_revoke
from coevo.errors import InvalidInput, NotAuthenticated, PermissionDenied


def _create(user, scopes=("read",), kind=TokenKind.PERSONAL, **kwargs):
    return token_create(
        user=user, name="laptop", kind=kind, scopes=list(scopes), created_by=user, **kwargs
    )


def test_it_returns_the_plaintext_once_and_stores_only_its_hash(owner):
    token, raw = _create(owner)
    assert raw.startswith(f"coevo_{token.prefix}_")
    assert len(token.prefix) == 8
    stored = ApiToken.objects.get(pk=token.pk)
    assert stored.secret_hash == hashlib.sha256(raw.encode()).hexdigest()
    assert raw not in str(ApiToken.objects.filter(pk=token.pk).values().first())


def test_it_authenticates_the_token_and_records_last_use_at_most_once_a_minute(owner):
    token, raw = _create(owner)
    assert token_authenticate(raw=raw).pk == token.pk
    first = ApiToken.objects.get(pk=token.pk).last_used_at
    assert first is not None
    token_authenticate(raw=raw)
    assert ApiToken.objects.get(pk=token.pk).last_used_at == first
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=first - timedelta(minutes=2))
    token_authenticate(raw=raw)
    assert ApiToken.objects.get(pk=token.pk).last_used_at > first - timedelta(minutes=1)


def test_it_refuses_a_wrong_secret_with_a_known_prefix(owner):
    token, raw = _create(owner)
    with pytest.raises(NotAuthenticated):
        token_authenticate(raw=raw[:-2] + ("AA" if not raw.endswith("AA") else "BB"))
    for garbage in ("", "coevo_", "nope", f"coevo_{token.prefix}", "Bearer x"):
        with pytest.raises(NotAuthenticated):
            token_authenticate(raw=garbage)


def test_it_refuses_revoked_and_expired_tokens(owner):
    token, raw = _create(owner)
    assert token_revoke(token=token) is True
    assert token_revoke(token=token) is False
    with pytest.raises(NotAuthenticated, match="revoked"):
        token_authenticate(raw=raw)
    token, raw = _create(owner, expires_at=timezone.now() + timedelta(hours=1))
    ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    with pytest.raises(NotAuthenticated, match="expired"):
        token_authenticate(raw=raw)


def test_it_refuses_the_token_of_an_inactive_user(owner):
    _, raw = _create(owner)
    owner.is_active = False
    owner.save()
    with pytest.raises(NotAuthenticated):
        token_authenticate(raw=raw)


def test_it_never_gives_a_ci_token_the_approve_scope(project, reviewer):
    with pytest.raises(PermissionDenied, match="CI token"):
        _create(reviewer, scopes=["read", "promotions:approve"], kind=TokenKind.CI)
    assert not ApiToken.objects.exists()


def test_it_gives_the_approve_scope_only_to_reviewers(project, reviewer, outsider):
    token, _ = _create(reviewer, scopes=["promotions:approve", "read"])
    assert token.scopes == ["read", "promotions:approve"]
    with pytest.raises(PermissionDenied, match="reviewers"):
        _create(outsider, scopes=["promotions:approve"])


def test_it_refuses_unknown_or_no_scopes_and_a_blank_name(owner):
    with pytest.raises(InvalidInput, match="Unknown scope"):
        _create(owner, scopes=["read", "root"])
    with pytest.raises(InvalidInput):
        _create(owner, scopes=[])
    with pytest.raises(InvalidInput, match="name"):
        token_create(user=owner, name=" ", kind="personal", scopes=["read"], created_by=owner)
    with pytest.raises(InvalidInput, match="kind"):
        _create(owner, kind="robot")
    assert not ApiToken.objects.exists()
