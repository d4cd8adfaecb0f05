"""The declared policy of a gate: which rules apply and their thresholds. Validated on the way
in (``GatePolicy.build``) and stored as JSON (``as_dict``)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from coevo.errors import InvalidInput

MAX_CRITICAL_TASKS = 1000


@dataclass(frozen=True)
class GatePolicy:
    min_score: float | None = None
    max_regression: float | None = None
    confidence: float = 0.95
    critical_tasks: tuple[str, ...] = field(default=())
    max_error_rate: float | None = None

    @classmethod
    def build(
        cls,
        *,
        min_score: float | None = None,
        max_regression: float | None = None,
        confidence: float = 0.95,
        critical_tasks: Iterable[str] = (),
        max_error_rate: float | None = None,
    ) -> GatePolicy:
        """Validate the thresholds; raises InvalidInput naming every wrong one."""
        errors = []
        values: dict[str, float | None] = {}
        for name, value in (
            ("min_score", min_score),
            ("max_regression", max_regression),
            ("max_error_rate", max_error_rate),
        ):
            values[name] = None
            if value is None:
                continue
            number = _number(value)
            if number is None or not 0 <= number <= 1:
                errors.append(f"{name} must be a number between 0 and 1, got {value!r}")
            else:
                values[name] = number
        conf = _number(confidence)
        if conf is None or not 0.5 <= conf < 1:
            errors.append(f"confidence must be at least 0.5 and below 1, got {confidence!r}")
        if isinstance(critical_tasks, str):
            errors.append("critical_tasks must be a list of task keys, not one string")
            critical_tasks = ()
        keys = []
        for key in critical_tasks:
            if not isinstance(key, str) or not key.strip():
                errors.append(f"critical_tasks: {key!r} is not a task key")
            elif key.strip() not in keys:
                keys.append(key.strip())
        if len(keys) > MAX_CRITICAL_TASKS:
            errors.append(f"critical_tasks: at most {MAX_CRITICAL_TASKS} tasks, got {len(keys)}")
        if errors:
            raise InvalidInput("Invalid gate policy: " + "; ".join(errors) + ".")
        policy = cls(
            min_score=values["min_score"],
            max_regression=values["max_regression"],
            confidence=float(conf),
            critical_tasks=tuple(keys),
            max_error_rate=values["max_error_rate"],
        )
        if not policy.rules:
            raise InvalidInput(
                "A gate needs at least one rule: give min_score, max_regression, "
                "critical_tasks or max_error_rate."
            )
        return policy

    @property
    def rules(self) -> list[str]:
        """The declared rules, in the order they are reported."""
        declared = []
        if self.min_score is not None:
            declared.append("min_score")
        if self.max_regression is not None:
            declared.append("max_regression")
        if self.critical_tasks:
            declared.append("critical_tasks")
        if self.max_error_rate is not None:
            declared.append("max_error_rate")
        return declared

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["critical_tasks"] = list(self.critical_tasks)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GatePolicy:
        return cls(
            min_score=data.get("min_score"),
            max_regression=data.get("max_regression"),
            confidence=data.get("confidence", 0.95),
            critical_tasks=tuple(data.get("critical_tasks") or ()),
            max_error_rate=data.get("max_error_rate"),
        )


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None
