"""Reading training runs for pages and the API, and who may see a trainer's command."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet

from coevo.errors import NotFound, PermissionDenied
from coevo.projects.models import Membership, Project
from coevo.training.models import Trainer, TrainingRun


def training_run_list(*, project: Project) -> QuerySet[TrainingRun]:
    return (
        TrainingRun.objects.filter(project=project)
        .select_related("trainer", "export", "parent_policy", "policy_version", "created_by")
        .defer("log_tail")
    )


def training_run_get(*, project: Project, run_id: Any) -> TrainingRun:
    run = (
        TrainingRun.objects.filter(project=project, id=run_id)
        .select_related(
            "project", "trainer", "export", "parent_policy", "policy_version", "created_by"
        )
        .first()
    )
    if run is None:
        raise NotFound(f"No training run {run_id} in project {project.slug}.")
    return run


def trainer_list_for_user(*, user: AbstractBaseUser) -> QuerySet[Trainer]:
    """The trainers, for a member of some project (or staff): campaigns name them, and only
    members start campaigns. Only the columns shown: the command and environment stay in the
    database."""
    if not user.is_authenticated or not (
        user.is_staff or Membership.objects.filter(user=user).exists()
    ):
        raise PermissionDenied(
            "Trainers are listed to project members: ask a project's admin to add you."
        )
    return Trainer.objects.only(
        "id", "name", "description", "time_limit_s", "enabled", "created_at"
    )


def trainer_list_enabled() -> QuerySet[Trainer]:
    """The trainers a campaign may name for its policy steps: the enabled ones, by name."""
    return Trainer.objects.filter(enabled=True)


def trainer_command_visible(*, user: AbstractBaseUser) -> bool:
    """Whether ``user`` may see a trainer's command (and a run's argv): the operators who can
    already read trainers in the admin. Project members only name trainers (docs/threat-model.md):
    an argv can carry internal hosts, paths or credentials the operator put there."""
    return bool(
        user.is_authenticated
        and user.is_active
        and user.is_staff
        and user.has_perm("training.view_trainer")
    )


def training_run_legacy_command_line(*, run: TrainingRun) -> bytes:
    """The first line older coevo versions wrote into a run's log: the whole argv."""
    if not run.command:
        return b""
    return f"$ {' '.join(str(arg) for arg in run.command)}\n".encode()


def training_run_log_tail_for(*, run: TrainingRun, user: AbstractBaseUser) -> str:
    """The log tail as ``user`` may read it: without an old run's argv line unless they may see
    the command."""
    line = training_run_legacy_command_line(run=run).decode()
    if line and run.log_tail.startswith(line) and not trainer_command_visible(user=user):
        return run.log_tail[len(line) :]
    return run.log_tail
