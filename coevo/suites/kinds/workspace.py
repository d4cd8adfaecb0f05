"""Workspace suites on the platform: Harbor-format tasks (coevo/suites/harbor.py), uploaded as
an archive on the dashboard, read from a directory by the command line, or the shipped
workspace-basic tasks from a button or the command line.

A task's inputs hold its starting files (megabytes, maybe), so a listing shows only its
instruction; a task may run in an image built from its own Dockerfile, whose builds the suite's
page shows."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from django import forms
from django.contrib.auth.models import AbstractBaseUser

from coevo.projects.models import Project
from coevo.suites.harbor import (
    suite_import_harbor,
    suite_import_harbor_archive,
    suite_import_workspace_basic,
)
from coevo.suites.kinds.base import (
    CommandImport,
    Imported,
    PlatformKind,
    Progress,
    ShippedImport,
    UploadImport,
    register_suite_kind,
    split_seed_argument,
)
from coevo.suites.models import SuiteKind


class HarborImportForm(forms.Form):
    name = forms.SlugField(max_length=64, help_text="lowercase letters, digits, - and _")
    file = forms.FileField(
        help_text="a tar.gz of a directory of Harbor task directories (or of one task)"
    )
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    split_seed = forms.CharField(max_length=64, initial="0", required=False)
    allow_dockerfile = forms.BooleanField(
        required=False,
        help_text="take tasks that need their container (a Dockerfile that runs commands, a "
        "prebuilt image) with only the files their Dockerfile copies; without it they are "
        "refused, unless the container backend is on (COEVO_CONTAINER_BACKEND), which imports "
        "them as they are",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Its fields share names with other forms' on the same page; their ids may not.
        kwargs.setdefault("auto_id", "harbor_%s")
        super().__init__(*args, **kwargs)


DESCRIPTION = (
    "A tar.gz of a directory of Harbor-format task directories (or of one task): "
    "<code>instruction.md</code>, <code>task.toml</code>, <code>tests/test.sh</code>, "
    "<code>environment/Dockerfile</code> (only the files it copies into <code>/app</code> are "
    "used), optional <code>solution/solve.sh</code>. Tasks that cannot be taken are listed after "
    "the import; solutions are checked only from the command line (<code>suite_import harbor "
    "--check-solutions</code>). At most {max_megabytes} MB."
)


def _upload_run(*, project: Project, data: dict[str, Any], actor: AbstractBaseUser) -> Imported:
    # The upload is bounded already (the import page); the archive's content is bounded while
    # it is unpacked (harness_store.archives).
    return Imported(
        *suite_import_harbor_archive(
            project=project,
            name=data["name"],
            archive=data["file"].read(),
            split_seed=data["split_seed"] or "0",
            description=data["description"],
            allow_dockerfile=data["allow_dockerfile"],
            actor=actor,
        )
    )


def _shipped_run(*, project: Project, actor: AbstractBaseUser) -> Imported:
    return Imported(*suite_import_workspace_basic(project=project, actor=actor))


def _check_solutions_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--check-solutions",
        action="store_true",
        help="run each task's solution/solve.sh through its tests in the sandbox first; refuse "
        "tasks whose solution fails (seconds to minutes a task)",
    )


def _harbor_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "directory",
        type=Path,
        metavar="DIR",
        help="a directory of Harbor task directories, or one task directory (with task.toml)",
    )
    parser.add_argument("--name", required=True, help="suite name (lowercase, digits, - and _)")
    parser.add_argument("--description", default="", help="what the suite measures")
    split_seed_argument(parser)
    parser.add_argument(
        "--allow-dockerfile",
        action="store_true",
        help="take tasks that need their container (RUN, a docker_image, ...) with only the "
        "files their Dockerfile copies into /app, instead of refusing them; with the container "
        "backend on (COEVO_CONTAINER_BACKEND=1) they are imported as they are without it",
    )
    _check_solutions_argument(parser)


def _harbor_run(*, project: Project, options: dict[str, Any], progress: Progress) -> Imported:
    return Imported(
        *suite_import_harbor(
            project=project,
            name=options["name"],
            directory=options["directory"],
            split_seed=options["split_seed"],
            description=options["description"],
            allow_dockerfile=options["allow_dockerfile"],
            check_solutions=options["check_solutions"],
            progress=progress,
        )
    )


def _workspace_arguments(parser: argparse.ArgumentParser) -> None:
    split_seed_argument(parser)
    _check_solutions_argument(parser)


def _workspace_run(*, project: Project, options: dict[str, Any], progress: Progress) -> Imported:
    return Imported(
        *suite_import_workspace_basic(
            project=project,
            split_seed=options["split_seed"],
            check_solutions=options["check_solutions"],
            progress=progress,
        )
    )


@register_suite_kind
class WorkspaceKind(PlatformKind):
    kind = SuiteKind.WORKSPACE
    commands = (
        CommandImport(
            "harbor",
            "a workspace suite from a directory of Harbor-format tasks (docs/workspace-suites.md)",
            _harbor_arguments,
            _harbor_run,
        ),
        CommandImport(
            "workspace",
            "the shipped Harbor-format workspace tasks, as suite workspace-basic",
            _workspace_arguments,
            _workspace_run,
        ),
    )
    shipped = (ShippedImport("workspace", "Import workspace-basic", _shipped_run),)
    uploads = (
        UploadImport("harbor", "Harbor tasks (tar.gz)", HarborImportForm, DESCRIPTION, _upload_run),
    )
    listed_input = "instruction"
    task_images = True
