"""A promotion request's evidence: what reviewers decide on (docs/architecture.md, "The held-out
seal" and "Evaluation honesty").

Assembled once the request's held-out evaluations are final and stored on the request as JSON,
so the request page shows the same figures on every reload and after the traces are pruned:

- ``reference``: what the candidate is compared with, and a sentence saying so: the channel's
  holder; for an empty channel, the baseline (the candidate's campaign seed, or one the
  requester picked); or none, with the reason;
- ``candidate``, ``holder``, ``baseline``: one side each (``holder`` None for an empty
  channel, ``baseline`` None unless one stood in for the holder): search, validation and
  held-out mean with confidence interval. Held-out: only the request's own sealed
  evaluations. Search/validation: the side's latest finished evaluation on the request's
  suite family (its versions and slices: a campaign on the demo's slice, a promotion on the
  full suite), each labelled with the suite it came from, or ``missing[split]`` saying why
  there is none;
- ``comparison``: the paired comparison on held-out against the reference (flips with task
  keys and the rollout ids of both sides, delta with CI, exact McNemar / sign-test p-value);
- ``heldout_tasks``: every held-out task with both sides' outcome, score and a rollout to open
  (reviewers only: sealed, like the flips);
- ``generalization``: search-set gain vs held-out gain and the gap between them (HDA: much of a
  search-set gain is overfitting to the search set), on one suite for both sides;
- ``compute``: policy tokens and latency per task on held-out, both sides, and the change (HDA:
  part of a gain is bought with more inference compute);
- ``diff`` and ``lineage`` against the reference (harness_store), ``errors`` (harness_error /
  infra_error counts).

Version 1 (before baselines) had no ``reference``, ``baseline``, ``heldout_tasks`` or score
labels, and its flipped tasks named the reference "holder". Readers read every version through
its type (coevo.reviews.promotions.evidence_types, ``evidence_read``), never as a dict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import Avg, Count, Sum
from django.utils import timezone

from coevo.errors import CoevoError
from coevo.evaluations.models import (
    Evaluation,
    EvaluationState,
    Rollout,
    RolloutState,
)
from coevo.evaluations.selectors import (
    evaluation_compare,
    evaluation_statistics,
    evaluation_task_scores,
)
from coevo.evaluations.stats.means import per_task_means
from coevo.reviews.models import BaselineKind
from coevo.reviews.promotions.evidence_types import EVIDENCE_VERSION
from coevo.suites.models import Split, Suite, Task
from coevo.suites.selectors import suite_family, suite_family_root
from harness_store.models import Candidate
from harness_store.selectors import candidate_diff, candidate_diff_names
from harness_store.services import project_repo
from workers.outcomes import RolloutOutcome

DIFF_MAX_CHARS = 200_000
LINEAGE_MAX_COMMITS = 200
# Held-out tasks listed one by one (far above any shipped suite's held-out split: HumanEval's
# is about 33, TextWorld's 10): the list is stored on the request and rendered whole.
HELDOUT_TASKS_MAX = 2_000
# Suites of the family searched for search/validation scores (versions and slices).
FAMILY_MAX_SUITES = 200
# Flips that changed a task's result (the others are ties), highlighted on the page.
CHANGED_FLIPS = ("fixed", "broken", "improved", "regressed")


@dataclass(frozen=True)
class Reference:
    """What the candidate is compared with: ``kind`` holder, campaign_seed or picked."""

    kind: str
    candidate: Candidate
    policy_version: Any
    evaluation: Evaluation


def promotion_reference(*, request: Any) -> Reference | None:
    """The request's reference: its holder, else its baseline, else None."""
    if request.holder_evaluation_id is not None:
        return Reference(
            "holder",
            request.holder_candidate,
            request.holder_policy_version,
            request.holder_evaluation,
        )
    if request.baseline_evaluation_id is not None:
        return Reference(
            request.baseline_kind,
            request.baseline_candidate,
            request.policy_version,
            request.baseline_evaluation,
        )
    return None


def evidence_build(*, request: Any) -> dict[str, Any]:
    """The evidence of ``request`` (a PromotionRequest whose held-out evaluations are final)."""
    candidate_eval: Evaluation = request.candidate_evaluation
    reference = promotion_reference(request=request)
    splits = _split_scores(request=request, reference=reference)
    candidate_side = _side(
        candidate=request.candidate,
        policy_version=request.policy_version,
        heldout=candidate_eval,
        scores=splits["candidate"],
    )
    reference_side = (
        _side(
            candidate=reference.candidate,
            policy_version=reference.policy_version,
            heldout=reference.evaluation,
            scores=splits["reference"],
        )
        if reference is not None
        else None
    )
    comparison = _comparison(reference.evaluation, candidate_eval) if reference else None
    base = reference.candidate if reference else None
    return {
        "version": EVIDENCE_VERSION,
        "assembled_at": timezone.now().isoformat(),
        "holder_generation": request.holder_generation,
        "reference": _reference_summary(request=request, reference=reference),
        "candidate": candidate_side,
        "holder": reference_side if reference and reference.kind == "holder" else None,
        "baseline": reference_side if reference and reference.kind != "holder" else None,
        "comparison": comparison,
        "heldout_tasks": _heldout_tasks(
            suite=request.suite,
            candidate_eval=candidate_eval,
            reference_eval=reference.evaluation if reference else None,
            comparison=comparison,
        ),
        "generalization": _generalization(candidate_side, reference_side, comparison),
        "compute": _compute_delta(candidate_side, reference_side),
        "diff": _diff(request.candidate, base),
        "lineage": _lineage(request.candidate, base),
    }


def _reference_summary(*, request: Any, reference: Reference | None) -> dict[str, Any]:
    """Which reference the evidence used, in a sentence a reviewer reads first."""
    channel = request.channel.name
    if reference is None:
        campaign = request.campaign
        if campaign is None:
            why = "the candidate came from no campaign (it was imported or committed by hand)"
        else:
            why = f"the candidate is the seed of its campaign “{campaign.name}”"
        return {
            "kind": None,
            "sha": None,
            "policy_version": None,
            "summary": (
                f"No comparison: {channel} held nothing, {why}, and no baseline was picked. "
                "To compare, request again with a baseline (the API's baseline field, coevo "
                "promote --baseline SHA, or Baseline on the request form)."
            ),
        }
    sha, short = reference.candidate.sha, reference.candidate.short_sha
    policy = reference.policy_version.name if reference.policy_version else None
    if reference.kind == "holder":
        summary = f"Compared with {channel}'s holder {short}."
    elif reference.kind == BaselineKind.CAMPAIGN_SEED:
        name = request.campaign.name if request.campaign else "its campaign"
        summary = (
            f"Compared with the campaign seed {short} (of “{name}”) because {channel} held nothing."
        )
    else:
        summary = (
            f"Compared with the baseline {short} that {request.requester.get_username()} "
            f"picked, because {channel} held nothing."
        )
    return {"kind": reference.kind, "sha": sha, "policy_version": policy, "summary": summary}


# --- search and validation from the suite family ----------------------------------------------


def _split_scores(*, request: Any, reference: Reference | None) -> dict[str, dict[str, Any]]:
    """Search and validation scores of the candidate and of the reference from the request's
    suite family: per split, the suite where both have a finished evaluation (the request's
    suite first, then the campaign's, then the most recently evaluated), so their gain is
    measured on the same tasks; failing that, each side's own (labelled). Never held-out: those
    come only from the request's own evaluations."""
    family = {
        suite.id: suite
        for suite in suite_family(suite=request.suite)
        .select_related("source")
        .order_by("-created_at")[:FAMILY_MAX_SUITES]
    }
    family.setdefault(request.suite.id, request.suite)
    root = suite_family_root(suite=request.suite)
    campaign_suite = request.campaign.suite_id if request.campaign else None
    sides: dict[str, dict[str, Any]] = {"candidate": {}, "reference": {}}
    missing: dict[str, dict[str, str]] = {"candidate": {}, "reference": {}}
    for split in (Split.SEARCH, Split.VALIDATION):
        mine = _latest_by_suite(
            candidate=request.candidate,
            policy_version=request.policy_version,
            suites=family,
            split=split,
        )
        theirs = (
            _latest_by_suite(
                candidate=reference.candidate,
                policy_version=reference.policy_version,
                suites=family,
                split=split,
            )
            if reference
            else {}
        )
        recent = sorted(
            {*mine, *theirs} - {request.suite.id, campaign_suite},
            key=lambda sid: max(
                e.finished_at or e.created_at for e in (mine.get(sid), theirs.get(sid)) if e
            ),
            reverse=True,
        )
        order = [request.suite.id, campaign_suite, *recent]
        both = next((sid for sid in order if sid in mine and sid in theirs), None)
        for role, found in (("candidate", mine), ("reference", theirs)):
            if role == "reference" and reference is None:
                continue
            sid = both or next((sid for sid in order if sid in found), None)
            if sid is None:
                who = (
                    "this candidate" if role == "candidate" else f"{reference.candidate.short_sha}"
                )
                policy = request.policy_version if role == "candidate" else reference.policy_version
                missing[role][split.value] = (
                    f"No {split.value} evaluation of {who} on {root.name} or its slices under "
                    f"policy {policy.name if policy else 'none'}."
                )
                sides[role][split.value] = None
                continue
            sides[role][split.value] = {
                **_score(found[sid]),
                **_suite_label(family[sid], request_suite=request.suite),
            }
    return {
        role: {"scores": sides[role], "missing": missing[role]}
        for role in ("candidate", "reference")
    }


def _latest_by_suite(
    *, candidate: Candidate, policy_version: Any, suites: dict[Any, Suite], split: str
) -> dict[Any, Evaluation]:
    """The candidate's latest finished evaluation of ``split`` on each suite (as committed:
    an evaluation with knob overrides measured another configuration)."""
    latest: dict[Any, Evaluation] = {}
    for evaluation in Evaluation.objects.filter(
        candidate=candidate,
        policy_version=policy_version,
        suite_id__in=list(suites),
        split=split,
        state=EvaluationState.FINISHED,
        knobs={},
    ).order_by("-finished_at", "-created_at"):
        latest.setdefault(evaluation.suite_id, evaluation)
    return latest


def _suite_label(suite: Suite, *, request_suite: Suite) -> dict[str, Any]:
    return {
        "suite": f"{suite.name}@{suite.version}",
        "suite_id": str(suite.id),
        "same_suite": suite.id == request_suite.id,
        "slice_of": suite.source.name if suite.source_id else None,
    }


# --- one side ---------------------------------------------------------------------------------


def _side(
    *, candidate: Candidate, policy_version: Any, heldout: Evaluation, scores: dict[str, Any]
) -> dict[str, Any]:
    return {
        "sha": candidate.sha,
        "policy_version": policy_version.name if policy_version else None,
        "scores": {**scores["scores"], Split.HELDOUT.value: _score(heldout)},
        "missing": scores["missing"],
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
            outcome__in=[RolloutOutcome.HARNESS_ERROR, RolloutOutcome.INFRA_ERROR],
        )
        .values_list("outcome")
        .annotate(n=Count("id"))
        .values_list("outcome", "n")
    )
    return {
        "harness_error": counts.get(RolloutOutcome.HARNESS_ERROR, 0),
        "infra_error": counts.get(RolloutOutcome.INFRA_ERROR, 0),
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


def _comparison(reference_eval: Evaluation, candidate_eval: Evaluation) -> dict[str, Any]:
    compared = evaluation_compare(reference=reference_eval, candidate=candidate_eval)
    result = compared.statistics.as_dict()
    result["flipped_tasks"] = [
        {
            "task": row.task_key,
            "flip": row.flip,
            "reference_score": row.reference_score,
            "candidate_score": row.candidate_score,
            "reference_rollout": str(row.reference_rollout) if row.reference_rollout else None,
            "candidate_rollout": str(row.candidate_rollout) if row.candidate_rollout else None,
        }
        for row in compared.flips
    ]
    return result


def _heldout_tasks(
    *,
    suite: Suite,
    candidate_eval: Evaluation,
    reference_eval: Evaluation | None,
    comparison: dict[str, Any] | None,
) -> dict[str, Any]:
    """Every held-out task of the suite, in suite order: each side's outcome (the first
    epoch's; with more epochs, how many passed too), mean score and first rollout, and the
    task's flip. Reviewers open every trace from here, not only the flipped ones."""
    keys = list(
        Task.objects.filter(suite=suite, split=Split.HELDOUT)
        .order_by("position")
        .values_list("key", flat=True)[: HELDOUT_TASKS_MAX + 1]
    )
    total = Task.objects.filter(suite=suite, split=Split.HELDOUT).count()
    keys = keys[:HELDOUT_TASKS_MAX]
    flip_of = {
        key: name
        for name, names in ((comparison or {}).get("flips") or {}).items()
        for key in names
    }
    sides = {"candidate": _task_results(candidate_eval, keys)}
    if reference_eval is not None:
        sides["reference"] = _task_results(reference_eval, keys)
    return {
        "total": total,
        "truncated": total > len(keys),
        "tasks": [
            {
                "task": key,
                "flip": flip_of.get(key),
                "changed": flip_of.get(key) in CHANGED_FLIPS,
                "candidate": sides["candidate"].get(key),
                "reference": sides["reference"].get(key) if reference_eval else None,
            }
            for key in keys
        ],
    }


def _task_results(evaluation: Evaluation, keys: list[str]) -> dict[str, dict[str, Any]]:
    means = per_task_means(evaluation_task_scores(evaluation_id=evaluation.id))
    results: dict[str, dict[str, Any]] = {}
    for key, rollout_id, outcome, state in (
        Rollout.objects.filter(evaluation=evaluation, task__key__in=keys)
        .order_by("task__position", "epoch")
        .values_list("task__key", "id", "outcome", "state")
    ):
        row = results.setdefault(
            key,
            {
                "rollout": str(rollout_id),
                "outcome": outcome or state,
                "score": means.get(key),
                "rollouts": 0,
                "passed": 0,
            },
        )
        row["rollouts"] += 1
        row["passed"] += outcome == RolloutOutcome.PASSED
    return results


def _generalization(
    candidate: dict[str, Any], reference: dict[str, Any] | None, comparison: dict[str, Any] | None
) -> dict[str, Any]:
    """Search-set gain against held-out gain. ``not_generalized`` is the share of the search
    gain that did not carry over to held-out (HDA); only defined for a positive search gain.
    The search gain needs both sides' search scores on one suite (a gain across two suites
    would measure the suites)."""
    mine = candidate["scores"].get("search")
    theirs = reference["scores"].get("search") if reference else None
    search_gain, search_suite, note = None, None, None
    if mine and theirs and mine["suite_id"] == theirs["suite_id"]:
        if mine["mean"] is not None and theirs["mean"] is not None:
            search_gain, search_suite = mine["mean"] - theirs["mean"], mine["suite"]
    elif reference is None:
        note = "No search gain: there is no reference to compare with."
    elif not mine or not theirs:
        without = candidate if not mine else reference
        note = f"No search gain. {without['missing'].get('search', '')}".strip()
    else:
        note = (
            f"No search gain: the candidate's search score is on {mine['suite']}, the "
            f"reference's on {theirs['suite']}; evaluate both on one suite to compare."
        )
    heldout_gain = comparison["difference"] if comparison else None
    gap = (
        search_gain - heldout_gain if search_gain is not None and heldout_gain is not None else None
    )
    share = gap / search_gain if gap is not None and search_gain and search_gain > 0 else None
    return {
        "search_gain": search_gain,
        "search_suite": search_suite,
        "note": note,
        "heldout_gain": heldout_gain,
        "gap": gap,
        "not_generalized": share,
    }


def _compute_delta(candidate: dict[str, Any], reference: dict[str, Any] | None) -> dict[str, Any]:
    def delta(key: str) -> tuple[float | None, float | None]:
        if reference is None:
            return None, None
        new, old = candidate["cost"][key], reference["cost"][key]
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
    # ``holder``: the reference (the holder, or a baseline standing in for one).
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
