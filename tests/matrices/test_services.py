"""matrix_create: one evaluation per cell with the matrix's parameters, all or nothing."""

from __future__ import annotations

import pytest

from coevo.errors import BudgetExceeded, InvalidInput, PermissionDenied
from coevo.evaluations.ledger import BudgetLimits
from coevo.evaluations.models import Evaluation
from coevo.matrices.models import CompatibilityMatrix
from coevo.matrices.services import matrix_create
from coevo.suites.models import Split


def test_it_creates_one_evaluation_per_cell_with_the_matrix_parameters(
    project, owner, humaneval_suite, seed_candidate, child_candidate, policy_version, second_policy
):
    matrix = matrix_create(
        project=project,
        candidates=[child_candidate, seed_candidate],
        policy_versions=[second_policy, policy_version],
        suite=humaneval_suite,
        split=Split.VALIDATION,
        epochs=2,
        seed=5,
        task_limit=3,
        created_by=owner,
    )

    cells = list(matrix.cells.select_related("evaluation").order_by("row", "column"))
    assert [(c.row, c.column, c.candidate, c.policy_version) for c in cells] == [
        (0, 0, child_candidate, second_policy),
        (0, 1, child_candidate, policy_version),
        (1, 0, seed_candidate, second_policy),
        (1, 1, seed_candidate, policy_version),
    ]
    for cell in cells:
        e = cell.evaluation
        assert (e.candidate, e.policy_version, e.suite) == (
            cell.candidate,
            cell.policy_version,
            humaneval_suite,
        )
        assert (e.split, e.epochs, e.seed, e.task_limit, e.created_by) == (
            Split.VALIDATION,
            2,
            5,
            3,
            owner,
        )
        assert e.rollouts.count() == 6  # 3 tasks × 2 epochs
        # Every cell reserves on the matrix's ledger account.
        assert e.budget.parent_id == matrix.budget_id


def test_it_refuses_the_held_out_split(project, humaneval_suite, seed_candidate, policy_version):
    with pytest.raises(PermissionDenied, match="held-out"):
        matrix_create(
            project=project,
            candidates=[seed_candidate],
            policy_versions=[policy_version],
            suite=humaneval_suite,
            split=Split.HELDOUT,
            created_by=None,
        )
    assert not CompatibilityMatrix.objects.exists()
    assert not Evaluation.objects.exists()


def test_it_refuses_a_candidate_listed_twice(
    project, humaneval_suite, seed_candidate, policy_version
):
    with pytest.raises(InvalidInput, match="twice"):
        matrix_create(
            project=project,
            candidates=[seed_candidate, seed_candidate],
            policy_versions=[policy_version],
            suite=humaneval_suite,
            split=Split.SEARCH,
            created_by=None,
        )


def test_it_creates_nothing_when_the_budget_cannot_cover_every_cell(
    project, humaneval_suite, seed_candidate, policy_version, second_policy
):
    # Two cells of two rollouts each against a limit of three: the second cell is refused.
    with pytest.raises(BudgetExceeded):
        matrix_create(
            project=project,
            candidates=[seed_candidate],
            policy_versions=[policy_version, second_policy],
            suite=humaneval_suite,
            split=Split.SEARCH,
            task_limit=2,
            budget_limits=BudgetLimits(rollouts=3),
            created_by=None,
        )
    assert not CompatibilityMatrix.objects.exists()
    assert not Evaluation.objects.exists()
