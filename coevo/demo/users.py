"""The demo's logins: ``demo`` (an admin, who runs the campaign and requests the promotion)
and ``reviewer`` (who approves it). Each password is made once and kept in COEVO_HOME.

Imported once Django is set up (``coevo.demo.run``).
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model

from coevo.projects.models import Project
from coevo.projects.services import membership_set


def demo_user(*, project: Project, home: Path, username: str, role: str) -> tuple[Any, str]:
    """The user ``username`` with ``role`` in ``project``, and its password."""
    password_file = home / f"{username}-password"
    if not password_file.exists():
        password_file.write_text(secrets.token_urlsafe(9))
        password_file.chmod(0o600)
    password = password_file.read_text().strip()
    user, _ = get_user_model().objects.get_or_create(
        username=username, defaults={"email": f"{username}@localhost"}
    )
    user.set_password(password)
    user.save()
    membership_set(project=project, user=user, role=role)
    return user, password


__all__ = ["demo_user"]
