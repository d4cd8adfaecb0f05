from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Q, QuerySet

from coevo.errors import InvalidInput, NotFound
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


def membership_list(*, project: Project) -> list[Membership]:
    """The project's members with their users, highest role first, then by username."""
    members = Membership.objects.filter(project=project).select_related("user")
    return sorted(members, key=lambda m: (-ROLE_ORDER.index(Role(m.role)), m.user.username))


def project_member_get(*, project: Project, username: str) -> AbstractBaseUser:
    """The member of the project with this username."""
    membership = (
        Membership.objects.select_related("user")
        .filter(project=project, user__username=username)
        .first()
    )
    if membership is None:
        raise NotFound(f"{username!r} is not a member of {project.slug}.")
    return membership.user


def user_find_active(*, identifier: str) -> AbstractBaseUser:
    """The one active user whose username or email is ``identifier`` (either case), for an
    admin adding a member by what they know of them."""
    identifier = identifier.strip()
    if not identifier:
        raise InvalidInput("Give a username or an email address.")
    users = list(
        get_user_model()
        .objects.filter(Q(username__iexact=identifier) | Q(email__iexact=identifier))
        .filter(is_active=True)[:2]
    )
    if len(users) != 1:
        # One message for "none" and "several": no hint about which accounts exist.
        raise NotFound(f"No single active user with username or email {identifier!r}.")
    return users[0]
