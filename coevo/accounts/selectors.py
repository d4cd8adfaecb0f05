"""Reads of API tokens."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet

from coevo.accounts.models import ApiToken
from coevo.errors import NotFound


def token_list_for_user(*, user: AbstractBaseUser) -> QuerySet[ApiToken]:
    """The user's own tokens, newest first (the secret hash is never needed to list them)."""
    return ApiToken.objects.filter(user=user).defer("secret_hash").order_by("-created_at")


def token_get_for_user(*, user: AbstractBaseUser, token_id: Any) -> ApiToken:
    try:
        return ApiToken.objects.get(user=user, id=token_id)
    except (ApiToken.DoesNotExist, ValueError, TypeError):
        raise NotFound("No such token of yours.") from None
