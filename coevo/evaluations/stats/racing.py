"""Racing: the best of several candidates on the same tasks, with early elimination by
anytime-valid betting evidence."""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from coevo.evaluations.stats.base import InvalidStatisticsInput

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


def _logsumexp(a: np.ndarray, *, axis: int) -> np.ndarray:
    top = a.max(axis=axis, keepdims=True)
    return np.squeeze(top, axis=axis) + np.log(np.exp(a - top).sum(axis=axis))
