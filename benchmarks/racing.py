"""Racing vs full evaluation: choosing the best of 8 candidates on a simulated suite.

    .venv/bin/python benchmarks/racing.py [--reps 1000] [--tasks 200] [--alpha 0.05]
        [--margin 0.08] [--seed 0]

The simulated policy has known per-task success probabilities, so the truly best candidate is
known: p[i, t] = sigmoid(difficulty[t] + skill[i] + quirk[i, t]), with task difficulties spread
widely (many tasks nearly always or never solved, as in real suites), a per-candidate skill
solved for so the candidates' true mean pass rates are 0.60, 0.60 - margin, 0.45, 0.42, 0.38,
0.35, 0.30 and 0.25, and a per-candidate, per-task quirk (candidates are not uniformly better
on every task).

Each repetition draws one 0/1 outcome per candidate and task, shuffles the task order (the
engine feeds a race in a random order) and the candidate order (so ties favour no one), then:
- full evaluation: every candidate on every task, pick the highest mean (ties at random);
- racing: `coevo.evaluations.stats.racing.Race` on the same outcomes, task by task, stopping
  when one candidate is left (eliminated: clearly worse than another with anytime-valid error
  control, or too far behind the leader to catch up in the tasks left); rollouts = tasks each
  candidate was evaluated on while in the race.
Both see the same outcomes, so their difference in picking the best one is a paired comparison.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from coevo.evaluations.stats.means import wilson_interval  # noqa: E402
from coevo.evaluations.stats.paired import sign_test_p_value  # noqa: E402
from coevo.evaluations.stats.racing import Race  # noqa: E402

# One winner, a runner-up `--margin` points behind (8 by default), and six weaker candidates.
BEST, OTHERS = 0.60, (0.45, 0.42, 0.38, 0.35, 0.30, 0.25)


def simulated_suite(tasks: int, seed: int, margin: float) -> np.ndarray:
    """Per-candidate, per-task success probabilities with the target mean pass rates."""
    targets = (BEST, BEST - margin, *OTHERS)
    rng = np.random.default_rng(seed)
    difficulty = rng.normal(0.0, 2.5, size=tasks)
    quirk = rng.normal(0.0, 1.0, size=(len(targets), tasks))
    probabilities = np.empty((len(targets), tasks))
    for i, target in enumerate(targets):
        low, high = -10.0, 10.0
        for _ in range(80):  # bisection on the skill that gives this mean
            skill = (low + high) / 2
            p = 1 / (1 + np.exp(-(difficulty + skill + quirk[i])))
            low, high = (skill, high) if p.mean() < target else (low, skill)
        probabilities[i] = p
    return probabilities


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=1000)
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--margin", type=float, default=0.08, help="best minus runner-up")
    args = parser.parse_args()

    started = time.perf_counter()
    probabilities = simulated_suite(args.tasks, args.seed, args.margin)
    candidates, tasks = probabilities.shape
    best = int(probabilities.mean(axis=1).argmax())
    rng = np.random.default_rng(args.seed + 1)

    full_right = race_right = 0
    only_full = only_race = 0  # repetitions where exactly one of the two picked the best
    race_rollouts = []
    decided = 0
    for _ in range(args.reps):
        outcomes = (rng.random((candidates, tasks)) < probabilities).astype(float)
        outcomes = outcomes[:, rng.permutation(tasks)]
        order = rng.permutation(candidates)

        means = outcomes.mean(axis=1)
        top = np.flatnonzero(means == means.max())
        full_pick = int(rng.choice(top))

        contest = Race([int(i) for i in order], alpha=args.alpha, total_tasks=tasks)
        for t in range(tasks):
            contest.observe({c: outcomes[c, t] for c in contest.alive})
            if contest.finished:
                break
        result = contest.result()
        race_pick = int(result.winner)
        if not result.decided:
            # Tasks ran out: the survivors were all evaluated fully, so pick as full evaluation
            # does among them (ties at random, not by candidate order).
            alive = [int(c) for c in result.alive]
            top = [c for c in alive if means[c] == max(means[a] for a in alive)]
            race_pick = int(rng.choice(top))
        decided += result.decided
        race_rollouts.append(result.rollouts)

        full_right += full_pick == best
        race_right += race_pick == best
        only_full += full_pick == best and race_pick != best
        only_race += race_pick == best and full_pick != best

    reps = args.reps
    full_rollouts = candidates * tasks
    mean_rollouts = float(np.mean(race_rollouts))
    full_ci = wilson_interval(full_right, reps)
    race_ci = wilson_interval(race_right, reps)
    # The two methods see the same outcomes: compare them on the discordant repetitions.
    p_value = sign_test_p_value(only_race, only_full)
    diff = (race_right - full_right) / reps
    diff_se = math.sqrt(only_full + only_race - (only_race - only_full) ** 2 / reps) / reps

    print(
        f"suite: {tasks} tasks, {candidates} candidates, true mean pass rates "
        + ", ".join(f"{m:.2f}" for m in probabilities.mean(axis=1))
    )
    print(f"repetitions: {reps}, racing alpha {args.alpha:g}, seed {args.seed}")
    print()
    print(
        f"{'method':<22}{'rollouts (mean)':>18}{'share of full':>15}{'picks the best':>17}"
        f"{'95% CI':>18}"
    )
    print(
        f"{'full evaluation':<22}{full_rollouts:>18,.0f}{1:>15.1%}{full_right / reps:>17.1%}"
        f"{f'{full_ci.low:.1%}-{full_ci.high:.1%}':>18}"
    )
    print(
        f"{'racing':<22}{mean_rollouts:>18,.0f}{mean_rollouts / full_rollouts:>15.1%}"
        f"{race_right / reps:>17.1%}{f'{race_ci.low:.1%}-{race_ci.high:.1%}':>18}"
    )
    print()
    print(
        f"racing minus full, picking the best: {diff:+.1%} (paired, +-{1.96 * diff_se:.1%}; "
        f"only racing right {only_race}, only full right {only_full}, exact sign test "
        f"p = {p_value:.3g})"
    )
    print(
        f"races ending with one candidate left: {decided / reps:.1%}; rollouts per race "
        f"min {min(race_rollouts)}, median {int(np.median(race_rollouts))}, "
        f"max {max(race_rollouts)}"
    )
    print(f"time: {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
