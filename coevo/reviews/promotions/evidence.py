"""A promotion request's evidence: what reviewers decide on (DESIGN.md §8, RESEARCH.md
"Evaluation honesty").

Assembled once both held-out evaluations are final and stored on the request as JSON, so the
request page shows the same figures on every reload and after the traces are pruned:

- ``scores``: search, validation and held-out mean with confidence interval for the candidate
  and the holder (search/validation: the latest finished evaluation of each on the request's
  suite under its policy version, if any; held-out: the request's own evaluations);
- ``comparison``: the paired comparison on held-out (flips with task keys and the rollout ids
  of both sides, delta with CI, exact McNemar / sign-test p-value);
- ``generalization``: search-set gain vs held-out gain and the gap between them (HDA: much of a
  search-set gain is overfitting to the search set);
- ``compute``: policy tokens and latency per task on held-out, both sides, and the change (HDA:
  part of a gain is bought with more inference compute);
- ``diff`` and ``lineage`` against the holder (harness_store), ``errors`` (harness_error /
  infra_error counts).
The holder side is None when the channel was empty.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Avg, Count, Sum
from django.utils import timezone

from coevo.errors import CoevoError
from coevo.evaluations.models import Evaluation, EvaluationState, Outcome, Rollout, RolloutState
from coevo.evaluations.selectors import evaluation_compare, evaluation_statistics
from coevo.suites.models import Split
from harness_store.models import Candidate
from harness_store.selectors import candidate_diff, candidate_diff_names
from harness_store.services import project_repo

EVIDENCE_VERSION = 1
DIFF_MAX_CHARS = 200_000
LINEAGE_MAX_COMMITS = 200


def evidence_build(*, request: Any) -> dict[str, Any]:
    """The evidence of ``request`` (a PromotionRequest whose held-out evaluations are final)."""
    candidate_eval: Evaluation = request.candidate_evaluation
    holder_eval: Evaluation | None = request.holder_evaluation
    candidate_side = _side(
        candidate=request.candidate,
        policy_version=request.policy_version,
        suite_id=request.suite_id,
        heldout=candidate_eval,
    )
    holder_side = (
        _side(
            candidate=request.holder_candidate,
            policy_version=request.holder_policy_version,
            suite_id=request.suite_id,
            heldout=holder_eval,
        )
        if holder_eval is not None
        else None
    )
    comparison = _comparison(holder_eval, candidate_eval) if holder_eval else None
    return {
        "version": EVIDENCE_VERSION,
        "assembled_at": timezone.now().isoformat(),
        "holder_generation": request.holder_generation,
        "candidate": candidate_side,
        "holder": holder_side,
        "comparison": comparison,
        "generalization": _generalization(candidate_side, holder_side, comparison),
        "compute": _compute_delta(candidate_side, holder_side),
        "diff": _diff(request.candidate, request.holder_candidate),
        "lineage": _lineage(request.candidate, request.holder_candidate),
    }


# --- one side ---------------------------------------------------------------------------------


def _side(
    *, candidate: Candidate, policy_version: Any, suite_id: Any, heldout: Evaluation
) -> dict[str, Any]:
    scores = {}
    for split in (Split.SEARCH, Split.VALIDATION):
        latest = (
            Evaluation.objects.filter(
                candidate=candidate,
                policy_version=policy_version,
                suite_id=suite_id,
                split=split,
                state=EvaluationState.FINISHED,
            )
            .order_by("-finished_at", "-created_at")
            .first()
        )
        scores[split.value] = _score(latest) if latest else None
    scores[Split.HELDOUT.value] = _score(heldout)
    return {
        "sha": candidate.sha,
        "policy_version": policy_version.name if policy_version else None,
        "scores": scores,
        "errors": _errors(heldout),
        "cost": _cost(heldout),
    }


def _score(evaluation: Evaluation) -> dict[str, Any]:
    summary = evaluation_statistics(evaluation=evaluation).mean
    return {
        "evaluation": str(evaluation.id),
        "state": evaluation.state,
        "mean": summary.mean,
        "ci_low": summary.interval.low if summary.interval else None,
        "ci_high": summary.interval.high if summary.interval else None,
        "confidence": summary.confidence,
        "method": summary.method,
        "n_tasks": summary.n,
        "epochs": evaluation.epochs,
    }


def _errors(evaluation: Evaluation) -> dict[str, int]:
    counts = dict(
        Rollout.objects.filter(
            evaluation=evaluation,
            state=RolloutState.DONE,
            outcome__in=[Outcome.HARNESS_ERROR, Outcome.INFRA_ERROR],
        )
        .values_list("outcome")
        .annotate(n=Count("id"))
        .values_list("outcome", "n")
    )
    return {
        "harness_error": counts.get(Outcome.HARNESS_ERROR, 0),
        "infra_error": counts.get(Outcome.INFRA_ERROR, 0),
    }


def _cost(evaluation: Evaluation) -> dict[str, Any]:
    """Policy tokens and latency per task (summed over a task's epochs, averaged over tasks),
    over the rollouts that finished (infra errors included: they spent tokens too)."""
    done = Rollout.objects.filter(evaluation=evaluation, state=RolloutState.DONE)
    agg = done.aggregate(
        prompt=Sum("prompt_tokens"),
        completion=Sum("completion_tokens"),
        latency=Sum("latency_ms"),
        tasks=Count("task", distinct=True),
        rollouts=Count("id"),
        calls=Avg("model_calls"),
    )
    tasks = agg["tasks"] or 0
    tokens = (agg["prompt"] or 0) + (agg["completion"] or 0)
    return {
        "tasks": tasks,
        "rollouts": agg["rollouts"] or 0,
        "tokens_per_task": tokens / tasks if tasks else None,
        "prompt_tokens_per_task": (agg["prompt"] or 0) / tasks if tasks else None,
        "completion_tokens_per_task": (agg["completion"] or 0) / tasks if tasks else None,
        "latency_ms_per_task": (agg["latency"] or 0) / tasks if tasks else None,
        "model_calls_per_rollout": agg["calls"],
    }


# --- comparisons ------------------------------------------------------------------------------


def _comparison(holder_eval: Evaluation, candidate_eval: Evaluation) -> dict[str, Any]:
    compared = evaluation_compare(reference=holder_eval, candidate=candidate_eval)
    result = compared.statistics.as_dict()
    result["flipped_tasks"] = [
        {
            "task": row.task_key,
            "flip": row.flip,
            "holder_score": row.reference_score,
            "candidate_score": row.candidate_score,
            "holder_rollout": str(row.reference_rollout) if row.reference_rollout else None,
            "candidate_rollout": str(row.candidate_rollout) if row.candidate_rollout else None,
        }
        for row in compared.flips
    ]
    return result


def _mean(side: dict[str, Any] | None, split: str) -> float | None:
    if side is None or side["scores"].get(split) is None:
        return None
    return side["scores"][split]["mean"]


def _generalization(
    candidate: dict[str, Any], holder: dict[str, Any] | None, comparison: dict[str, Any] | None
) -> dict[str, Any]:
    """Search-set gain against held-out gain. ``not_generalized`` is the share of the search
    gain that did not carry over to held-out (HDA); only defined for a positive search gain."""
    search_c, search_h = _mean(candidate, "search"), _mean(holder, "search")
    search_gain = search_c - search_h if search_c is not None and search_h is not None else None
    heldout_gain = comparison["difference"] if comparison else None
    gap = (
        search_gain - heldout_gain if search_gain is not None and heldout_gain is not None else None
    )
    share = gap / search_gain if gap is not None and search_gain and search_gain > 0 else None
    return {
        "search_gain": search_gain,
        "heldout_gain": heldout_gain,
        "gap": gap,
        "not_generalized": share,
    }


def _compute_delta(candidate: dict[str, Any], holder: dict[str, Any] | None) -> dict[str, Any]:
    def delta(key: str) -> tuple[float | None, float | None]:
        if holder is None:
            return None, None
        new, old = candidate["cost"][key], holder["cost"][key]
        if new is None or old is None:
            return None, None
        return new - old, (new / old if old else None)

    tokens_delta, tokens_ratio = delta("tokens_per_task")
    latency_delta, latency_ratio = delta("latency_ms_per_task")
    return {
        "tokens_per_task_delta": tokens_delta,
        "tokens_per_task_ratio": tokens_ratio,
        "latency_ms_per_task_delta": latency_delta,
        "latency_ms_per_task_ratio": latency_ratio,
    }


# --- code -------------------------------------------------------------------------------------


def _diff(candidate: Candidate, holder: Candidate | None) -> dict[str, Any]:
    """The changed files and the diff's text. The list is git's own (NUL-separated, every name
    as it is), not read back from the text's headers: a reviewer must see every changed file,
    also when the text is too large to show or a name is one git quotes."""
    base = holder.sha if holder else None
    try:
        files = candidate_diff_names(candidate=candidate, base=holder)
    except CoevoError as exc:
        return {"base": base, "files": [], "error": str(exc)}
    try:
        text = candidate_diff(candidate=candidate, base=holder)
    except CoevoError as exc:
        return {"base": base, "files": files, "error": str(exc)}
    return {
        "base": base,
        "files": files,
        "text": text[:DIFF_MAX_CHARS],
        "truncated": len(text) > DIFF_MAX_CHARS,
    }


def _lineage(candidate: Candidate, holder: Candidate | None) -> dict[str, Any]:
    """The commits on the path from the holder to the candidate: the candidate's ancestors
    (itself included) that are not the holder's, newest first."""
    try:
        repo = project_repo(project=candidate.project)
        limit = LINEAGE_MAX_COMMITS + 1
        ours = repo.log(candidate.sha, max_count=limit)
        theirs = {c.sha for c in repo.log(holder.sha, max_count=limit)} if holder else set()
    except CoevoError as exc:
        return {"error": str(exc)}
    mine = {c.sha for c in ours}
    path = [c for c in ours if c.sha not in theirs]
    return {
        "holder_is_ancestor": holder is not None and holder.sha in mine,
        "candidate_is_ancestor": holder is not None and candidate.sha in theirs,
        "commits": [
            {
                "sha": c.sha,
                "parents": list(c.parents),
                "message": c.message.strip().splitlines()[0] if c.message.strip() else "",
                "author": c.author_name,
                "authored_at": c.authored_at.isoformat(),
            }
            for c in path[:LINEAGE_MAX_COMMITS]
        ],
        "truncated": len(path) > LINEAGE_MAX_COMMITS or len(ours) >= limit,
    }
