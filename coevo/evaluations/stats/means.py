"""A mean with its confidence interval (Wilson for 0/1 results, a bootstrap over tasks
otherwise), and the unbiased pass@k estimator of Chen et al. (2021)."""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from coevo.evaluations.stats.base import (
    DEFAULT_RESAMPLES,
    Interval,
    InvalidStatisticsInput,
    bootstrap_mean_interval,
    normal_quantile,
    scores_array,
)

# The two scores an evaluation has, as every page names them (issue 38: one evaluation read 50.0%
# on one page and 62.5% on another, neither saying which). The pass rate counts rollouts whose
# outcome is "passed"; the mean per-task score averages each task's score in [0, 1] (its points
# on graded suites such as TextWorld). On pass/fail suites (HumanEval) the two coincide.
PASS_RATE = "pass rate"
MEAN_SCORE = "mean per-task score"


@dataclass(frozen=True)
class ScoreSummary:
    mean: float | None
    interval: Interval | None
    n: int
    confidence: float
    # "wilson" (0/1 results) or "bootstrap" (graded scores, or pass rates over k epochs).
    method: str = "wilson"


def wilson_interval(successes: int, n: int, *, confidence: float = 0.95) -> Interval:
    """Wilson score interval for a binomial proportion (well-behaved at 0, 1 and small n)."""
    if n <= 0:
        raise InvalidStatisticsInput("n must be positive")
    if not 0 <= successes <= n:
        raise InvalidStatisticsInput("successes must lie in [0, n]")
    z = normal_quantile(confidence)
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
            raise InvalidStatisticsInput("passed must lie in [0, n]")
        return ScoreSummary(mean=None, interval=None, n=0, confidence=confidence)
    return ScoreSummary(
        mean=passed / n,
        interval=wilson_interval(passed, n, confidence=confidence),
        n=n,
        confidence=confidence,
    )


def mean_score_summary(
    scores: Sequence[float],
    *,
    confidence: float = 0.95,
    seed: int = 0,
    resamples: int = DEFAULT_RESAMPLES,
) -> ScoreSummary:
    """Mean of per-task scores in [0, 1] with a confidence interval.

    All 0/1 scores: the Wilson interval (identical to `pass_rate_summary`). Otherwise (graded
    scores, or per-task pass rates over k epochs, see `per_task_means`) a percentile bootstrap
    that resamples tasks, so the k epochs of a task stay together and the interval reflects the
    spread between tasks, not just the rollout count. Deterministic for a given seed.
    """
    values = scores_array(scores, what="scores")
    normal_quantile(confidence)
    if values.size == 0:
        return ScoreSummary(mean=None, interval=None, n=0, confidence=confidence)
    if np.all((values == 0) | (values == 1)):
        return pass_rate_summary(int(values.sum()), int(values.size), confidence=confidence)
    low, high = bootstrap_mean_interval(values, confidence, seed, resamples)
    return ScoreSummary(
        mean=float(values.mean()),
        interval=Interval(max(0.0, low), min(1.0, high)),
        n=int(values.size),
        confidence=confidence,
        method="bootstrap",
    )


def per_task_means(results: Mapping[Hashable, Sequence[float]]) -> dict[Hashable, float]:
    """Per-task score over k epochs: the mean of the task's rollout scores (its pass rate)."""
    # Plain Python per task: a comparison of two 1,000-task evaluations calls this for 4,000
    # short lists, where building a NumPy array each time was most of the page's statistics.
    means = {}
    for task, scores in results.items():
        values = [float(s) for s in scores]
        if not values:
            raise InvalidStatisticsInput(
                f"task {task!r} has no scores; leave unscored tasks out of the results"
            )
        if not all(0.0 <= v <= 1.0 for v in values):  # NaN fails too
            scores_array(values, what=f"scores of task {task!r}")  # raises with the range
            raise InvalidStatisticsInput(f"scores of task {task!r} must lie in [0, 1]")
        means[task] = math.fsum(values) / len(values)
    return means


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c passed (Chen et al. 2021, "Evaluating Large
    Language Models Trained on Code", eq. 1): 1 - C(n-c, k) / C(n, k), the probability that k
    of the n samples drawn without replacement include a pass.

    Chen et al. evaluate it as the product prod_{i=n-c+1}^{n} (1 - k/i) to avoid overflowing
    floats; Python's integers do not overflow and int / int is correctly rounded, so the ratio
    is computed exactly and rounded once (pass_at_k(5, 2, 1) is 0.4, not 0.3999...)."""
    if n <= 0:
        raise InvalidStatisticsInput(f"n must be positive, got {n}")
    if not 0 <= c <= n:
        raise InvalidStatisticsInput(f"c must lie in [0, n={n}], got {c}")
    if not 1 <= k <= n:
        raise InvalidStatisticsInput(
            f"pass@{k} needs at least {k} samples per task and k >= 1; this task has {n}"
        )
    if n - c < k:
        return 1.0
    total = math.comb(n, k)
    return (total - math.comb(n - c, k)) / total


def pass_at_k_summary(
    per_task: Mapping[Hashable, tuple[int, int]] | Sequence[tuple[int, int]],
    ks: Iterable[int],
) -> dict[int, float]:
    """pass@k averaged over tasks, for each k in ks; per_task holds (samples n, passed c).

    Defined only for k up to the smallest n of any task: evaluate with at least k epochs."""
    pairs = list(per_task.values()) if isinstance(per_task, Mapping) else list(per_task)
    if not pairs:
        raise InvalidStatisticsInput("pass@k needs at least one task with samples")
    smallest = min(n for n, _ in pairs)
    summary = {}
    for k in ks:
        if not 1 <= k <= smallest:
            raise InvalidStatisticsInput(
                f"pass@{k} is undefined here: some task has only {smallest} samples; "
                f"evaluate with at least {k} epochs or ask for k <= {smallest}"
            )
        summary[k] = math.fsum(pass_at_k(n, c, k) for n, c in pairs) / len(pairs)
    return summary


def per_task_pass_counts(
    results: Mapping[Hashable, Sequence[float]], *, threshold: float = 1.0
) -> dict[Hashable, tuple[int, int]]:
    """(samples n, passed c) per task, for pass@k; a rollout passes when its score >= threshold."""
    counts = {}
    for task, scores in results.items():
        values = scores_array(scores, what=f"scores of task {task!r}")
        counts[task] = (int(values.size), int(np.count_nonzero(values >= threshold)))
    return counts
