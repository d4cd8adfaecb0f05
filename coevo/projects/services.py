from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from coevo.audit.services import audit_record
from coevo.errors import InvalidInput, InvalidState, NotFound
from coevo.projects.models import Membership, Project, Role


def project_get_or_create(*, slug: str, name: str, description: str = "") -> Project:
    project, _ = Project.objects.get_or_create(
        slug=slug, defaults={"name": name, "description": description}
    )
    return project


def project_describe(*, project: Project, description: str) -> Project:
    """Set the project's description (no write when it already says that)."""
    if project.description != description:
        Project.objects.filter(id=project.id).update(description=description)
        project.description = description
    return project


def _refuse_last_admin(*, project: Project, user: AbstractBaseUser) -> None:
    """A project keeps at least one admin (someone must manage members); the caller holds
    the project row's lock so two admins cannot demote each other at once."""
    others = Membership.objects.filter(project=project, role=Role.ADMIN).exclude(user=user)
    if not others.exists():
        raise InvalidState(
            f"{user.get_username()} is the last admin of {project.slug}: make someone else "
            "an admin first."
        )


def membership_set(
    *,
    project: Project,
    user: AbstractBaseUser,
    role: Role,
    actor: AbstractBaseUser | None = None,
) -> Membership:
    """Give ``user`` the role on the project (adding them if needed); audited as
    ``member.added`` or ``member.role_changed`` with the role before and after."""
    with transaction.atomic():
        Project.objects.select_for_update().filter(pk=project.pk).first()
        current = Membership.objects.filter(project=project, user=user).first()
        if current is not None and current.role == role:
            return current
        if current is not None and current.role == Role.ADMIN:
            _refuse_last_admin(project=project, user=user)
        membership, _ = Membership.objects.update_or_create(
            project=project, user=user, defaults={"role": role}
        )
        audit_record(
            actor=actor,
            project=project,
            action="member.role_changed" if current is not None else "member.added",
            target=user,
            before={"role": current.role} if current is not None else None,
            after={"role": str(role)},
        )
    return membership


def membership_add(
    *,
    project: Project,
    user: AbstractBaseUser,
    role: Role,
    actor: AbstractBaseUser | None = None,
) -> Membership:
    """Add ``user`` to the project with the role; refused when they are already a member, so
    that adding someone twice never changes their role by accident (``membership_set`` changes
    it on purpose). Audited as ``member.added``."""
    with transaction.atomic():
        # The same lock as membership_set's: two admins adding one user cannot both pass.
        Project.objects.select_for_update().filter(pk=project.pk).first()
        if Membership.objects.filter(project=project, user=user).exists():
            raise InvalidInput(f"{user.get_username()} is already a member: change the role.")
        return membership_set(project=project, user=user, role=role, actor=actor)


def membership_remove(
    *, project: Project, user: AbstractBaseUser, actor: AbstractBaseUser | None = None
) -> None:
    """Remove ``user`` from the project (never its last admin); audited as ``member.removed``."""
    with transaction.atomic():
        Project.objects.select_for_update().filter(pk=project.pk).first()
        current = Membership.objects.filter(project=project, user=user).first()
        if current is None:
            raise NotFound(f"{user.get_username()} is not a member of {project.slug}.")
        if current.role == Role.ADMIN:
            _refuse_last_admin(project=project, user=user)
        current.delete()
        audit_record(
            actor=actor,
            project=project,
            action="member.removed",
            target=user,
            before={"role": current.role},
        )
