"""Calibration and power of the paired comparison on a simulated policy.

    .venv/bin/python benchmarks/stats_calibration.py [--reps 1000] [--tasks 100] [--seed 0]

The simulated suite has known per-task success probabilities p[t] ~ Beta(0.35, 0.45): as in
real suites, many tasks are (nearly) always or never solved and some lie in between. Each
repetition draws fresh 0/1 outcomes (k epochs per task) for two evaluations and compares them
with `coevo.evaluations.stats.paired.paired_comparison` (exact McNemar / sign test, paired
bootstrap) and with `sequential_paired_decision` checked after every task (as the engine's
early stopping does):

- A/A: both evaluations are of the same candidate (same p). Every "significant" is a false
  alarm; at 95% confidence it must happen in at most 5% of repetitions.
- +10 points: the candidate fixes each failure of the reference with probability delta, i.e.
  p'[t] = 1 - (1 - p[t]) (1 - delta), with delta chosen so the mean rises by exactly 0.10.

Theoretical power for k = 1: under this model the numbers of fixed and broken tasks have a known
joint distribution (each task independently fixed with probability p'(1-p), broken with p(1-p'));
the exact power of the exact McNemar test is summed over it. The normal approximation
Phi(n delta_mean / sqrt(sum of per-task variances of the difference) - 1.96) is printed too.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from statistics import NormalDist

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from coevo.evaluations.stats.means import wilson_interval  # noqa: E402
from coevo.evaluations.stats.paired import paired_comparison, sign_test_p_value  # noqa: E402
from coevo.evaluations.stats.sequential import sequential_paired_decision  # noqa: E402

ALPHA = 0.05
IMPROVEMENT = 0.10


def simulated_suite(tasks: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    reference = rng.beta(0.35, 0.45, size=tasks)
    delta = IMPROVEMENT / (1 - reference.mean())
    improved = 1 - (1 - reference) * (1 - delta)
    return reference, improved


def exact_mcnemar_power(reference: np.ndarray, candidate: np.ndarray) -> float:
    """P(exact McNemar p < ALPHA), summed over the exact joint law of (fixed, broken)."""
    n = reference.size
    law = np.zeros((n + 1, n + 1))  # law[f, b]
    law[0, 0] = 1.0
    for p, q in zip(reference, candidate, strict=True):
        fixed, broken = q * (1 - p), p * (1 - q)
        step = law * (1 - fixed - broken)
        step[1:, :] += law[:-1, :] * fixed
        step[:, 1:] += law[:, :-1] * broken
        law = step
    rejects = sum(
        law[f, b]
        for f in range(n + 1)
        for b in range(n + 1 - f)
        if law[f, b] > 1e-15 and sign_test_p_value(f, b) < ALPHA
    )
    return float(rejects)


def normal_approximate_power(reference: np.ndarray, candidate: np.ndarray) -> float:
    fixed, broken = candidate * (1 - reference), reference * (1 - candidate)
    variance = float(np.sum(fixed + broken - (fixed - broken) ** 2))
    shift = float(np.sum(candidate - reference))
    z = NormalDist().inv_cdf(1 - ALPHA / 2)
    return NormalDist().cdf(shift / math.sqrt(variance) - z)


def simulate(
    reference: np.ndarray,
    candidate: np.ndarray,
    *,
    epochs: int,
    reps: int,
    rng: np.random.Generator,
) -> dict[str, float]:
    tasks = reference.size
    mcnemar = bootstrap = sequential = 0
    stopped_after = []
    for rep in range(reps):
        ref = (rng.random((tasks, epochs)) < reference[:, None]).astype(float)
        cand = (rng.random((tasks, epochs)) < candidate[:, None]).astype(float)
        result = paired_comparison(
            {t: list(ref[t]) for t in range(tasks)},
            {t: list(cand[t]) for t in range(tasks)},
            confidence=1 - ALPHA,
            seed=rep,
        )
        mcnemar += result.significant
        bootstrap += result.interval.low > 0 or result.interval.high < 0
        # The engine's early stopping: checked after every task, in the tasks' order.
        diff = cand.mean(axis=1) - ref.mean(axis=1)
        fixed = np.cumsum(diff > 1e-12)
        broken = np.cumsum(diff < -1e-12)
        for t in range(tasks):
            if sequential_paired_decision(int(fixed[t]), int(broken[t]), alpha=ALPHA).stop:
                sequential += 1
                stopped_after.append(t + 1)
                break
    return {
        "mcnemar": mcnemar / reps,
        "bootstrap": bootstrap / reps,
        "sequential": sequential / reps,
        "stopped_after": float(np.mean(stopped_after)) if stopped_after else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=1000)
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    started = time.perf_counter()
    reference, improved = simulated_suite(args.tasks, args.seed)
    rng = np.random.default_rng(args.seed + 1)
    near = np.mean((reference < 0.05) | (reference > 0.95))
    print(
        f"suite: {args.tasks} tasks, p ~ Beta(0.35, 0.45): mean {reference.mean():.3f}, "
        f"{near:.0%} of tasks below 0.05 or above 0.95; improved mean {improved.mean():.3f} "
        f"(+{improved.mean() - reference.mean():.3f})"
    )
    print(f"repetitions: {args.reps}, level {ALPHA:g}, seed {args.seed}")
    print()
    header = (
        f"{'comparison':<20}{'epochs':>7}{'McNemar/sign':>14}{'bootstrap CI':>14}"
        f"{'sequential':>12}{'tasks to stop':>15}"
    )
    print(header)
    for name, candidate in (("A/A (same p)", reference), ("+10 points", improved)):
        for epochs in (1, 4):
            r = simulate(reference, candidate, epochs=epochs, reps=args.reps, rng=rng)
            print(
                f"{name:<20}{epochs:>7}{r['mcnemar']:>14.1%}{r['bootstrap']:>14.1%}"
                f"{r['sequential']:>12.1%}{r['stopped_after']:>15.1f}"
            )
    print()
    print("A/A cells are false-alarm rates (must be <= 5%); +10-point cells are power.")
    ci = wilson_interval(round(0.05 * args.reps), args.reps)
    print(f"(simulation error: a true 5% rate is observed in {ci.low:.1%}-{ci.high:.1%})")
    print(
        f"theoretical power of the exact McNemar test, k=1: exact {exact_mcnemar_power(reference, improved):.1%}"
        f", normal approximation {normal_approximate_power(reference, improved):.1%}; "
        f"exact size under A/A {exact_mcnemar_power(reference, reference):.1%}"
    )
    print(f"time: {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
