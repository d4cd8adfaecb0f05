"""What the estimators share: the error type, the interval type, input checks, the percentile
bootstrap over tasks and the normal quantile."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from coevo.errors import InvalidInput

DEFAULT_RESAMPLES = 2000


class InvalidStatisticsInput(InvalidInput, ValueError):
    """Inputs a statistic is not defined for. Also a ValueError, for callers that catch that."""


@dataclass(frozen=True)
class Interval:
    low: float
    high: float


def scores_array(scores: Sequence[float] | Iterable[float], *, what: str) -> np.ndarray:
    values = np.asarray([float(s) for s in scores], dtype=float)
    if values.size and not (np.all(values >= 0.0) and np.all(values <= 1.0)):
        raise InvalidStatisticsInput(
            f"{what} must lie in [0, 1]; got {values.min()}..{values.max()}"
        )
    return values


def bootstrap_mean_interval(
    values: np.ndarray, confidence: float, seed: int, resamples: int
) -> tuple[float, float]:
    if resamples < 100:
        raise InvalidStatisticsInput("use at least 100 bootstrap resamples")
    rng = np.random.default_rng(seed)
    n = values.size
    means = np.empty(resamples)
    # In chunks: resamples x n indices at once would be large for big suites.
    chunk = max(1, 2_000_000 // n)
    for start in range(0, resamples, chunk):
        stop = min(resamples, start + chunk)
        means[start:stop] = values[rng.integers(0, n, size=(stop - start, n))].mean(axis=1)
    tail = (1 - confidence) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return float(low), float(high)


def normal_quantile(confidence: float) -> float:
    """Two-sided normal quantile, via the inverse error function (no SciPy needed)."""
    if not 0 < confidence < 1:
        raise InvalidStatisticsInput("confidence must lie in (0, 1)")
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
