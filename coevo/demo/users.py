"""The demo's project, and its logins: ``demo`` (an admin, who runs the campaign and requests the promotion)
and ``reviewer`` (who approves it). Each password is made once and kept in COEVO_HOME.

Imported once Django is set up (``coevo.demo.run``).
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model

from coevo.projects.models import Project
from coevo.projects.services import membership_set, project_describe, project_get_or_create

# What the demo covers: it evaluates HumanEval and runs its campaign on TextWorld games; the
# shipped workspace suite imports into the same project (README.md, Suites).
DEMO_DESCRIPTION = (
    "Evolving an agent harness on HumanEval (code), TextWorld (text games) and workspace "
    "tasks (files and shell commands judged by hidden tests; import them with "
    "manage.py suite_import --project demo workspace)."
)


def demo_project() -> Project:
    """The ``demo`` project, its description brought up to date in a home made by an earlier
    release (it said HumanEval only)."""
    project = project_get_or_create(slug="demo", name="Demo agent", description=DEMO_DESCRIPTION)
    return project_describe(project=project, description=DEMO_DESCRIPTION)


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


__all__ = ["DEMO_DESCRIPTION", "demo_project", "demo_user"]
