"""Statistics over rollout scores. Pages, the API and the evaluation engine take their figures
from here.

Everything is a pure function of its inputs (and a seed where resampling is involved), so a page
shows the same interval on every reload. Scores are per rollout in [0, 1]; a task evaluated for k
epochs has k rollouts, and its per-task score is their mean (its pass rate when scores are 0/1).

- `pass_at_k`, `pass_at_k_summary`: the unbiased pass@k estimator of Chen et al. (2021).
- `wilson_interval`, `pass_rate_summary`, `mean_score_summary`: a mean with its interval (Wilson
  for 0/1 results, a bootstrap over tasks otherwise).
- `paired_comparison`: two evaluations on the same tasks (candidate vs parent or channel holder).
- `sequential_paired_decision`: anytime-valid early stopping of a paired minibatch.
- `Race`, `race`: choosing the best of several candidates with early elimination.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from coevo.errors import InvalidInput

DEFAULT_RESAMPLES = 2000


class InvalidStatisticsInput(InvalidInput, ValueError):
    """Inputs a statistic is not defined for. Also a ValueError, for callers that catch that."""


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
    # "wilson" (0/1 results) or "bootstrap" (graded scores, or pass rates over k epochs).
    method: str = "wilson"


# ---------------------------------------------------------------------------------------------
# Means, intervals and pass@k


def wilson_interval(successes: int, n: int, *, confidence: float = 0.95) -> Interval:
    """Wilson score interval for a binomial proportion (well-behaved at 0, 1 and small n)."""
    if n <= 0:
        raise InvalidStatisticsInput("n must be positive")
    if not 0 <= successes <= n:
        raise InvalidStatisticsInput("successes must lie in [0, n]")
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
    values = _scores_array(scores, what="scores")
    _z(confidence)
    if values.size == 0:
        return ScoreSummary(mean=None, interval=None, n=0, confidence=confidence)
    if np.all((values == 0) | (values == 1)):
        return pass_rate_summary(int(values.sum()), int(values.size), confidence=confidence)
    low, high = _bootstrap_mean_interval(values, confidence, seed, resamples)
    return ScoreSummary(
        mean=float(values.mean()),
        interval=Interval(max(0.0, low), min(1.0, high)),
        n=int(values.size),
        confidence=confidence,
        method="bootstrap",
    )


def per_task_means(results: Mapping[Hashable, Sequence[float]]) -> dict[Hashable, float]:
    """Per-task score over k epochs: the mean of the task's rollout scores (its pass rate)."""
    means = {}
    for task, scores in results.items():
        values = _scores_array(scores, what=f"scores of task {task!r}")
        if values.size == 0:
            raise InvalidStatisticsInput(
                f"task {task!r} has no scores; leave unscored tasks out of the results"
            )
        means[task] = float(values.mean())
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
        values = _scores_array(scores, what=f"scores of task {task!r}")
        counts[task] = (int(values.size), int(np.count_nonzero(values >= threshold)))
    return counts


# ---------------------------------------------------------------------------------------------
# Paired comparison of two evaluations on the same tasks

_BINARY_FLIPS = ("fixed", "broken", "both_pass", "both_fail")
_GRADED_FLIPS = ("improved", "regressed", "tied")


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
    _z(confidence)
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
        low, high = _bootstrap_mean_interval(cand - ref, confidence, seed, resamples)
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


# ---------------------------------------------------------------------------------------------
# Sequential early stopping of a paired evaluation


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


# ---------------------------------------------------------------------------------------------
# Racing: the best of several candidates with early elimination

# One-sided betting mixture for "i is better than j": wealth prod_t (1 + lam * (x_i - x_j)) over
# a grid of bets lam in (0, 1), weighted like the Jeffreys prior on q = (1 + lam) / 2 in (1/2, 1).
# A discrete prior is still a prior: the mixture is exactly a supermartingale, not an
# approximation of one.
_GRID = 64
_Q = 0.5 + (np.arange(_GRID) + 0.5) / (2 * _GRID)
_LAMBDAS = 2 * _Q - 1
_LOG_WEIGHTS = np.log((_Q * (1 - _Q)) ** -0.5 / np.sum((_Q * (1 - _Q)) ** -0.5))


@dataclass(frozen=True)
class Elimination:
    candidate: Hashable
    by: Hashable
    after_tasks: int
    # "evidence": clearly worse than `by` (anytime-valid p_value, corrected for the rivals);
    # "out_of_reach": too far behind `by` to catch up in the tasks left (p_value 0).
    kind: str
    p_value: float
    reason: str


@dataclass(frozen=True)
class RaceResult:
    winner: Hashable
    decided: bool  # True: the others were eliminated; False: tasks ran out with several left
    alive: tuple[Hashable, ...]
    eliminations: tuple[Elimination, ...]
    means: dict[Hashable, float] = field(hash=False)
    tasks_seen: int
    rollouts: int
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "winner": self.winner,
            "decided": self.decided,
            "alive": list(self.alive),
            "eliminations": [
                {
                    "candidate": e.candidate,
                    "by": e.by,
                    "after_tasks": e.after_tasks,
                    "kind": e.kind,
                    "p_value": e.p_value,
                    "reason": e.reason,
                }
                for e in self.eliminations
            ],
            "means": dict(self.means),
            "tasks_seen": self.tasks_seen,
            "rollouts": self.rollouts,
            "reason": self.reason,
        }


class Race:
    """Choose the best of several candidates, evaluating them on the same tasks one at a time
    and dropping each candidate as soon as another one is clearly better.

        race = Race(["a", "b", "c"], alpha=0.05)
        for task in shuffled_tasks:                        # the same order for every candidate
            race.observe({c: score(c, task) for c in race.alive})
            if race.finished:
                break
        result = race.result()                            # winner, eliminations with reasons

    Scores are per task in [0, 1] (a pass, or a pass rate over k epochs). For every ordered pair
    (i, j) the race keeps a betting wealth on "i is better than j": prod over shared tasks of
    (1 + lam (x_i - x_j)), mixed over bets lam in (0, 1). If i is not better than j on average
    (E[x_i - x_j] <= 0 for a task drawn at random), every factor has expectation <= 1, so the
    wealth is a nonnegative supermartingale and, by Ville's inequality, reaches
    (N - 1) / alpha with probability at most alpha / (N - 1) however often it is looked at. j is
    eliminated when some i's wealth against it reaches that level. The truly best candidate is
    wrongly eliminated only if one of the N - 1 wealths against it crosses: probability at most
    alpha (a union bound over candidates; looks need no correction). Feed tasks in a random
    order: the guarantee treats tasks as draws from the suite.

    With total_tasks given, a candidate is also dropped once it trails the leader by more than
    the tasks left (it cannot catch up even by passing them all while the leader fails them):
    that never changes which candidate a full evaluation would pick.
    """

    def __init__(
        self,
        candidates: Sequence[Hashable],
        *,
        alpha: float = 0.05,
        total_tasks: int | None = None,
    ) -> None:
        if len(candidates) < 2:
            raise InvalidStatisticsInput("a race needs at least two candidates")
        if len(set(candidates)) != len(candidates):
            raise InvalidStatisticsInput("race candidates must be distinct")
        if not 0 < alpha < 1:
            raise InvalidStatisticsInput("alpha must lie in (0, 1)")
        if total_tasks is not None and total_tasks < 1:
            raise InvalidStatisticsInput("total_tasks must be positive")
        self.candidates = tuple(candidates)
        self.alpha = alpha
        self.total_tasks = total_tasks
        n = len(self.candidates)
        self._index = {c: i for i, c in enumerate(self.candidates)}
        self._alive = np.ones(n, dtype=bool)
        self._sums = np.zeros(n)
        self._seen = np.zeros(n, dtype=int)
        self._log_wealth = np.zeros((n, n, _GRID))
        self._log_threshold = math.log((n - 1) / alpha)
        self._eliminations: list[Elimination] = []
        self.tasks_seen = 0

    @property
    def alive(self) -> tuple[Hashable, ...]:
        return tuple(c for c, keep in zip(self.candidates, self._alive, strict=True) if keep)

    @property
    def finished(self) -> bool:
        return int(self._alive.sum()) == 1

    @property
    def rollouts(self) -> int:
        """Task evaluations spent: each task costs one per candidate alive when it was run."""
        return int(self._seen.sum())

    def observe(self, scores: Mapping[Hashable, float]) -> tuple[Elimination, ...]:
        """Record one task's score for every alive candidate; returns who was eliminated."""
        if self.finished:
            raise InvalidStatisticsInput("the race is already decided; read result()")
        if self.total_tasks is not None and self.tasks_seen >= self.total_tasks:
            raise InvalidStatisticsInput(f"all {self.total_tasks} tasks were already observed")
        missing = [c for c in self.alive if c not in scores]
        if missing:
            raise InvalidStatisticsInput(f"missing scores for alive candidates {missing!r}")
        unknown = [c for c in scores if c not in self._index]
        if unknown:
            raise InvalidStatisticsInput(f"unknown race candidates {unknown!r}")
        alive = self._alive.copy()
        x = np.zeros(len(self.candidates))
        for c in self.alive:
            value = float(scores[c])
            if not 0.0 <= value <= 1.0:
                raise InvalidStatisticsInput(f"score {value!r} of {c!r} is outside [0, 1]")
            x[self._index[c]] = value
        self.tasks_seen += 1
        self._sums[alive] += x[alive]
        self._seen[alive] += 1
        pairs = np.outer(alive, alive)
        np.fill_diagonal(pairs, False)
        d = (x[:, None] - x[None, :])[pairs]
        self._log_wealth[pairs] += np.log1p(d[:, None] * _LAMBDAS[None, :])
        evidence = _logsumexp(self._log_wealth + _LOG_WEIGHTS, axis=2)  # [i, j]: i beats j
        evidence[~pairs] = -np.inf
        strongest = evidence.max(axis=0)
        doomed = np.flatnonzero(alive & (strongest >= self._log_threshold))
        if doomed.size == int(alive.sum()):
            # Cannot happen with consistent evidence; keep the leader rather than nobody.
            doomed = doomed[doomed != self._leader_index()]
        eliminated = []
        for j in doomed:
            i = int(evidence[:, j].argmax())
            p_value = min(1.0, math.exp(-float(evidence[i, j])) * (len(self.candidates) - 1))
            record = Elimination(
                candidate=self.candidates[j],
                by=self.candidates[i],
                after_tasks=self.tasks_seen,
                kind="evidence",
                p_value=p_value,
                reason=(
                    f"eliminated after {self.tasks_seen} tasks: clearly worse than "
                    f"{self.candidates[i]} ({self._sums[j] / self._seen[j]:.1%} vs"
                    f" {self._sums[i] / self._seen[i]:.1%} on the same tasks; anytime-valid "
                    f"p = {p_value:.3g} < {self.alpha:g}, corrected for "
                    f"{len(self.candidates) - 1} rivals)"
                ),
            )
            eliminated.append(record)
        for record in eliminated:
            self._alive[self._index[record.candidate]] = False
        eliminated.extend(self._eliminate_hopeless())
        self._eliminations.extend(eliminated)
        return tuple(eliminated)

    def _eliminate_hopeless(self) -> list[Elimination]:
        if self.total_tasks is None:
            return []
        left = self.total_tasks - self.tasks_seen
        leader = self._leader_index()
        eliminated = []
        for j in np.flatnonzero(self._alive):
            # Alive candidates have seen the same tasks, so sums compare like means.
            if j != leader and self._sums[j] + left < self._sums[leader]:
                self._alive[j] = False
                eliminated.append(
                    Elimination(
                        candidate=self.candidates[j],
                        by=self.candidates[leader],
                        after_tasks=self.tasks_seen,
                        kind="out_of_reach",
                        p_value=0.0,
                        reason=(
                            f"eliminated after {self.tasks_seen} tasks: cannot catch up with "
                            f"{self.candidates[leader]} in the {left} tasks left "
                            f"({self._sums[j]:g} vs {self._sums[leader]:g} passed)"
                        ),
                    )
                )
        return eliminated

    def result(self) -> RaceResult:
        """The winner so far: the last one left, else the highest mean among those left."""
        means = {
            c: float(self._sums[i] / self._seen[i]) for c, i in self._index.items() if self._seen[i]
        }
        winner = self.candidates[self._leader_index()]
        if self.finished:
            reason = f"{winner} is the only candidate left after {self.tasks_seen} tasks"
        else:
            reason = (
                f"no clear winner after {self.tasks_seen} tasks: {winner} has the highest mean "
                f"of the {int(self._alive.sum())} candidates left"
            )
        return RaceResult(
            winner=winner,
            decided=self.finished,
            alive=self.alive,
            eliminations=tuple(self._eliminations),
            means=means,
            tasks_seen=self.tasks_seen,
            rollouts=self.rollouts,
            reason=reason,
        )

    def _leader_index(self) -> int:
        means = np.where(self._alive, self._sums / np.maximum(self._seen, 1), -np.inf)
        return int(means.argmax())  # ties go to the earlier candidate


def race(scores: Mapping[Hashable, Sequence[float]], *, alpha: float = 0.05) -> RaceResult:
    """Run a race over already-known per-task scores (the same task order for every candidate),
    stopping as soon as one candidate is left; `rollouts` counts only what the race used.
    Useful to replay a finished evaluation, and in benchmarks."""
    lengths = {len(values) for values in scores.values()}
    if len(lengths) != 1:
        raise InvalidStatisticsInput("every candidate needs a score for each of the same tasks")
    tasks = lengths.pop()
    contest = Race(list(scores), alpha=alpha, total_tasks=tasks)
    for t in range(tasks):
        contest.observe({c: scores[c][t] for c in contest.alive})
        if contest.finished:
            break
    return contest.result()


# ---------------------------------------------------------------------------------------------
# Helpers


def _scores_array(scores: Sequence[float] | Iterable[float], *, what: str) -> np.ndarray:
    values = np.asarray([float(s) for s in scores], dtype=float)
    if values.size and not (np.all(values >= 0.0) and np.all(values <= 1.0)):
        raise InvalidStatisticsInput(
            f"{what} must lie in [0, 1]; got {values.min()}..{values.max()}"
        )
    return values


def _bootstrap_mean_interval(
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


def _logsumexp(a: np.ndarray, *, axis: int) -> np.ndarray:
    top = a.max(axis=axis, keepdims=True)
    return np.squeeze(top, axis=axis) + np.log(np.exp(a - top).sum(axis=axis))


def _z(confidence: float) -> float:
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
