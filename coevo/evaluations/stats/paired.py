"""Paired comparison of two evaluations on the same tasks (candidate vs parent or channel
holder): flips, the difference with a bootstrap interval, the exact McNemar / sign test."""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from coevo.evaluations.stats.base import (
    DEFAULT_RESAMPLES,
    Interval,
    InvalidStatisticsInput,
    bootstrap_mean_interval,
    normal_quantile,
)
from coevo.evaluations.stats.means import MEAN_SCORE, PASS_RATE, per_task_means

# Below this many paired tasks a percentile bootstrap interval is not shown as numbers: with two
# tasks it can only take a handful of values (n**n resamples) and read [+25, +100] pts while the
# exact test, which holds its level at any n, says p = 0.5 (issue 38).
MIN_INTERVAL_TASKS = 10


def too_few_tasks_note(tasks: int) -> str | None:
    """The words a page shows instead of a bootstrap interval over ``tasks`` tasks, or None
    when there are enough (MIN_INTERVAL_TASKS) for the interval to mean something. Gates and
    promotion evidence use it too, for their one-sided and per-evaluation intervals."""
    if 0 < tasks < MIN_INTERVAL_TASKS:
        return f"too few tasks (n={tasks}) for an interval"
    return None


@dataclass(frozen=True)
class PairedComparison:
    """Candidate vs reference on the tasks both evaluated.

    kind "binary" (one 0/1 result per task on both sides): tasks are fixed / broken / both_pass /
    both_fail, and the p-value is the exact McNemar test on the fixed vs broken tasks. Otherwise
    ("graded": k epochs or fractional scores) tasks are improved / regressed / tied by their
    per-task mean, and the p-value is the exact sign test on improved vs regressed (ties
    dropped), which is what McNemar's test is for 0/1 results.
    """

    kind: str
    tasks: int
    reference_only: int
    candidate_only: int
    reference_mean: float | None
    candidate_mean: float | None
    difference: float | None
    interval: Interval | None
    improved: tuple[Hashable, ...]
    regressed: tuple[Hashable, ...]
    tied: tuple[Hashable, ...]
    both_pass: tuple[Hashable, ...]
    both_fail: tuple[Hashable, ...]
    p_value: float
    confidence: float
    significant: bool
    verdict: str

    @property
    def flips(self) -> dict[str, tuple[Hashable, ...]]:
        if self.kind == "binary":
            return {
                "fixed": self.improved,
                "broken": self.regressed,
                "both_pass": self.both_pass,
                "both_fail": self.both_fail,
            }
        return {"improved": self.improved, "regressed": self.regressed, "tied": self.tied}

    @property
    def test(self) -> str:
        return "exact McNemar" if self.kind == "binary" else "exact sign test"

    @property
    def score_name(self) -> str:
        """What `reference_mean`, `candidate_mean` and `difference` are means of."""
        return PASS_RATE if self.kind == "binary" else MEAN_SCORE

    @property
    def shown_interval(self) -> Interval | None:
        """The bootstrap interval when it may be shown beside the verdict, else None (see
        `interval_note`). The exact test decides; the interval is shown only where it agrees."""
        return self.interval if self.interval_note is None else None

    @property
    def interval_note(self) -> str | None:
        """Why no interval is shown beside the verdict, or None when it is shown.

        The verdict is the exact McNemar / sign test's alone. A percentile bootstrap interval of
        the mean difference answers another question (it weighs points, the test counts won
        tasks) and is unreliable on few tasks, so it is withheld below MIN_INTERVAL_TASKS paired
        tasks, and wherever it would contradict the verdict (excluding 0 beside "no significant
        difference", or covering 0 beside a significant one): a page never shows both.
        """
        if self.interval is None:
            return None if self.tasks else "no task scored on both sides"
        too_few = too_few_tasks_note(self.tasks)
        if too_few is not None:
            return too_few
        excludes_zero = self.interval.low > 0 or self.interval.high < 0
        if excludes_zero != self.significant:
            return (
                f"no interval: the bootstrap interval and the {self.test} disagree on "
                f"{self.tasks} tasks; the test decides"
            )
        return None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PairedComparison:
        """The comparison `as_dict` stored (promotion evidence of every version keeps this
        shape), so a page renders stored evidence with the same rule as a live comparison."""
        flips = data.get("flips") or {}
        binary = data.get("kind") == "binary"
        interval = data.get("interval")
        both_pass = tuple(flips.get("both_pass") or ())
        both_fail = tuple(flips.get("both_fail") or ())
        return cls(
            kind="binary" if binary else "graded",
            tasks=int(data.get("tasks") or 0),
            reference_only=int((data.get("dropped") or {}).get("reference_only") or 0),
            candidate_only=int((data.get("dropped") or {}).get("candidate_only") or 0),
            reference_mean=data.get("reference_mean"),
            candidate_mean=data.get("candidate_mean"),
            difference=data.get("difference"),
            interval=Interval(interval["low"], interval["high"]) if interval else None,
            improved=tuple(flips.get("fixed" if binary else "improved") or ()),
            regressed=tuple(flips.get("broken" if binary else "regressed") or ()),
            tied=both_pass + both_fail if binary else tuple(flips.get("tied") or ()),
            both_pass=both_pass,
            both_fail=both_fail,
            p_value=float(data.get("p_value", 1.0)),
            confidence=float(data.get("confidence", 0.95)),
            significant=bool(data.get("significant")),
            verdict=data.get("verdict") or "no significant difference",
        )

    def as_dict(self) -> dict[str, Any]:
        flips = self.flips
        return {
            "kind": self.kind,
            "tasks": self.tasks,
            "dropped": {
                "reference_only": self.reference_only,
                "candidate_only": self.candidate_only,
            },
            "reference_mean": self.reference_mean,
            "candidate_mean": self.candidate_mean,
            "difference": self.difference,
            "interval": None
            if self.interval is None
            else {"low": self.interval.low, "high": self.interval.high},
            "confidence": self.confidence,
            "flips": {name: list(keys) for name, keys in flips.items()},
            "flip_counts": {name: len(keys) for name, keys in flips.items()},
            "test": self.test,
            "p_value": self.p_value,
            "significant": self.significant,
            "verdict": self.verdict,
        }


def paired_comparison(
    reference: Mapping[Hashable, Sequence[float]],
    candidate: Mapping[Hashable, Sequence[float]],
    *,
    confidence: float = 0.95,
    seed: int = 0,
    resamples: int = DEFAULT_RESAMPLES,
) -> PairedComparison:
    """Compare two evaluations task by task; each maps a task key to its rollout scores.

    Only tasks present in both count (the others are reported as dropped). The difference is
    candidate minus reference, with a percentile bootstrap interval that resamples tasks (so the
    pairing is kept). `significant` comes from the exact McNemar / sign test at 1 - confidence,
    which holds its level even with few discordant tasks; the verdict's direction is the side
    with more won tasks (for 0/1 results the same as the sign of the difference).
    """
    alpha = 1 - confidence
    normal_quantile(confidence)
    common = [task for task in reference if task in candidate]
    ref_means = per_task_means({task: reference[task] for task in common})
    cand_means = per_task_means({task: candidate[task] for task in common})
    binary = all(
        len(side[task]) == 1 and float(side[task][0]) in (0.0, 1.0)
        for side in (reference, candidate)
        for task in common
    )
    improved, regressed, tied, both_pass, both_fail = [], [], [], [], []
    for task in common:
        delta = cand_means[task] - ref_means[task]
        # Means of k scores differ by at least ~1/k when they differ at all; the tolerance only
        # absorbs floating-point noise from averaging.
        if delta > 1e-12:
            improved.append(task)
        elif delta < -1e-12:
            regressed.append(task)
        else:
            tied.append(task)
            if binary:
                (both_pass if ref_means[task] == 1.0 else both_fail).append(task)
    p_value = sign_test_p_value(len(improved), len(regressed))
    significant = p_value < alpha
    if significant and len(improved) > len(regressed):
        verdict = "better"
    elif significant and len(regressed) > len(improved):
        verdict = "worse"
    else:
        verdict = "no significant difference"
    if common:
        ref = np.fromiter((ref_means[t] for t in common), dtype=float, count=len(common))
        cand = np.fromiter((cand_means[t] for t in common), dtype=float, count=len(common))
        low, high = bootstrap_mean_interval(cand - ref, confidence, seed, resamples)
        reference_mean, candidate_mean = float(ref.mean()), float(cand.mean())
        difference: float | None = float((cand - ref).mean())
        interval: Interval | None = Interval(low, high)
    else:
        reference_mean = candidate_mean = difference = None
        interval = None
    return PairedComparison(
        kind="binary" if binary else "graded",
        tasks=len(common),
        reference_only=sum(1 for task in reference if task not in candidate),
        candidate_only=sum(1 for task in candidate if task not in reference),
        reference_mean=reference_mean,
        candidate_mean=candidate_mean,
        difference=difference,
        interval=interval,
        improved=tuple(improved),
        regressed=tuple(regressed),
        tied=tuple(tied),
        both_pass=tuple(both_pass),
        both_fail=tuple(both_fail),
        p_value=p_value,
        confidence=confidence,
        significant=significant,
        verdict=verdict,
    )


def sign_test_p_value(wins: int, losses: int) -> float:
    """Exact two-sided sign test (McNemar's exact test on discordant pairs): under no
    difference each discordant task goes either way with probability 1/2, so
    p = min(1, 2 * P(Binomial(wins + losses, 1/2) <= min(wins, losses)))."""
    if wins < 0 or losses < 0:
        raise InvalidStatisticsInput("wins and losses must be non-negative counts")
    n = wins + losses
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(wins, losses) + 1))
    # Integer arithmetic up to the one division: exact for any n.
    return min(1.0, 2 * tail / 2**n)
