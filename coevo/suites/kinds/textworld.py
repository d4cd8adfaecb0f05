"""TextWorld's suites on the platform: the shipped games (coevo/suites/textworld.py), from a
button with their defaults or from the command line with their options."""

from __future__ import annotations

import argparse
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
from coevo.suites.textworld import suite_import_textworld


def _arguments(parser: argparse.ArgumentParser) -> None:
    split_seed_argument(parser)
    parser.add_argument(
        "--free-text",
        action="store_true",
        help="do not offer the admissible commands to the harness",
    )
    parser.add_argument("--max-steps", type=int, default=50, help="steps per game (default 50)")


def _command_run(*, project: Project, options: dict[str, Any], progress: Progress) -> Imported:
    suite, created = suite_import_textworld(
        project=project,
        split_seed=options["split_seed"],
        admissible_commands=not options["free_text"],
        max_steps=options["max_steps"],
    )
    return Imported(suite, created)


def _shipped_run(*, project: Project, actor: AbstractBaseUser) -> Imported:
    return Imported(*suite_import_textworld(project=project, actor=actor))


@register_suite_kind
class TextWorldKind(PlatformKind):
    kind = SuiteKind.TEXTWORLD
    commands = (
        CommandImport(
            "textworld",
            "the 60 bundled TextWorld games (tw-cooking and tw-simple levels)",
            _arguments,
            _command_run,
        ),
    )
    shipped = (ShippedImport("textworld", "Import TextWorld", _shipped_run),)
