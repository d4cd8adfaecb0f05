from django.contrib.auth.models import AbstractBaseUser

from coevo.projects.models import Membership, Project, Role


def project_get_or_create(*, slug: str, name: str, description: str = "") -> Project:
    project, _ = Project.objects.get_or_create(
        slug=slug, defaults={"name": name, "description": description}
    )
    return project


def membership_set(*, project: Project, user: AbstractBaseUser, role: Role) -> Membership:
    membership, _ = Membership.objects.update_or_create(
        project=project, user=user, defaults={"role": role}
    )
    return membership
