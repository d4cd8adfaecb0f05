"""Workspace suites from Harbor-format task directories (https://harborframework.com/docs/tasks).

A task is a directory: ``instruction.md`` (what the harness is asked), ``task.toml`` (timeouts
and metadata), ``environment/`` (a Dockerfile and its build context: the starting files),
``tests/`` (``test.sh`` writes the reward) and optionally ``solution/solve.sh``. A task whose
Dockerfile is *files-only* runs in the bwrap sandbox, its starting workspace what the
Dockerfile copies into ``/app`` (coevo/suites/dockerfile.py). A task whose environment needs
its container (RUN, a prebuilt ``docker_image``) is stored as it is when the container backend
is on (``COEVO_CONTAINER_BACKEND``, read here for every import: the web process and the
command line alike), and otherwise refused unless ``allow_dockerfile``, which takes its copied
files only; a compose file is refused either way (coevo/suites/harbor_tasks.py).
workers/environments/workspace.py runs what this writes:
``inputs = {"instruction", "files", "metadata", "agent_timeout_s"}``,
``verifier = {"tests", "solution", "timeout_s"}``, and for a container task also
``inputs["environment"]`` (coevo/suites/harbor_environment.py), ``verifier["env"]`` and
``verifier["solution_env"]``.

An import takes every task it can and reports the others (``HarborReport``): one broken task
does not stop a suite of hundreds, and the report says what was left out and why.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser

from coevo.projects.models import Project
from coevo.suites.harbor_tasks import HarborTask, TaskRefused, harbor_task_read
from coevo.suites.image_builds import ImageBuild, task_image_builds_record, task_image_prepare
from coevo.suites.jsonl import SuiteImportError
from coevo.suites.models import ImageBuildSource, Suite, SuiteKind, Task
from coevo.suites.services import SUITE_NAME, suite_version_create
from coevo.suites.splits import split_for
from harness_store.archives import archive_extract
from workers.environments.workspace import solution_check
from workers.environments.workspace_files import tree_hash

MAX_TASKS = 500
MAX_SUITE_BYTES = 256 * 1024**2
# What the check keeps of a failing solution's output in the refusal.
MAX_OUTPUT_TAIL_CHARS = 800
# Part of every content hash: a change to what an import stores changes every suite's hash.
FORMAT = "harbor-workspace-1"

Progress = Callable[[int, int, str], Any]
# The shipped suite: a few small tasks whose environments are files-only.
WORKSPACE_DATA_DIR = Path(__file__).resolve().parent / "data" / "workspace"
WORKSPACE_SUITE_NAME = "workspace-basic"


@dataclass
class HarborReport:
    """What an import took, what it refused (task key, why) and what it warned about."""

    taken: list[str] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[tuple[str, str]] = field(default_factory=list)


def suite_import_harbor(
    *,
    project: Project,
    name: str,
    directory: Path,
    split_seed: str = "0",
    description: str = "",
    allow_dockerfile: bool = False,
    check_solutions: bool = False,
    actor: AbstractBaseUser | None = None,
    progress: Progress | None = None,
) -> tuple[Suite, bool, HarborReport]:
    """Import a directory of Harbor tasks (or one task directory) as a workspace suite.

    Returns (suite, created, report). Refused tasks are left out and listed in the report; when
    every task is refused, raises SuiteImportError listing each. The same tasks, seed and name
    return the existing suite; changed content becomes the next version (v1, v2, … per name).
    ``check_solutions`` runs each task's ``solution/solve.sh`` through the real verifier first
    (workers' sandbox; seconds to minutes a task) and refuses tasks whose solution fails.
    """
    _check_name(name, split_seed)
    report = HarborReport()
    tasks: list[HarborTask] = []
    total = 0
    for key, task_dir in _task_dirs(Path(directory)):
        try:
            task, warnings = harbor_task_read(
                key=key,
                directory=task_dir,
                allow_dockerfile=allow_dockerfile,
                container_backend=settings.COEVO_CONTAINER_BACKEND,
            )
        except TaskRefused as exc:
            report.refused.append((key, str(exc)))
            continue
        except OSError as exc:  # unreadable (permissions), or changed while it was read
            report.refused.append((key, f"cannot read it: {exc.strerror or exc}"))
            continue
        total += task.size
        if total > MAX_SUITE_BYTES:
            raise SuiteImportError(
                [
                    f"the tasks hold more than {MAX_SUITE_BYTES // 1024**2} MiB of files and "
                    f"text (reached at {key}); split them into several suites"
                ]
            )
        tasks.append(task)
        report.warnings.extend((key, warning) for warning in warnings)
    builds: list[tuple[str, ImageBuild]] = []
    if check_solutions:
        tasks = _check_solutions(tasks, report, progress, builds=builds)
    report.taken = [task.key for task in tasks]
    if not tasks:
        raise SuiteImportError(
            [f"{key}: {reason}" for key, reason in report.refused]
            or [f"{directory}: no task directories (each holds a task.toml) were found"]
        )
    content_hash = harbor_content_hash(tasks)
    description = description.strip() or (
        f"{len(tasks)} Harbor-format workspace tasks: the harness edits /app, hidden tests "
        "(tests/test.sh) judge what it leaves."
    )
    suite, created = _suite_create(
        project=project,
        name=name,
        tasks=tasks,
        content_hash=content_hash,
        split_seed=split_seed,
        description=description,
        actor=actor,
    )
    if builds:
        # The check's builds, now that their tasks have rows (the suite page shows them).
        rows = dict(Task.objects.filter(suite=suite).values_list("key", "id"))
        task_image_builds_record(
            builds=[(rows[key], build) for key, build in builds if key in rows],
            source=ImageBuildSource.SOLUTION_CHECK,
        )
    return suite, created, report


def suite_import_harbor_archive(
    *,
    project: Project,
    name: str,
    archive: bytes,
    split_seed: str = "0",
    description: str = "",
    allow_dockerfile: bool = False,
    actor: AbstractBaseUser | None = None,
) -> tuple[Suite, bool, HarborReport]:
    """``suite_import_harbor`` of an uploaded tar or tar.gz of the directory, unpacked by
    harness_store.archives (bounded, no links, no traversal). A single task archived without
    a folder around it takes the suite's name as its key. Solutions are not checked here: that
    runs untrusted code for minutes, which is the command line's job."""
    _check_name(name, split_seed)
    with tempfile.TemporaryDirectory(prefix="coevo-harbor-") as tmp:
        destination = Path(tmp) / name
        destination.mkdir()
        root = archive_extract(data=archive, destination=destination)
        return suite_import_harbor(
            project=project,
            name=name,
            directory=root,
            split_seed=split_seed,
            description=description,
            allow_dockerfile=allow_dockerfile,
            actor=actor,
        )


def suite_import_workspace_basic(
    *,
    project: Project,
    split_seed: str = "0",
    check_solutions: bool = False,
    actor: AbstractBaseUser | None = None,
    progress: Progress | None = None,
) -> tuple[Suite, bool, HarborReport]:
    """The shipped workspace tasks (coevo/suites/data/workspace/), imported as any Harbor
    directory is."""
    if not WORKSPACE_DATA_DIR.is_dir():
        raise SuiteImportError(
            [f"the shipped workspace tasks are missing from {WORKSPACE_DATA_DIR}; reinstall coevo"]
        )
    return suite_import_harbor(
        project=project,
        name=WORKSPACE_SUITE_NAME,
        directory=WORKSPACE_DATA_DIR,
        split_seed=split_seed,
        description="Small Harbor-format workspace tasks shipped with coevo: the harness edits "
        "files in /app, hidden tests (tests/test.sh) judge what it leaves.",
        check_solutions=check_solutions,
        actor=actor,
        progress=progress,
    )


def harbor_content_hash(tasks: list[HarborTask]) -> str:
    """SHA-256 of every task's stored content (trees by their hashes). The split seed is not
    in it: it is the suite's other identity column, as for JSONL suites. A container task's
    environment (its Dockerfile, build context, image and resources) and env maps are in it,
    so a changed Dockerfile is a new version; a files-only task has none, and its row is what
    it always was, so suites imported before the container backend keep their hashes."""
    digest = hashlib.sha256(FORMAT.encode())
    for task in sorted(tasks, key=lambda t: t.key):
        inputs, verifier = task.inputs, task.verifier
        row = [
            task.key,
            inputs["instruction"],
            inputs["metadata"],
            inputs["agent_timeout_s"],
            tree_hash(inputs["files"]),
            tree_hash(verifier["tests"]),
            tree_hash(verifier["solution"]),
            verifier["timeout_s"],
        ]
        if "environment" in inputs:
            environment = inputs["environment"]
            row.append({**environment, "context": tree_hash(environment["context"])})
            row.extend([verifier["env"], verifier["solution_env"]])
        digest.update(b"\n" + json.dumps(row, sort_keys=True, ensure_ascii=False).encode())
    return digest.hexdigest()


def _check_name(name: str, split_seed: str) -> None:
    if not SUITE_NAME.match(name):
        raise SuiteImportError(
            [
                f"name: {name!r} is not a valid suite name; use 1 to 64 lowercase letters, digits, "
                "'-' or '_', starting with a letter or digit"
            ]
        )
    if not split_seed or len(split_seed) > 64:
        raise SuiteImportError(["split seed: it must be 1 to 64 characters"])


def _task_dirs(directory: Path) -> list[tuple[str, Path]]:
    """(key, directory) of each task: ``directory`` itself when it holds a task.toml, else
    its subdirectories (hidden ones skipped), sorted."""
    if not directory.is_dir():
        raise SuiteImportError([f"{directory}: not a directory"])
    if (directory / "task.toml").exists():
        return [(directory.resolve().name, directory)]
    found: list[tuple[str, Path]] = []
    with os.scandir(directory) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            if entry.name.startswith(".") or not entry.is_dir():
                continue  # files beside the tasks (a README, a dataset.toml) are not tasks
            found.append((entry.name, Path(entry.path)))
            if len(found) > MAX_TASKS:
                raise SuiteImportError(
                    [
                        f"{directory}: more than {MAX_TASKS} task directories; split them into "
                        "several suites"
                    ]
                )
    return found


def _check_solutions(
    tasks: list[HarborTask],
    report: HarborReport,
    progress: Progress | None,
    *,
    builds: list[tuple[str, ImageBuild]],
) -> list[HarborTask]:
    """The tasks whose solution passes (and those without one); the others are refused.
    ``builds`` gets each image build the check ran, by task key."""
    checked = {task.key for task in tasks if "solve.sh" in task.verifier["solution"]}
    kept: list[HarborTask] = []
    done = 0
    for task in tasks:
        if task.key not in checked:
            report.warnings.append((task.key, "no solution/solve.sh: its tests were not checked"))
            kept.append(task)
            continue
        # The image first, as the check's workspaces would have it (they then find it built):
        # a build that ran is recorded for the suite's page.
        build = task_image_prepare(inputs=task.inputs)
        if build is not None:
            builds.append((task.key, build))
        check = solution_check(inputs=task.inputs, verifier=task.verifier)
        done += 1
        if progress:
            progress(done, len(checked), task.key)
        verdict = check.solution
        if verdict is not None and not verdict.passed:
            tail = verdict.output.strip()[-MAX_OUTPUT_TAIL_CHARS:]
            report.refused.append(
                (
                    task.key,
                    f"its solution does not pass its tests: {verdict.detail} (reward "
                    f"{verdict.score:g})" + (f"; the output ends:\n{tail}" if tail else ""),
                )
            )
            continue
        if check.start.passed:
            report.warnings.append(
                (
                    task.key,
                    "the untouched starting files already pass its tests: any harness scores "
                    "on it without doing anything",
                )
            )
        kept.append(task)
    return kept


def _suite_create(
    *,
    project: Project,
    name: str,
    tasks: list[HarborTask],
    content_hash: str,
    split_seed: str,
    description: str,
    actor: AbstractBaseUser | None,
) -> tuple[Suite, bool]:
    return suite_version_create(
        project=project,
        name=name,
        kind=SuiteKind.WORKSPACE,
        noun="these tasks",
        content_hash=content_hash,
        split_seed=split_seed,
        description=description,
        scorer={"kind": "tests", "runs": "bash tests/test.sh", "passed": "reward 1"},
        actor=actor,
        tasks=lambda suite: (
            Task(
                suite=suite,
                key=task.key,
                split=split_for(task.key, seed=split_seed),
                position=position,
                inputs=task.inputs,
                verifier=task.verifier,
            )
            for position, task in enumerate(sorted(tasks, key=lambda t: t.key))
        ),
        # A task can hold tens of MiB of files: small batches keep each statement far below
        # what one PostgreSQL message may carry (1 GiB).
        batch_size=20,
    )
