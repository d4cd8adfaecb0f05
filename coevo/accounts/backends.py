"""The authentication backend: Django's ModelBackend behind the login throttle.

Every password check that goes through ``django.contrib.auth.authenticate`` comes here: the
login page, the admin's login, and any API authentication that accepts a password (coevo's
API takes bearer tokens only). So the throttle cannot be bypassed by picking another door.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest

from coevo.accounts.login_throttle import (
    client_address,
    login_block_get,
    login_failure_record,
    login_success_record,
)


class ThrottledModelBackend(ModelBackend):
    def authenticate(
        self,
        request: HttpRequest | None,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ) -> AbstractBaseUser | None:
        if username is None:
            username = kwargs.get(get_user_model().USERNAME_FIELD)
        if username is None or password is None:
            return None
        address = client_address(request)
        if login_block_get(username=username, address=address) is not None:
            # Refused before the password is checked, even a right one. PermissionDenied
            # (not None) makes authenticate() stop here instead of trying another backend.
            raise PermissionDenied
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is None:
            login_failure_record(username=username, address=address)
        else:
            login_success_record(username=username)
        return user
