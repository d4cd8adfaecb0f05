"""Statistics over rollout scores. Pages and the API take their figures from here."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Interval:
    low: float
    high: float


@dataclass(frozen=True)
class ScoreSummary:
    mean: float | None
    interval: Interval | None
    n: int
    confidence: float


def wilson_interval(successes: int, n: int, *, confidence: float = 0.95) -> Interval:
    """Wilson score interval for a binomial proportion (well-behaved at 0, 1 and small n)."""
    if n <= 0:
        raise ValueError("n must be positive")
    if not 0 <= successes <= n:
        raise ValueError("successes must lie in [0, n]")
    z = _z(confidence)
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    # Exact at the extremes: rounding would otherwise leave 1.0 outside the interval of n/n.
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return Interval(low, high)


def pass_rate_summary(passed: int, n: int, *, confidence: float = 0.95) -> ScoreSummary:
    if n == 0:
        if passed:
            raise ValueError("passed must lie in [0, n]")
        return ScoreSummary(mean=None, interval=None, n=0, confidence=confidence)
    return ScoreSummary(
        mean=passed / n,
        interval=wilson_interval(passed, n, confidence=confidence),
        n=n,
        confidence=confidence,
    )


def _z(confidence: float) -> float:
    """Two-sided normal quantile, via the inverse error function (no SciPy needed)."""
    if not 0 < confidence < 1:
        raise ValueError("confidence must lie in (0, 1)")
    return math.sqrt(2) * _erfinv(confidence)


def _erfinv(y: float) -> float:
    # Newton's method on erf, from a good starting point; converges in a few steps.
    x = 0.0 if y == 0 else math.copysign(math.sqrt(-math.log((1 - abs(y)) / 2)), y) * 0.8
    for _ in range(60):
        step = (math.erf(x) - y) / (2 / math.sqrt(math.pi) * math.exp(-x * x))
        x -= step
        if abs(step) < 1e-15:
            break
    return x
