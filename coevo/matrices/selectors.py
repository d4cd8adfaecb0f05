"""Compatibility matrix reads: the list, one matrix, its state and its grid.

The grid's "mismatch" cells are the point of the matrix (HRP: deployed return = harness
ceiling − policy mismatch): a harness that is the best of some column (tuned for that policy)
and scores significantly below its own best under another policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import Count, Q, QuerySet

from coevo.errors import NotFound
from coevo.evaluations.models import Evaluation, EvaluationState
from coevo.evaluations.selectors import evaluations_task_scores
from coevo.evaluations.stats.base import Interval
from coevo.evaluations.stats.means import mean_score_summary, per_task_means
from coevo.evaluations.stats.paired import PairedComparison, paired_comparison
from coevo.matrices.models import CompatibilityMatrix, MatrixCell, MatrixState
from coevo.policies.models import PolicyVersion
from coevo.projects.models import Project
from harness_store.models import Candidate

CONFIDENCE = 0.95
# Means closer than this are ties (all tied cells count as the best of their row or column).
_TIE = 1e-9


def matrix_list(*, project: Project) -> QuerySet[CompatibilityMatrix]:
    """The project's matrices, each with its cells' states counted (``matrix_listed_state``
    reads them): a list of matrices is one query, not one more per matrix."""
    return (
        CompatibilityMatrix.objects.filter(project=project)
        .select_related("suite")
        .annotate(
            open_cells=Count("cells", filter=~Q(cells__evaluation__state__in=_FINAL_STATES)),
            unfinished_cells=Count(
                "cells", filter=~Q(cells__evaluation__state=EvaluationState.FINISHED)
            ),
        )
    )


def matrix_listed_state(*, matrix: CompatibilityMatrix) -> str:
    """matrix_state of a matrix read through ``matrix_list``, from its counts (no query)."""
    if matrix.open_cells:
        return MatrixState.RUNNING
    return MatrixState.INCOMPLETE if matrix.unfinished_cells else MatrixState.FINISHED


def matrix_get(*, project: Project, matrix_id: Any) -> CompatibilityMatrix:
    try:
        return CompatibilityMatrix.objects.select_related("suite").get(
            project=project, id=matrix_id
        )
    except (CompatibilityMatrix.DoesNotExist, ValueError, TypeError):
        raise NotFound(f"No compatibility matrix {matrix_id} in project {project.slug}.") from None


def matrix_cells(*, matrix: CompatibilityMatrix) -> list[MatrixCell]:
    return list(
        MatrixCell.objects.filter(matrix=matrix)
        .select_related("candidate", "policy_version", "evaluation")
        .order_by("row", "column")
    )


def matrix_state(*, matrix: CompatibilityMatrix, cells: list[MatrixCell] | None = None) -> str:
    states = [
        c.evaluation.state for c in (cells if cells is not None else matrix_cells(matrix=matrix))
    ]
    if any(not _final(state) for state in states):
        return MatrixState.RUNNING
    if all(state == EvaluationState.FINISHED for state in states):
        return MatrixState.FINISHED
    return MatrixState.INCOMPLETE


_FINAL_STATES = (EvaluationState.FINISHED, EvaluationState.FAILED, EvaluationState.CANCELLED)


def _final(state: str) -> bool:
    return state in _FINAL_STATES


@dataclass(frozen=True)
class Mismatch:
    """Why a cell is flagged: its row's best cell beats it, paired on common tasks."""

    best_column: int
    best_policy_version: PolicyVersion
    best_evaluation: Evaluation
    comparison: PairedComparison  # reference: the row's best cell; candidate: this cell
    tuned_for: tuple[PolicyVersion, ...]  # the columns this row's harness is the best of

    @property
    def reason(self) -> str:
        c = self.comparison
        tuned = ", ".join(p.name for p in self.tuned_for)
        return (
            f"best harness under {tuned}, but {c.difference:+.3f} here vs under "
            f"{self.best_policy_version.name} ({c.test} p={c.p_value:.3g}, "
            f"{len(c.regressed)} tasks lost, {len(c.improved)} won, {c.tasks} paired)"
        )


@dataclass(frozen=True)
class GridCell:
    row: int
    column: int
    candidate: Candidate
    policy_version: PolicyVersion
    evaluation: Evaluation
    state: str
    mean: float | None
    interval: Interval | None
    n: int  # tasks scored
    best_in_row: bool
    best_in_column: bool
    mismatch: Mismatch | None

    @property
    def hue(self) -> int | None:
        """The cell's colour on the page: 0 (red) at score 0 to 120 (green) at 1."""
        return None if self.mean is None else round(120 * max(0.0, min(1.0, self.mean)))


@dataclass(frozen=True)
class GridRow:
    index: int
    candidate: Candidate
    cells: list[GridCell]
    best_columns: tuple[int, ...]  # the policies it does best under (ties: all)


@dataclass(frozen=True)
class GridColumn:
    index: int
    policy_version: PolicyVersion
    best_rows: tuple[int, ...]  # the best harnesses under this policy (ties: all)


@dataclass(frozen=True)
class Grid:
    matrix: CompatibilityMatrix
    state: str
    rows: list[GridRow]
    columns: list[GridColumn]
    confidence: float

    @property
    def is_final(self) -> bool:
        return self.state != MatrixState.RUNNING

    @property
    def mismatches(self) -> list[GridCell]:
        return [cell for row in self.rows for cell in row.cells if cell.mismatch is not None]


def matrix_grid(*, matrix: CompatibilityMatrix) -> Grid:
    """Rows (candidates) × columns (policy versions): each cell's mean per-task score with
    its 95% interval, n and state; per row the policy it does best under, per column the best
    harness; and the mismatch cells.

    A cell is a mismatch when (1) it is significantly below its row's best cell (paired
    comparison on their common tasks, exact McNemar / sign test at 95%) and (2) the row's
    harness is the best of some other column: a harness tuned for one policy that loses under
    another. Only finished cells are judged (a running cell's score still moves).
    """
    cells = matrix_cells(matrix=matrix)
    by_evaluation = evaluations_task_scores(evaluation_ids=[c.evaluation_id for c in cells])
    scores = {c.id: by_evaluation.get(c.evaluation_id, {}) for c in cells}
    summaries = {
        c.id: mean_score_summary(list(per_task_means(scores[c.id]).values()), seed=matrix.seed)
        for c in cells
    }
    by_position = {(c.row, c.column): c for c in cells}
    n_rows = max((c.row for c in cells), default=-1) + 1
    n_columns = max((c.column for c in cells), default=-1) + 1

    def mean(row: int, column: int) -> float | None:
        cell = by_position.get((row, column))
        return summaries[cell.id].mean if cell is not None else None

    best_columns = {r: _argmax({k: mean(r, k) for k in range(n_columns)}) for r in range(n_rows)}
    best_rows = {k: _argmax({r: mean(r, k) for r in range(n_rows)}) for k in range(n_columns)}

    def mismatch(cell: MatrixCell) -> Mismatch | None:
        if (
            cell.evaluation.state != EvaluationState.FINISHED
            or cell.column in best_columns[cell.row]
        ):
            return None
        tuned = [k for k in range(n_columns) if k != cell.column and cell.row in best_rows[k]]
        if not tuned:
            return None
        best = by_position[(cell.row, best_columns[cell.row][0])]
        if best.evaluation.state != EvaluationState.FINISHED:
            return None
        comparison = paired_comparison(
            scores[best.id], scores[cell.id], confidence=CONFIDENCE, seed=matrix.seed
        )
        if not (comparison.significant and comparison.verdict == "worse"):
            return None
        return Mismatch(
            best_column=best.column,
            best_policy_version=best.policy_version,
            best_evaluation=best.evaluation,
            comparison=comparison,
            tuned_for=tuple(by_position[(cell.row, k)].policy_version for k in tuned),
        )

    grid_cells = [
        GridCell(
            row=c.row,
            column=c.column,
            candidate=c.candidate,
            policy_version=c.policy_version,
            evaluation=c.evaluation,
            state=c.evaluation.state,
            mean=summaries[c.id].mean,
            interval=summaries[c.id].interval,
            n=summaries[c.id].n,
            best_in_row=c.column in best_columns[c.row],
            best_in_column=c.row in best_rows[c.column],
            mismatch=mismatch(c),
        )
        for c in cells
    ]
    rows = [
        GridRow(
            index=r,
            candidate=by_position[(r, 0)].candidate,
            cells=[g for g in grid_cells if g.row == r],
            best_columns=best_columns[r],
        )
        for r in range(n_rows)
    ]
    columns = [
        GridColumn(
            index=k, policy_version=by_position[(0, k)].policy_version, best_rows=best_rows[k]
        )
        for k in range(n_columns)
    ]
    return Grid(
        matrix=matrix,
        state=matrix_state(matrix=matrix, cells=cells),
        rows=rows,
        columns=columns,
        confidence=CONFIDENCE,
    )


def _argmax(values: dict[int, float | None]) -> tuple[int, ...]:
    """The keys with the highest value (ties: all of them, in order); none without values."""
    scored = {k: v for k, v in values.items() if v is not None}
    if not scored:
        return ()
    top = max(scored.values())
    return tuple(k for k, v in scored.items() if v >= top - _TIE)
