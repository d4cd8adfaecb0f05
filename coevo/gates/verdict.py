"""A gate's verdict from its two evaluations: pure functions of the scores, so every rule can be
tested on hand-made numbers and a gate page shows the same figures on every reload.

Rules (docs/api.md, Gates):
- an evaluation that failed or was cancelled → ``error`` (no rule is judged on partial data);
- ``min_score``: candidate mean ≥ min → pass; upper CI bound < min → fail; else inconclusive;
  a bootstrap interval (graded scores) over fewer than MIN_INTERVAL_TASKS tasks fails nothing;
- ``max_regression`` r: paired delta (candidate − baseline, over the tasks both scored) CI
  lower bound ≥ −r → pass; upper bound < −r → fail; else inconclusive; inconclusive below
  MIN_INTERVAL_TASKS tasks scored on both sides (issue 38: a percentile bootstrap over two
  tasks read [+25, +100] pts beside an exact test's p = 0.5; it decides nothing);
- ``critical_tasks``: a listed task the baseline passed and the candidate fails → fail (HCL's
  "no newly failing tasks"); a listed task not scored on both sides → inconclusive;
- ``max_error_rate``: (harness_error + infra_error) / finished rollouts of the candidate > max
  → fail.
Verdict: error if any rule errs, else fail if any fails, else inconclusive if any is, else pass.
A task "passes" when its per-task score (the mean over epochs) is 1: every epoch passed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from coevo.evaluations.models import (
    EvaluationState,
)
from coevo.evaluations.stats.means import ScoreSummary, mean_score_summary, per_task_means
from coevo.evaluations.stats.paired import (
    MIN_INTERVAL_TASKS,
    PairedComparison,
    paired_comparison,
)
from coevo.gates.models import GateVerdict
from coevo.gates.policy import GatePolicy
from workers.outcomes import RolloutOutcome

PASS, FAIL, INCONCLUSIVE, ERROR = "pass", "fail", "inconclusive", "error"
_SEVERITY = (ERROR, FAIL, INCONCLUSIVE)
_PASSED_AT = 1 - 1e-9  # a mean of k ones, up to floating-point noise


@dataclass(frozen=True)
class EvaluationFacts:
    """What the verdict needs of one evaluation."""

    label: str  # "candidate" or "baseline"
    state: str
    state_detail: str = ""
    scores: Mapping[str, Sequence[float]] = field(default_factory=dict)
    # Finished (done) rollouts by outcome; cancelled ones are not counted.
    outcomes: Mapping[str, int] = field(default_factory=dict)

    @property
    def rollouts(self) -> int:
        return sum(self.outcomes.values())

    @property
    def errors(self) -> int:
        return self.outcomes.get(RolloutOutcome.HARNESS_ERROR, 0) + self.outcomes.get(
            RolloutOutcome.INFRA_ERROR, 0
        )


@dataclass(frozen=True)
class GateDecision:
    verdict: str
    reasons: list[dict[str, str]]
    statistics: dict[str, Any]


def gate_decide(
    *, policy: GatePolicy, candidate: EvaluationFacts, baseline: EvaluationFacts, seed: int = 0
) -> GateDecision:
    """Judge every declared rule and combine them into the verdict."""
    confidence = policy.confidence
    cand_summary = _summary(candidate.scores, confidence=confidence, seed=seed)
    base_summary = _summary(baseline.scores, confidence=confidence, seed=seed)
    comparison = paired_comparison(
        baseline.scores, candidate.scores, confidence=confidence, seed=seed
    )
    statistics = {
        "confidence": confidence,
        "candidate": _summary_dict(cand_summary),
        "baseline": _summary_dict(base_summary),
        "comparison": _comparison_dict(comparison),
        "errors": {side.label: _errors_dict(side) for side in (candidate, baseline)},
    }
    reasons = [
        _reason("evaluations", ERROR, _evaluation_error(side))
        for side in (candidate, baseline)
        if side.state != EvaluationState.FINISHED
    ]
    if not reasons:
        judges = {
            "min_score": lambda: _min_score(policy, cand_summary),
            "max_regression": lambda: _max_regression(policy, comparison),
            "critical_tasks": lambda: _critical_tasks(policy, candidate, baseline),
            "max_error_rate": lambda: _max_error_rate(policy, candidate),
        }
        reasons = [judges[rule]() for rule in policy.rules]
    outcomes = {reason["outcome"] for reason in reasons}
    verdict = next((o for o in _SEVERITY if o in outcomes), PASS)
    return GateDecision(verdict=GateVerdict(verdict).value, reasons=reasons, statistics=statistics)


def _reason(rule: str, outcome: str, message: str) -> dict[str, str]:
    return {"rule": rule, "outcome": outcome, "message": message}


def _evaluation_error(side: EvaluationFacts) -> str:
    detail = f": {side.state_detail}" if side.state_detail else ""
    return (
        f"The {side.label}'s evaluation {side.state}{detail}. No rule is judged on partial "
        "results: resume or re-run the evaluation, then create the gate again."
    )


def _min_score(policy: GatePolicy, summary: ScoreSummary) -> dict[str, str]:
    minimum = policy.min_score
    if summary.mean is None or summary.interval is None:
        return _reason("min_score", INCONCLUSIVE, "The candidate has no scored task.")
    figures = (
        f"candidate mean {summary.mean:.3f} over {summary.n} tasks, "
        f"{_pct(summary.confidence)} CI [{summary.interval.low:.3f}, {summary.interval.high:.3f}]"
    )
    if summary.mean >= minimum:
        return _reason("min_score", PASS, f"{figures} ≥ minimum {minimum:g}.")
    if summary.method == "bootstrap" and summary.n < MIN_INTERVAL_TASKS:
        return _reason(
            "min_score",
            INCONCLUSIVE,
            f"candidate mean {summary.mean:.3f} is below the minimum {minimum:g}, but over "
            f"{summary.n} tasks of graded scores there are too few for an interval (at least "
            f"{MIN_INTERVAL_TASKS}); more tasks would decide.",
        )
    if summary.interval.high < minimum:
        return _reason(
            "min_score", FAIL, f"{figures}: even the upper bound is below the minimum {minimum:g}."
        )
    return _reason(
        "min_score",
        INCONCLUSIVE,
        f"{figures}: the mean is below the minimum {minimum:g} but the interval reaches it; "
        "more tasks or epochs would decide.",
    )


def _max_regression(policy: GatePolicy, comparison: PairedComparison) -> dict[str, str]:
    bound = -float(policy.max_regression or 0.0)
    if comparison.interval is None or comparison.difference is None:
        return _reason("max_regression", INCONCLUSIVE, "No task was scored on both sides.")
    if comparison.tasks < MIN_INTERVAL_TASKS:
        return _reason(
            "max_regression",
            INCONCLUSIVE,
            f"paired delta {comparison.difference:+.3f} over {comparison.tasks} tasks: too few "
            f"tasks for the interval this rule is judged on (at least {MIN_INTERVAL_TASKS} "
            "scored on both sides); more tasks would decide.",
        )
    low, high = comparison.interval.low, comparison.interval.high
    figures = (
        f"paired delta {comparison.difference:+.3f} over {comparison.tasks} tasks, "
        f"{_pct(comparison.confidence)} CI [{low:+.3f}, {high:+.3f}]"
    )
    if low >= bound:
        return _reason(
            "max_regression", PASS, f"{figures}: the lower bound is within the allowed {bound:+g}."
        )
    if high < bound:
        return _reason(
            "max_regression",
            FAIL,
            f"{figures}: even the upper bound regresses more than the allowed {bound:+g}.",
        )
    return _reason(
        "max_regression",
        INCONCLUSIVE,
        f"{figures}: the interval straddles the allowed {bound:+g}; more tasks or epochs "
        "would decide.",
    )


def _critical_tasks(
    policy: GatePolicy, candidate: EvaluationFacts, baseline: EvaluationFacts
) -> dict[str, str]:
    newly_failing, unscored, already_failing = [], [], []
    for key in policy.critical_tasks:
        before, after = baseline.scores.get(key), candidate.scores.get(key)
        if not before or not after:
            unscored.append(key)
            continue
        passed_before, passed_after = _passed(before), _passed(after)
        if passed_before and not passed_after:
            newly_failing.append(key)
        elif not passed_before and not passed_after:
            already_failing.append(key)
    if newly_failing:
        return _reason(
            "critical_tasks",
            FAIL,
            f"Newly failing critical task(s): {', '.join(newly_failing)} (passed on the "
            "baseline, fail on the candidate).",
        )
    if unscored:
        return _reason(
            "critical_tasks",
            INCONCLUSIVE,
            f"Critical task(s) not scored on both sides: {', '.join(unscored)}.",
        )
    note = (
        f" ({len(already_failing)} already failed on the baseline: {', '.join(already_failing)})"
        if already_failing
        else ""
    )
    return _reason(
        "critical_tasks",
        PASS,
        f"None of the {len(policy.critical_tasks)} critical task(s) newly fails{note}.",
    )


def _max_error_rate(policy: GatePolicy, candidate: EvaluationFacts) -> dict[str, str]:
    maximum = float(policy.max_error_rate or 0.0)
    if not candidate.rollouts:
        return _reason("max_error_rate", INCONCLUSIVE, "The candidate finished no rollout.")
    rate = candidate.errors / candidate.rollouts
    figures = (
        f"{candidate.errors} of {candidate.rollouts} candidate rollouts ended in a harness or "
        f"infra error ({rate:.1%})"
    )
    if rate > maximum:
        return _reason("max_error_rate", FAIL, f"{figures}, above the maximum {maximum:.1%}.")
    return _reason("max_error_rate", PASS, f"{figures}, within the maximum {maximum:.1%}.")


def _passed(scores: Sequence[float]) -> bool:
    return sum(scores) / len(scores) >= _PASSED_AT


def _pct(confidence: float) -> str:
    return f"{confidence * 100:g}%"


def _summary(
    scores: Mapping[str, Sequence[float]], *, confidence: float, seed: int
) -> ScoreSummary:
    return mean_score_summary(
        list(per_task_means(scores).values()), confidence=confidence, seed=seed
    )


def _summary_dict(summary: ScoreSummary) -> dict[str, Any]:
    return {
        "method": summary.method,
        "mean": summary.mean,
        "ci_low": summary.interval.low if summary.interval else None,
        "ci_high": summary.interval.high if summary.interval else None,
        "n_tasks": summary.n,
        "confidence": summary.confidence,
    }


def _comparison_dict(comparison: PairedComparison) -> dict[str, Any]:
    return {
        "n_tasks": comparison.tasks,
        "kind": comparison.kind,
        "baseline_mean": comparison.reference_mean,
        "candidate_mean": comparison.candidate_mean,
        "delta": comparison.difference,
        "ci_low": comparison.interval.low if comparison.interval else None,
        "ci_high": comparison.interval.high if comparison.interval else None,
        "confidence": comparison.confidence,
        "test": comparison.test,
        "p_value": comparison.p_value,
        "significant": comparison.significant,
        # For graded scores (k epochs, fractional scores) fixed/broken are the tasks whose
        # per-task score went up/down.
        "flips": {
            "fixed": sorted(str(key) for key in comparison.improved),
            "broken": sorted(str(key) for key in comparison.regressed),
        },
        "dropped": {
            "baseline_only": comparison.reference_only,
            "candidate_only": comparison.candidate_only,
        },
    }


def _errors_dict(side: EvaluationFacts) -> dict[str, Any]:
    return {
        "rollouts": side.rollouts,
        "harness_error": side.outcomes.get(RolloutOutcome.HARNESS_ERROR, 0),
        "infra_error": side.outcomes.get(RolloutOutcome.INFRA_ERROR, 0),
        "rate": side.errors / side.rollouts if side.rollouts else None,
    }
