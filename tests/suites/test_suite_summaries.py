"""suite_summaries: task counts per split and evaluation counts, each right, with no row
multiplication between tasks and evaluations."""

from __future__ import annotations

import pytest

from coevo.evaluations.models import Evaluation
from coevo.suites.models import Split, Suite
from coevo.suites.selectors import suite_summaries

pytestmark = pytest.mark.django_db


def test_it_counts_tasks_by_split_and_evaluations(
    project, humaneval_suite, seed_candidate, policy_version
):
    for split in (Split.SEARCH, Split.VALIDATION):
        Evaluation.objects.create(
            project=project, candidate=seed_candidate, policy_version=policy_version,
            suite=humaneval_suite, split=split,
        )  # fmt: skip
    empty = Suite.objects.create(project=project, name="empty", version="1")

    rows = {suite.id: suite for suite in suite_summaries(project=project)}
    tasks = humaneval_suite.tasks
    got = rows[humaneval_suite.id]
    assert (got.task_count, got.search_count, got.validation_count, got.heldout_count) == (
        tasks.count(),
        tasks.filter(split=Split.SEARCH).count(),
        tasks.filter(split=Split.VALIDATION).count(),
        tasks.filter(split=Split.HELDOUT).count(),
    )
    assert got.task_count > 2 and got.evaluation_count == 2
    none = rows[empty.id]
    assert (none.task_count, none.heldout_count, none.evaluation_count) == (0, 0, 0)
