from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet

from coevo.errors import NotFound
from coevo.projects.models import Project


def project_list_for_user(*, user: AbstractBaseUser) -> QuerySet[Project]:
    """The projects a user may see: those they are a member of (staff see all)."""
    if not user.is_authenticated:
        return Project.objects.none()
    if user.is_staff:
        return Project.objects.all()
    return Project.objects.filter(memberships__user=user).distinct()


def project_get_for_user(*, user: AbstractBaseUser, slug: str) -> Project:
    project = project_list_for_user(user=user).filter(slug=slug).first()
    if project is None:
        # Same answer for "does not exist" and "not yours": no project names leak.
        raise NotFound(f"No project {slug!r} that you are a member of.")
    return project
