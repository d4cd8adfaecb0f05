from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet

from coevo.errors import NotFound
from coevo.projects.models import ROLE_ORDER, Membership, Project, Role


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


def project_user_has_role(*, project: Project, user: AbstractBaseUser, role: Role) -> bool:
    """Whether the user's role on the project is ``role`` or above (staff: always)."""
    if not user.is_authenticated:
        return False
    if user.is_staff:
        return True
    actual = (
        Membership.objects.filter(project=project, user=user).values_list("role", flat=True).first()
    )
    return actual is not None and ROLE_ORDER.index(Role(actual)) >= ROLE_ORDER.index(role)
