"""Sequential early stopping of a paired evaluation: an anytime-valid test on the fixed and
broken tasks, safe to check after every batch."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from coevo.evaluations.stats.base import InvalidStatisticsInput


@dataclass(frozen=True)
class SequentialDecision:
    stop: bool
    direction: str | None  # "better" | "worse" when stopped, else None
    reason: str
    p_value: float  # anytime-valid: P(it ever drops to alpha under no difference) <= alpha
    fixed: int
    broken: int
    tasks: int | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "stop": self.stop,
            "direction": self.direction,
            "reason": self.reason,
            "p_value": self.p_value,
            "fixed": self.fixed,
            "broken": self.broken,
            "tasks": self.tasks,
        }


def sequential_paired_decision(
    fixed: int, broken: int, *, tasks: int | None = None, alpha: float = 0.05
) -> SequentialDecision:
    """Should a paired evaluation stop now? Call it after every batch with the running counts.

    fixed / broken: tasks the candidate passes and the reference fails, and the reverse (for k
    epochs or graded scores: tasks whose per-task mean went up / down). tasks: how many tasks
    were compared so far, for the reason text only.

    Why checking after every task keeps the error below alpha: under no difference each
    discordant task is fixed or broken with probability 1/2, independently. The statistic
    M = integral over q of (2q)^fixed (2(1-q))^broken dBeta(q; 1/2, 1/2)
      = 2^(fixed+broken) B(fixed + 1/2, broken + 1/2) / B(1/2, 1/2)
    is then a likelihood ratio averaged over the alternatives q, hence a nonnegative martingale
    with mean 1 over the sequence of tasks (concordant tasks leave it unchanged). Ville's
    inequality gives P(M ever reaches 1/alpha) <= alpha, at whatever times it is looked at, so
    stopping the first time M >= 1/alpha is a level-alpha test that never needs a fixed sample
    size; 1/M is an anytime-valid p-value. The Jeffreys mixing prior is the
    Krichevsky-Trofimov mixture: it is within about (1/2) log(n) of the best fixed q in
    hindsight, so it detects large and small differences alike.
    """
    if fixed < 0 or broken < 0:
        raise InvalidStatisticsInput("fixed and broken must be non-negative counts")
    if not 0 < alpha < 1:
        raise InvalidStatisticsInput("alpha must lie in (0, 1)")
    if tasks is not None and tasks < fixed + broken:
        raise InvalidStatisticsInput(
            f"tasks ({tasks}) cannot be fewer than fixed + broken ({fixed + broken})"
        )
    p_value = min(1.0, math.exp(-_log_kt_mixture(fixed, broken)))
    seen = f"{tasks} tasks" if tasks is not None else f"{fixed + broken} discordant tasks"
    if p_value <= alpha and fixed != broken:
        direction = "better" if fixed > broken else "worse"
        counts = (
            f"{fixed} fixed, {broken} broken"
            if fixed > broken
            else f"{broken} broken, {fixed} fixed"
        )
        reason = (
            f"stopped after {seen}: clearly {direction} than the reference "
            f"({counts}; anytime-valid p = {p_value:.3g} < {alpha:g})"
        )
        return SequentialDecision(True, direction, reason, p_value, fixed, broken, tasks)
    reason = (
        f"continuing after {seen}: not yet decided ({fixed} fixed, {broken} broken; "
        f"anytime-valid p = {p_value:.3g}, stops below {alpha:g})"
    )
    return SequentialDecision(False, None, reason, p_value, fixed, broken, tasks)


def _log_kt_mixture(wins: int, losses: int) -> float:
    n = wins + losses
    return (
        n * math.log(2)
        + math.lgamma(wins + 0.5)
        + math.lgamma(losses + 0.5)
        - math.lgamma(n + 1)
        - math.log(math.pi)
    )
