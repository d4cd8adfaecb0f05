from __future__ import annotations

from django.db import transaction

from coevo.projects.models import Project
from coevo.suites.humaneval import VERSION, humaneval_problems
from coevo.suites.models import Suite, SuiteKind, Task
from coevo.suites.splits import split_for


def suite_import_humaneval(*, project: Project, split_seed: str = "0") -> tuple[Suite, bool]:
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
    return suite, True
