"""The demo's first step: the HumanEval seed harness evaluated on a few search tasks.

Imported once Django is set up (``coevo.demo.run``).
"""

from __future__ import annotations

import time
from typing import Any

from coevo.config import BASE_DIR
from coevo.demo.processes import Services, say
from coevo.demo.progress import HEARTBEAT_S, progress_step
from coevo.evaluations.models import Evaluation
from coevo.evaluations.selectors import evaluation_progress
from coevo.evaluations.services import evaluation_create
from coevo.policies.services import policy_version_get_default
from coevo.projects.models import Project
from coevo.suites.models import Split
from coevo.suites.services import suite_import_humaneval
from harness_store.services import candidate_import_directory

SEED_HARNESS = BASE_DIR / "examples" / "humaneval-basic"


def demo_evaluation(*, project: Project, user: Any, tasks: int) -> Evaluation:
    candidate, created = candidate_import_directory(
        project=project,
        directory=SEED_HARNESS,
        message="Seed harness: plain completion for a base model",
        author_name="coevo demo",
        author_email="demo@localhost",
        created_by=user,
    )
    say(f"seed harness {'imported as' if created else 'already imported:'} {candidate.short_sha}")
    suite, created = suite_import_humaneval(project=project)
    say(f"HumanEval suite {'imported' if created else 'already imported'} ({suite.version})")
    return evaluation_create(
        candidate=candidate,
        suite=suite,
        split=Split.SEARCH,
        policy_version=policy_version_get_default(),
        task_limit=tasks,
        created_by=user,
    )


def wait_for_evaluation(
    evaluation: Evaluation, services: Services, *, every_s: float = HEARTBEAT_S
) -> None:
    with progress_step(
        "HumanEval evaluation", waiting_on="waiting for the worker", every_s=every_s
    ) as step:
        while True:
            services.check_alive()
            evaluation.refresh_from_db()
            progress = evaluation_progress(evaluation=evaluation)
            step.update(
                f"{progress.done}/{progress.total} rollouts done, {progress.passed} passed, "
                f"{progress.harness_errors} harness errors, {progress.infra_errors} infra errors"
            )
            if evaluation.is_final:
                return
            time.sleep(1)


def evaluation_summary(evaluation: Evaluation, elapsed_s: float) -> str:
    progress = evaluation_progress(evaluation=evaluation)
    score = progress.score
    if score.mean is None:
        score_text = "score n/a (no scored rollouts)"
    else:
        score_text = (
            f"score {score.mean:.1%} [95% CI {score.interval.low:.1%}–{score.interval.high:.1%}]"
        )
    minutes, seconds = divmod(int(elapsed_s), 60)
    return (
        f"Summary: {score_text} · {progress.passed}/{progress.total} tasks passed"
        f" ({progress.harness_errors} harness errors, {progress.infra_errors} infra errors)"
        f" · {progress.total_tokens:,} tokens · {minutes}m{seconds:02d}s"
    )
