"""Who a read is for, so that a selector able to return held-out rows seals them by itself
(docs/architecture.md, "The held-out seal").

Every such selector takes a required ``audience`` (no default): a new page or endpoint cannot
take a default that lets held-out results through; it has to say who reads them.
"""

from __future__ import annotations

import enum

from django.contrib.auth.models import AbstractBaseUser

from coevo.projects.models import Project, Role
from coevo.projects.selectors import project_user_has_role


class Audience(enum.Enum):
    # Any member, whatever their role, on every page and API answer outside a promotion
    # request's review (reviewers included: a held-out evaluation page is 404 to them too).
    MEMBER = "member"
    # A reviewer reading a promotion request's evidence, on its review pages or with a personal
    # API token: the held-out rows of that request are theirs to judge.
    REVIEWER = "reviewer"

    @property
    def sees_heldout(self) -> bool:
        return self is Audience.REVIEWER


def audience_for_review(*, project: Project, user: AbstractBaseUser) -> Audience:
    """The audience of a promotion request's review pages: REVIEWER for the project's
    reviewers (and above), MEMBER for everyone else."""
    if project_user_has_role(project=project, user=user, role=Role.REVIEWER):
        return Audience.REVIEWER
    return Audience.MEMBER
