"""Creating, revoking and checking API tokens."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import datetime, timedelta

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.utils import timezone

from coevo.accounts.models import (
    PERSONAL_ONLY_SCOPES,
    SCOPES,
    TOKEN_PREFIX_LENGTH,
    ApiToken,
    TokenKind,
)
from coevo.audit.services import audit_record
from coevo.errors import InvalidInput, NotAuthenticated, PermissionDenied
from coevo.projects.models import Membership, Role

TOKEN_LABEL = "coevo"
# last_used_at is for people ("is this token still in use?"): writing it on every request
# would turn each read into a write, so it moves at most once a minute.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def token_hash(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def token_scopes_validate(*, user: AbstractBaseUser, kind: str, scopes: list[str]) -> list[str]:
    """The scopes, de-duplicated in SCOPES order; raises when they are unknown or not allowed."""
    if kind not in TokenKind.values:
        raise InvalidInput(
            f"Unknown token kind {kind!r}: use one of {', '.join(TokenKind.values)}."
        )
    if not isinstance(scopes, (list, tuple)) or not scopes:
        raise InvalidInput("Give the token at least one scope.")
    unknown = sorted({str(scope) for scope in scopes} - set(SCOPES))
    if unknown:
        raise InvalidInput(
            f"Unknown scope(s) {', '.join(unknown)}: use some of {', '.join(SCOPES)}."
        )
    chosen = [scope for scope in SCOPES if scope in scopes]
    for scope in PERSONAL_ONLY_SCOPES:
        if scope not in chosen:
            continue
        if kind != TokenKind.PERSONAL:
            raise PermissionDenied(
                f"A CI token cannot hold {scope}: approvals are made by people, with their "
                "personal tokens."
            )
        if not _is_reviewer_somewhere(user):
            raise PermissionDenied(
                f"{scope} is only for reviewers: {user} is not a reviewer or admin of any project."
            )
    return chosen


def _is_reviewer_somewhere(user: AbstractBaseUser) -> bool:
    if user.is_staff:
        return True
    return Membership.objects.filter(user=user, role__in=[Role.REVIEWER, Role.ADMIN]).exists()


def token_create(
    *,
    user: AbstractBaseUser,
    name: str,
    kind: str,
    scopes: list[str],
    created_by: AbstractBaseUser | None,
    expires_at: datetime | None = None,
) -> tuple[ApiToken, str]:
    """Create a token; returns it with its plaintext, which is never stored nor shown again."""
    name = (name or "").strip()
    if not name:
        raise InvalidInput("Give the token a name (e.g. where it is used).")
    if len(name) > 100:
        raise InvalidInput("A token name is at most 100 characters.")
    if expires_at is not None and expires_at <= timezone.now():
        raise InvalidInput("The expiry date is in the past.")
    chosen = token_scopes_validate(user=user, kind=kind, scopes=scopes)
    for _ in range(5):
        prefix = secrets.token_hex(TOKEN_PREFIX_LENGTH // 2)
        raw = f"{TOKEN_LABEL}_{prefix}_{secrets.token_urlsafe(32)}"
        try:
            with transaction.atomic():
                token = ApiToken.objects.create(
                    user=user,
                    name=name,
                    kind=kind,
                    prefix=prefix,
                    secret_hash=token_hash(raw),
                    scopes=chosen,
                    created_by=created_by,
                    expires_at=expires_at,
                )
                audit_record(
                    actor=created_by,
                    project=None,
                    action="token.created",
                    target=token,
                    after={"user": user.get_username(), "kind": kind, "scopes": chosen},
                )
        except IntegrityError:
            # Another token drew the same 32-bit prefix: draw again.
            continue
        return token, raw
    raise InvalidInput("Could not draw an unused token prefix; try again.")


def token_revoke(*, token: ApiToken, actor: AbstractBaseUser | None = None) -> bool:
    """Revoke the token (at once, for every later request); False if it already was.

    ``actor`` defaults to the token's user (the dashboard lets users revoke only their own)."""
    now = timezone.now()
    with transaction.atomic():
        moved = ApiToken.objects.filter(id=token.id, revoked_at__isnull=True).update(revoked_at=now)
        if moved == 1:
            audit_record(
                actor=actor if actor is not None else token.user,
                project=None,
                action="token.revoked",
                target=token,
                before={"revoked_at": None},
                after={"revoked_at": now},
            )
    token.refresh_from_db(fields=["revoked_at"])
    return moved == 1


def token_authenticate(*, raw: str) -> ApiToken:
    """The live token for ``raw``; raises NotAuthenticated for anything else.

    The prefix finds the row; the hash of the whole token is compared in constant time so the
    time taken says nothing about how much of a guessed secret was right.
    """
    parts = (raw or "").strip().split("_", 2)
    if len(parts) != 3 or parts[0] != TOKEN_LABEL or len(parts[1]) != TOKEN_PREFIX_LENGTH:
        raise NotAuthenticated("That is not a coevo API token (coevo_<prefix>_<secret>).")
    token = ApiToken.objects.select_related("user").filter(prefix=parts[1]).first()
    # Compare even when no row matched, so unknown prefixes take the same time as known ones.
    expected = token.secret_hash if token is not None else "0" * 64
    if not hmac.compare_digest(expected, token_hash(raw.strip())) or token is None:
        raise NotAuthenticated("Unknown API token: check it, or create a new one.")
    now = timezone.now()
    if token.revoked_at is not None:
        raise NotAuthenticated("This API token was revoked: create a new one.")
    if token.expires_at is not None and token.expires_at <= now:
        raise NotAuthenticated("This API token has expired: create a new one.")
    if not token.user.is_active:
        raise NotAuthenticated("This API token's user is inactive.")
    if token.last_used_at is None or token.last_used_at < now - LAST_USED_RESOLUTION:
        ApiToken.objects.filter(id=token.id).update(last_used_at=now)
        token.last_used_at = now
    return token
