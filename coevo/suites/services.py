from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from coevo.audit.services import audit_record
from coevo.projects.models import Project
from coevo.suites.humaneval import VERSION, humaneval_problems
from coevo.suites.jsonl import (
    ScorerSpec,
    SuiteImportError,
    jsonl_content_hash,
    jsonl_tasks_parse,
)
from coevo.suites.models import Suite, SuiteInUse, SuiteKind, Task
from coevo.suites.splits import split_for

# The Python verifier's source is copied into every task's verifier payload.
MAX_VERIFIER_COPIES_BYTES = 512 * 1024**2
SUITE_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")


def suite_import_humaneval(
    *, project: Project, split_seed: str = "0", actor: AbstractBaseUser | None = None
) -> tuple[Suite, bool]:
    """Import HumanEval into a project; importing the same data and seed again returns it."""
    problems, content_hash = humaneval_problems()
    existing = Suite.objects.filter(
        project=project, name="humaneval", content_hash=content_hash, split_seed=split_seed
    ).first()
    if existing:
        return existing, False
    with transaction.atomic():
        suite = Suite.objects.create(
            project=project,
            name="humaneval",
            kind=SuiteKind.HUMANEVAL,
            version=VERSION,
            content_hash=content_hash,
            split_seed=split_seed,
            description="HumanEval (Chen et al. 2021): 164 Python function-completion problems; "
            "scored by the hidden unit tests.",
        )
        Task.objects.bulk_create(
            Task(
                suite=suite,
                key=problem.task_id,
                split=split_for(problem.task_id, seed=split_seed),
                position=position,
                inputs={"prompt": problem.prompt, "entry_point": problem.entry_point},
                verifier={"test": problem.test, "entry_point": problem.entry_point},
            )
            for position, problem in enumerate(problems)
        )
        suite_audit(actor=actor, suite=suite, action="suite.imported")
    return suite, True


def suite_import_jsonl(
    *,
    project: Project,
    name: str,
    data: bytes,
    scorer: ScorerSpec,
    description: str = "",
    split_seed: str = "0",
    actor: AbstractBaseUser | None = None,
) -> tuple[Suite, bool]:
    """Import a custom suite from JSONL bytes; returns (suite, created).

    The same content, scorer and seed under the same name returns the existing suite; changed
    content becomes a new version (v1, v2, … per name) and the older versions stay as they were.
    Raises SuiteImportError listing every problem (each naming its line and field).
    """
    if not SUITE_NAME.match(name):
        raise SuiteImportError(
            [
                f"name: {name!r} is not a valid suite name; use 1 to 64 lowercase letters, digits, "
                "'-' or '_', starting with a letter or digit"
            ]
        )
    if not split_seed or len(split_seed) > 64:
        raise SuiteImportError(["split seed: it must be 1 to 64 characters"])
    tasks = jsonl_tasks_parse(data=data, scorer=scorer)
    copies = len(tasks) * len(scorer.verifier_source.encode())
    if copies > MAX_VERIFIER_COPIES_BYTES:
        raise SuiteImportError(
            [
                f"verifier: its source is stored with each of the {len(tasks)} tasks (workers "
                f"share no disk), {copies // 1024**2} MiB in all, over the "
                f"{MAX_VERIFIER_COPIES_BYTES // 1024**2} MiB limit; make the verifier smaller"
            ]
        )
    content_hash = jsonl_content_hash(tasks=tasks, scorer=scorer)
    worker_scorer = scorer.for_worker()
    return suite_version_create(
        project=project,
        name=name,
        kind=SuiteKind.JSONL,
        noun="this custom suite",
        content_hash=content_hash,
        split_seed=split_seed,
        description=description.strip(),
        scorer=scorer.public(),
        actor=actor,
        tasks=lambda suite: (
            Task(
                suite=suite,
                key=task.key,
                split=task.split or split_for(task.key, seed=split_seed),
                position=position,
                inputs={"input": task.input, "metadata": task.metadata},
                # The verifier's source travels with each task: workers share no disk.
                verifier={"scorer": worker_scorer, "expected": task.expected},
            )
            for position, task in enumerate(tasks)
        ),
    )


def suite_version_create(
    *,
    project: Project,
    name: str,
    kind: SuiteKind,
    noun: str,
    content_hash: str,
    split_seed: str,
    description: str,
    scorer: dict[str, Any],
    actor: AbstractBaseUser | None,
    tasks: Callable[[Suite], Iterable[Task]],
    batch_size: int = 1000,
) -> tuple[Suite, bool]:
    """A named suite's next version (v1, v2, … per name) with its tasks, or the existing one
    holding the same content and seed (created False). Refused when the name belongs to a
    suite of another kind (``noun`` names what is imported, in the message)."""
    with transaction.atomic():
        # Imports into one project take turns, so two uploads cannot both become "v3".
        Project.objects.select_for_update().filter(pk=project.pk).first()
        existing = Suite.objects.filter(
            project=project, name=name, content_hash=content_hash, split_seed=split_seed
        ).first()
        if existing:
            return existing, False
        same_name = Suite.objects.filter(project=project, name=name)
        other_kind = same_name.exclude(kind=kind).first()
        if other_kind:
            raise SuiteImportError(
                [
                    f"name: the project already has a {other_kind.get_kind_display()} suite named "
                    f"{name!r}; choose another name for {noun}"
                ]
            )
        suite = Suite.objects.create(
            project=project,
            name=name,
            kind=kind,
            version=f"v{same_name.count() + 1}",
            content_hash=content_hash,
            split_seed=split_seed,
            description=description,
            scorer=scorer,
        )
        Task.objects.bulk_create(tasks(suite), batch_size=batch_size)
        suite_audit(actor=actor, suite=suite, action="suite.imported")
    return suite, True


def suite_audit(*, actor: AbstractBaseUser | None, suite: Suite, action: str) -> None:
    state = {
        "name": suite.name,
        "version": suite.version,
        "kind": suite.kind,
        "content_hash": suite.content_hash,
        "split_seed": suite.split_seed,
    }
    deleted = action == "suite.deleted"
    audit_record(
        actor=actor,
        project=suite.project,
        action=action,
        target=suite,
        before=state if deleted else None,
        after=None if deleted else state,
    )


def suite_delete(*, suite: Suite, actor: AbstractBaseUser | None = None) -> None:
    """Delete a suite no evaluation has used (raises SuiteInUse otherwise)."""
    with transaction.atomic():
        locked = Suite.objects.select_for_update().get(pk=suite.pk)
        if locked.is_used:
            raise SuiteInUse(
                f"Suite {locked} has been used by an evaluation and cannot be deleted: its "
                "evaluations' scores refer to its tasks."
            )
        suite_audit(actor=actor, suite=locked, action="suite.deleted")
        locked.delete()
