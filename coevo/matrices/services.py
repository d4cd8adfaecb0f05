"""Compatibility matrix writes: create the matrix and one evaluation per cell."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.db import transaction

from coevo.errors import InvalidInput, PermissionDenied
from coevo.evaluations.ledger import BudgetLimits, budget_create
from coevo.evaluations.services import evaluation_create
from coevo.matrices.models import CompatibilityMatrix, MatrixCell
from coevo.policies.models import PolicyVersion
from coevo.projects.models import Project
from coevo.suites.models import Split, Suite
from harness_store.models import Candidate

logger = logging.getLogger(__name__)

MAX_ROWS = 12
MAX_COLUMNS = 8


def matrix_create(
    *,
    project: Project,
    candidates: Sequence[Candidate],
    policy_versions: Sequence[PolicyVersion],
    suite: Suite,
    split: str,
    epochs: int = 1,
    seed: int = 0,
    task_limit: int | None = None,
    name: str = "",
    budget_limits: BudgetLimits | None = None,
    created_by: AbstractBaseUser | None = None,
) -> CompatibilityMatrix:
    """Create the matrix and every cell's evaluation (candidate × policy version, same suite
    split, epochs and seed), all or nothing: a cell refused (budget, a candidate that cannot
    run) creates no matrix at all. Cells start on commit, as every evaluation does; the rollout
    cache makes a cell already evaluated elsewhere (same tree, policy, suite, seed) free.
    """
    if split == Split.HELDOUT:
        raise PermissionDenied(
            "A compatibility matrix never runs the sealed held-out split (only a promotion "
            "request does): use the search or validation split."
        )
    if split not in (Split.SEARCH, Split.VALIDATION):
        raise InvalidInput(f"Unknown split {split!r}: use search or validation.")
    if suite.project_id != project.id:
        raise InvalidInput("The suite belongs to another project.")
    candidates = list(candidates)
    policy_versions = list(policy_versions)
    _check_axis(candidates, what="candidate", limit=MAX_ROWS, key=lambda c: c.id)
    _check_axis(policy_versions, what="policy version", limit=MAX_COLUMNS, key=lambda p: p.id)
    foreign = [c.short_sha for c in candidates if c.project_id != project.id]
    if foreign:
        raise InvalidInput(f"Candidates {', '.join(foreign)} belong to another project.")
    with transaction.atomic():
        budget = budget_create(
            project=project, name=f"matrix {name[:150] or suite.name}", limits=budget_limits
        )
        matrix = CompatibilityMatrix.objects.create(
            project=project,
            name=name,
            suite=suite,
            split=split,
            epochs=epochs,
            seed=seed,
            task_limit=task_limit,
            budget=budget,
            created_by=created_by,
        )
        cells = []
        for row, candidate in enumerate(candidates):
            for column, policy_version in enumerate(policy_versions):
                evaluation = evaluation_create(
                    candidate=candidate,
                    suite=suite,
                    split=split,
                    policy_version=policy_version,
                    epochs=epochs,
                    task_limit=task_limit,
                    seed=seed,
                    parent_budget=budget,
                    use_cache=True,
                    created_by=created_by,
                )
                cells.append(
                    MatrixCell(
                        matrix=matrix,
                        row=row,
                        column=column,
                        candidate=candidate,
                        policy_version=policy_version,
                        evaluation=evaluation,
                    )
                )
        MatrixCell.objects.bulk_create(cells)
    logger.info(
        "matrix %s created: %d candidates × %d policy versions on %s/%s",
        matrix.id,
        len(candidates),
        len(policy_versions),
        suite,
        split,
    )
    return matrix


def _check_axis(items: list[Any], *, what: str, limit: int, key: Any) -> None:
    if not items:
        raise InvalidInput(f"Pick at least one {what}.")
    if len(items) > limit:
        raise InvalidInput(f"At most {limit} {what}s per matrix; {len(items)} were given.")
    if len({key(item) for item in items}) != len(items):
        raise InvalidInput(f"A {what} is listed twice: each may appear once.")
