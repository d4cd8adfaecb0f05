"""Evaluation plans: which tasks run in which stage (smoke → minibatch → full).

Pure functions; ``coevo.evaluations.staging`` runs the plan.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from coevo.errors import InvalidInput
from coevo.evaluations.models import StageKind

T = TypeVar("T")

MAX_SMOKE_TASKS = 5


@dataclass(frozen=True)
class EvaluationPlan:
    """smoke_tasks: run first; any harness_error there stops the evaluation (a broken
    candidate costs two rollouts, not a split). minibatch_tasks: run next, paired against the
    reference evaluation when there is one. The rest of the split is the full stage.
    early_stop: after every finished task of the minibatch and full stages, stop once the
    candidate is clearly better or worse than the reference (anytime-valid test at ``alpha``).
    """

    smoke_tasks: int = 0
    minibatch_tasks: int = 0
    early_stop: bool = False
    alpha: float = 0.05

    def __post_init__(self) -> None:
        if not 0 <= self.smoke_tasks <= MAX_SMOKE_TASKS:
            raise InvalidInput(f"smoke_tasks must be between 0 and {MAX_SMOKE_TASKS}.")
        if self.minibatch_tasks < 0:
            raise InvalidInput("minibatch_tasks must not be negative.")
        if not 0 < self.alpha < 0.5:
            raise InvalidInput("alpha must lie in (0, 0.5).")

    @property
    def is_staged(self) -> bool:
        return bool(self.smoke_tasks or self.minibatch_tasks or self.early_stop)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> EvaluationPlan:
        data = data or {}
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


@dataclass(frozen=True)
class PlannedStage:
    kind: str
    tasks: list[Any]


def stages_for(
    tasks: Sequence[T], *, plan: EvaluationPlan, seed: int, key: Any
) -> list[PlannedStage]:
    """Split ``tasks`` into the plan's non-empty stages.

    A staged plan draws its smoke and minibatch tasks at random (seeded, so the same evaluation
    settings always pick the same tasks): a minibatch of the first tasks of a suite would be a
    biased sample. ``key`` maps a task to its stable id.
    """
    if not plan.is_staged:
        return [PlannedStage(StageKind.FULL, list(tasks))]
    ordered = sorted(tasks, key=lambda task: _draw(seed, key(task)))
    smoke = ordered[: plan.smoke_tasks]
    minibatch = ordered[plan.smoke_tasks : plan.smoke_tasks + plan.minibatch_tasks]
    full = ordered[plan.smoke_tasks + plan.minibatch_tasks :]
    stages = [
        PlannedStage(StageKind.SMOKE, smoke),
        PlannedStage(StageKind.MINIBATCH, minibatch),
        PlannedStage(StageKind.FULL, full),
    ]
    return [stage for stage in stages if stage.tasks]


def _draw(seed: int, task_key: str) -> str:
    return hashlib.sha256(f"{seed}:{task_key}".encode()).hexdigest()
