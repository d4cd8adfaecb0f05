"""Matrix test data: a second policy version on the same scripted endpoint, and a matrix whose
cells' evaluations are written straight to the database with chosen per-task results."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from coevo.evaluations.ledger import budget_create
from coevo.matrices.models import CompatibilityMatrix, MatrixCell
from coevo.policies.models import PolicyVersion
from coevo.suites.models import Split, Task
from tests.support.factories import make_evaluation, make_rollout
from workers.outcomes import RolloutOutcome


@pytest.fixture
def second_policy(policy_version) -> PolicyVersion:
    """Another served name on the scripted endpoint (the scripted server answers any model)."""
    return PolicyVersion.objects.create(
        name="scripted-b",
        base_model=policy_version.base_model,
        served_name="scripted-b",
        endpoint=policy_version.endpoint,
    )


def written_matrix(
    *, project, suite, candidates, policy_versions, passes: Sequence[Sequence[Sequence[int]]]
) -> CompatibilityMatrix:
    """``passes[row][column]`` lists the per-task 0/1 results of that cell, on the first tasks
    of the suite's search split; every cell's evaluation is finished."""
    n = len(passes[0][0])
    tasks = list(Task.objects.filter(suite=suite, split=Split.SEARCH).order_by("position")[:n])
    matrix = CompatibilityMatrix.objects.create(
        project=project,
        name="written",
        suite=suite,
        split=Split.SEARCH,
        budget=budget_create(project=project, name="matrix written"),
    )
    for row, candidate in enumerate(candidates):
        for column, policy in enumerate(policy_versions):
            evaluation = make_evaluation(candidate=candidate, suite=suite, policy_version=policy)
            for task, passed in zip(tasks, passes[row][column], strict=True):
                make_rollout(
                    evaluation,
                    task,
                    outcome=RolloutOutcome.PASSED if passed else RolloutOutcome.TASK_FAILURE,
                    score=float(passed),
                )
            MatrixCell.objects.create(
                matrix=matrix,
                row=row,
                column=column,
                candidate=candidate,
                policy_version=policy,
                evaluation=evaluation,
            )
    return matrix


from tests.api.conftest import make_client  # noqa: E402, F401 (fixture)
