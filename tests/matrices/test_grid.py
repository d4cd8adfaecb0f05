"""The grid and its mismatch cells, on evaluations written straight to the database."""

from __future__ import annotations

from coevo.evaluations.models import Evaluation, EvaluationState
from coevo.matrices.models import MatrixState
from coevo.matrices.selectors import matrix_grid
from tests.matrices.conftest import written_matrix

ALL = [1] * 10
NONE = [0] * 10


def first(k: int) -> list[int]:
    return [1] * k + [0] * (10 - k)


def grid_for(project, suite, rows, policies, passes):
    matrix = written_matrix(
        project=project, suite=suite, candidates=rows, policy_versions=policies, passes=passes
    )
    return matrix_grid(matrix=matrix)


def test_it_flags_a_harness_tuned_for_one_policy_that_loses_under_another(
    project, humaneval_suite, seed_candidate, child_candidate, policy_version, second_policy
):
    # A is the best harness under policy 1 and collapses under policy 2; B is best under 2.
    grid = grid_for(
        project,
        humaneval_suite,
        [seed_candidate, child_candidate],
        [policy_version, second_policy],
        [[ALL, NONE], [first(5), first(8)]],
    )

    assert grid.state == MatrixState.FINISHED
    assert [r.best_columns for r in grid.rows] == [(0,), (1,)]
    assert [c.best_rows for c in grid.columns] == [(0,), (1,)]
    flagged = grid.mismatches
    assert [(c.row, c.column) for c in flagged] == [(0, 1)]
    mismatch = flagged[0].mismatch
    assert mismatch.best_policy_version == policy_version
    assert mismatch.tuned_for == (policy_version,)
    assert mismatch.comparison.verdict == "worse"
    assert mismatch.comparison.difference == -1.0
    assert "best harness under" in mismatch.reason and policy_version.name in mismatch.reason
    cell = grid.rows[0].cells[0]
    assert cell.mean == 1.0 and cell.n == 10 and cell.interval.low < 1.0


def test_it_flags_nothing_on_a_uniform_grid(
    project, humaneval_suite, seed_candidate, child_candidate, policy_version, second_policy
):
    grid = grid_for(
        project,
        humaneval_suite,
        [seed_candidate, child_candidate],
        [policy_version, second_policy],
        [[first(5), first(5)], [first(5), first(5)]],
    )

    assert grid.mismatches == []
    assert all(cell.best_in_row and cell.best_in_column for r in grid.rows for cell in r.cells)


def test_it_does_not_flag_a_loss_that_is_not_significant(
    project, humaneval_suite, seed_candidate, child_candidate, policy_version, second_policy
):
    # 3 tasks lost, none won: the exact sign test gives p = 0.25.
    grid = grid_for(
        project,
        humaneval_suite,
        [seed_candidate, child_candidate],
        [policy_version, second_policy],
        [[ALL, first(7)], [first(5), first(8)]],
    )

    assert grid.rows[0].best_columns == (0,)
    assert grid.mismatches == []


def test_it_does_not_flag_a_harness_that_is_the_best_nowhere(
    project, humaneval_suite, seed_candidate, child_candidate, policy_version, second_policy
):
    # B loses badly under policy 2, but it is no policy's best harness: not tuned for any.
    grid = grid_for(
        project,
        humaneval_suite,
        [seed_candidate, child_candidate],
        [policy_version, second_policy],
        [[ALL, ALL], [first(9), NONE]],
    )

    assert [c.best_rows for c in grid.columns] == [(0,), (0,)]
    assert grid.mismatches == []


def test_it_is_running_until_every_cell_is_final_and_judges_only_finished_cells(
    project, humaneval_suite, seed_candidate, child_candidate, policy_version, second_policy
):
    matrix = written_matrix(
        project=project,
        suite=humaneval_suite,
        candidates=[seed_candidate, child_candidate],
        policy_versions=[policy_version, second_policy],
        passes=[[ALL, NONE], [first(5), first(8)]],
    )
    losing = matrix.cells.get(row=0, column=1).evaluation_id
    Evaluation.objects.filter(id=losing).update(state=EvaluationState.RUNNING)

    grid = matrix_grid(matrix=matrix)
    assert grid.state == MatrixState.RUNNING and not grid.is_final
    assert grid.mismatches == []

    Evaluation.objects.filter(id=losing).update(state=EvaluationState.CANCELLED)
    assert matrix_grid(matrix=matrix).state == MatrixState.INCOMPLETE
