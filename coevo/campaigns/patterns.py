"""Failure patterns: recurring failures of a campaign's candidates, kept as persistent issues.

ADIAS carries repair progress as issue state (identity, lifecycle, evidence, interventions)
instead of re-deriving it from candidate history each round. Here the identity is a
deterministic *signature* of a failed SEARCH-split rollout (outcome, error kind, the verifier's
or error's message with numbers, paths and quoted text stripped, and for multi-step suites the
class of the last observation); the lifecycle is open → addressed (a candidate solved most of
its tasks) → regressed (a later best fails most of them again) → addressed …

Only search-split rollouts ever feed a pattern: patterns are shown to proposers, and
validation or held-out material must never reach them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections import defaultdict
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from coevo.campaigns.models import (
    Campaign,
    FailurePattern,
    PatternStatus,
    Proposal,
    ProposalState,
)
from coevo.evaluations.models import (
    Evaluation,
    Rollout,
    RolloutState,
    TraceStep,
)
from coevo.evaluations.traces import trace_step_typed
from workers.outcomes import RolloutOutcome
from workers.trace import EnvReset, EnvStep, StepKind

logger = logging.getLogger(__name__)

FAILED_OUTCOMES = (RolloutOutcome.TASK_FAILURE, RolloutOutcome.HARNESS_ERROR)
SCORED_OUTCOMES = (RolloutOutcome.PASSED, *FAILED_OUTCOMES)
MAX_TASK_KEYS = 200
MAX_EVIDENCE = 8
EXCERPT_CHARS = 400
MESSAGE_CHARS = 160
OBSERVATION_CHARS = 80
NAME_CHARS = 120

# --- the signature -------------------------------------------------------------------------

# Order matters: quoted text first (it may hold paths and numbers), then hex, paths, numbers.
_QUOTED = re.compile(r"""(?<!\w)'[^'\n]*'(?!\w)|"[^"\n]*"|`[^`\n]*`""")
_HEX = re.compile(r"\b0x[0-9a-f]+\b|\b[0-9a-f]{7,64}\b")
# Not a path: a run of digits, dots and slashes alone ("0/4 points", "1.5/2"), which is a
# fraction for _NUMBER; the lookahead sees the whole run (a digit, dot or slash after it fails
# the inner test), so "/12/abc" and "2024/01/x.txt" are still paths.
_PATH = re.compile(
    r"(?<![\w.])(?![\d./]+(?![\w./@+-]))"
    r"(?:(?:[a-z]:)?(?:~|\.{1,2})?(?:/[\w.@+-]+)+/?|[\w.-]+(?:/[\w.-]+)+/?)"
)
_NUMBER = re.compile(r"[-+]?\d+(?:[.,]\d+)*(?:e[-+]?\d+)?")
_SPACE = re.compile(r"\s+")


def message_normalize(text: str, *, limit: int = MESSAGE_CHARS) -> str:
    """The class of a message: its first non-empty line, lower-cased, with quoted text,
    hex ids, paths and numbers replaced by placeholders, so that "answer '41' at /tmp/x/3"
    and "answer '7' at /tmp/y/9" group together. Deterministic: same text, same class."""
    line = next((ln for ln in str(text or "").splitlines() if ln.strip()), "")
    line = line.strip().lower()
    line = _QUOTED.sub("<str>", line)
    line = _HEX.sub("<hex>", line)
    line = _PATH.sub("<path>", line)
    line = _NUMBER.sub("<n>", line)
    line = _SPACE.sub(" ", line).strip()
    return line[:limit].rstrip()


def failure_signature(
    *, outcome: str, error_kind: str, message: str, observation: str = ""
) -> tuple[str, str]:
    """``(signature, key)`` of one failure; the key (sha1) is the pattern's identity."""
    parts = [outcome, error_kind or "-", message_normalize(message)]
    if observation:
        first = re.split(r"(?<=[.!?])\s", observation.strip(), maxsplit=1)[0]
        parts.append("last: " + message_normalize(first, limit=OBSERVATION_CHARS))
    signature = " | ".join(parts)
    return signature, hashlib.sha1(signature.encode()).hexdigest()


def _pattern_name(outcome: str, error_kind: str, message: str, observation: str) -> str:
    label = (
        f"harness error ({error_kind or 'other'})"
        if outcome == RolloutOutcome.HARNESS_ERROR
        else "task failure"
    )
    name = f"{label}: {message_normalize(message, limit=80) or 'no message'}"
    if observation:
        name += f" · last: {message_normalize(observation, limit=40)}"
    return name[:NAME_CHARS]


# --- updating from a search evaluation ----------------------------------------------------


def failure_patterns_update(*, campaign: Campaign, evaluation: Evaluation) -> list[FailurePattern]:
    """Group the failed rollouts of a finished SEARCH evaluation of the campaign into patterns
    (new ones open; known ones gain counts and evidence), then move statuses: a pattern whose
    tasks this candidate mostly solves is addressed by it. Idempotent per evaluation.

    Returns the patterns seen in this evaluation. Anything that is not a search evaluation of
    one of the campaign's proposals is ignored.
    """
    if evaluation.split != campaign.search_split or evaluation.suite_id != campaign.suite_id:
        return []
    proposal = (
        Proposal.objects.filter(campaign=campaign, search_evaluation=evaluation)
        .select_related("candidate")
        .first()
    )
    if proposal is None or proposal.candidate is None:
        return []
    rollouts = list(
        Rollout.objects.filter(
            evaluation=evaluation,
            state=RolloutState.DONE,
            outcome__in=SCORED_OUTCOMES,
            # Belt and braces: the evaluation is of the search split already.
            task__split=campaign.search_split,
        )
        .select_related("task")
        .order_by("task__position", "epoch")
    )
    groups: dict[str, dict[str, Any]] = {}
    for rollout in rollouts:
        if rollout.outcome not in FAILED_OUTCOMES:
            continue
        observation, action = _last_observation(rollout)
        signature, key = failure_signature(
            outcome=rollout.outcome,
            error_kind=rollout.error_kind,
            message=rollout.detail,
            observation=observation,
        )
        group = groups.setdefault(
            key,
            {
                "signature": signature,
                "outcome": rollout.outcome,
                "name": _pattern_name(
                    rollout.outcome, rollout.error_kind, rollout.detail, observation
                ),
                "tasks": [],
                "evidence": [],
                "count": 0,
            },
        )
        group["count"] += 1
        if rollout.task.key not in group["tasks"]:
            group["tasks"].append(rollout.task.key)
        group["evidence"].append(
            {
                "task": rollout.task.key,
                "rollout": str(rollout.id),
                "proposal": proposal.sequence,
                "excerpt": _excerpt(rollout, observation, action),
            }
        )
    seen = []
    with transaction.atomic():
        for key in sorted(groups):
            pattern = _record(campaign, proposal, evaluation, key, groups[key])
            if pattern is not None:
                seen.append(pattern)
        _mark_addressed(campaign, proposal, _task_results(rollouts))
        failure_patterns_check_regressions(campaign=campaign)
    return seen


def _record(
    campaign: Campaign,
    proposal: Proposal,
    evaluation: Evaluation,
    key: str,
    group: dict[str, Any],
) -> FailurePattern | None:
    evaluation_id = str(evaluation.id)
    pattern = FailurePattern.objects.select_for_update().filter(campaign=campaign, key=key).first()
    if pattern is None:
        try:
            with transaction.atomic():
                return FailurePattern.objects.create(
                    campaign=campaign,
                    key=key,
                    name=group["name"],
                    signature=group["signature"],
                    outcome=group["outcome"],
                    task_keys=sorted(group["tasks"])[:MAX_TASK_KEYS],
                    evidence=group["evidence"][:MAX_EVIDENCE],
                    first_seen=proposal,
                    last_seen=proposal,
                    occurrences=group["count"],
                    proposals=1,
                    evaluation_ids=[evaluation_id],
                )
        except IntegrityError:
            # Another update created it first (the runner holds the campaign lock, so only a
            # caller outside the runner gets here): count on the existing row.
            pattern = FailurePattern.objects.select_for_update().get(campaign=campaign, key=key)
    if evaluation_id in pattern.evaluation_ids:
        return pattern
    tasks = sorted(set(pattern.task_keys) | set(group["tasks"]))[:MAX_TASK_KEYS]
    # The newest examples: what the current candidates still get wrong.
    evidence = (pattern.evidence + group["evidence"][:MAX_EVIDENCE])[-MAX_EVIDENCE:]
    FailurePattern.objects.filter(id=pattern.id).update(
        task_keys=tasks,
        evidence=evidence,
        last_seen=proposal,
        occurrences=pattern.occurrences + group["count"],
        proposals=pattern.proposals + 1,
        evaluation_ids=[*pattern.evaluation_ids, evaluation_id],
        updated_at=timezone.now(),
    )
    pattern.refresh_from_db()
    return pattern


def _task_results(rollouts: list[Rollout]) -> dict[str, bool]:
    """Solved or not, per task: most of its scored epochs passed."""
    passed: dict[str, list[bool]] = defaultdict(list)
    for rollout in rollouts:
        if rollout.outcome in SCORED_OUTCOMES:
            passed[rollout.task.key].append(rollout.outcome == RolloutOutcome.PASSED)
    return {task: 2 * sum(results) > len(results) for task, results in passed.items()}


def _mark_addressed(campaign: Campaign, proposal: Proposal, results: dict[str, bool]) -> None:
    for pattern in FailurePattern.objects.filter(
        campaign=campaign, status__in=[PatternStatus.OPEN, PatternStatus.REGRESSED]
    ):
        tasks = pattern.task_keys
        solved = sum(1 for task in tasks if results.get(task))
        if not tasks or 2 * solved <= len(tasks):
            continue
        candidate = proposal.candidate
        again = " again" if pattern.status == PatternStatus.REGRESSED else ""
        # regressed_in stays: the pattern's history (it was lost once, in that proposal).
        FailurePattern.objects.filter(id=pattern.id, status=pattern.status).update(
            status=PatternStatus.ADDRESSED,
            addressed_by=candidate,
            addressed_in=proposal,
            status_detail=(
                f"addressed{again} by candidate {candidate.short_sha} (proposal "
                f"#{proposal.sequence}): it solved {solved} of the pattern's {len(tasks)} task(s)"
            ),
            updated_at=timezone.now(),
        )


def failure_patterns_check_regressions(*, campaign: Campaign) -> list[FailurePattern]:
    """Addressed patterns whose tasks the campaign's current best (chosen on validation, and
    proposed after the pattern was addressed) mostly fails on its search evaluation become
    ``regressed`` (harness-level forgetting: a later "better" candidate lost the fix)."""
    if campaign.best_candidate_id is None:
        return []
    best = (
        Proposal.objects.filter(
            campaign=campaign,
            candidate_id=campaign.best_candidate_id,
            state=ProposalState.EVALUATED,
            search_evaluation__isnull=False,
        )
        .select_related("candidate")
        .order_by("-sequence")
        .first()
    )
    if best is None:
        return []
    results = _task_results(
        list(
            Rollout.objects.filter(
                evaluation_id=best.search_evaluation_id,
                state=RolloutState.DONE,
                outcome__in=SCORED_OUTCOMES,
                task__split=campaign.search_split,
            ).select_related("task")
        )
    )
    regressed = []
    for pattern in FailurePattern.objects.filter(
        campaign=campaign, status=PatternStatus.ADDRESSED, addressed_in__sequence__lt=best.sequence
    ):
        tasks = pattern.task_keys
        failed = sum(1 for task in tasks if task in results and not results[task])
        if 2 * failed <= len(tasks):
            continue
        moved = FailurePattern.objects.filter(id=pattern.id, status=PatternStatus.ADDRESSED).update(
            status=PatternStatus.REGRESSED,
            regressed_in=best,
            status_detail=(
                f"regressed: the campaign's best, candidate {best.candidate.short_sha} "
                f"(proposal #{best.sequence}), fails {failed} of its {len(tasks)} task(s) again"
            ),
            updated_at=timezone.now(),
        )
        if moved:
            regressed.append(pattern)
    return regressed


# --- trace excerpts ------------------------------------------------------------------------


def _last_observation(rollout: Rollout) -> tuple[str, str]:
    """The last environment observation and action of a multi-step rollout ("" otherwise)."""
    step = (
        TraceStep.objects.filter(rollout=rollout, kind__in=[StepKind.ENV_STEP, StepKind.ENV_RESET])
        .order_by("-attempt", "-index")
        .first()
    )
    if step is None:
        return "", ""
    moved = trace_step_typed(step)
    if not isinstance(moved, EnvStep | EnvReset):
        return "", ""
    observation = moved.observation
    if isinstance(observation, dict):
        observation = observation.get("observation", "")
    action = moved.action if isinstance(moved, EnvStep) else None
    return str(observation or ""), str(action or "")


def _excerpt(rollout: Rollout, observation: str, action: str) -> str:
    parts = []
    if action:
        parts.append(f"last action {action[:80]!r} → {observation.strip()[:160]!r}")
    if rollout.answer is not None and rollout.outcome == RolloutOutcome.TASK_FAILURE:
        answer = rollout.answer if isinstance(rollout.answer, str) else json.dumps(rollout.answer)
        parts.append(f"answer {answer[:120]!r}")
    parts.append(rollout.detail.strip()[:240])
    return " · ".join(p for p in parts if p)[:EXCERPT_CHARS]


# --- what proposers and pages see -----------------------------------------------------------


def failure_patterns_for_proposer(
    *, campaign: Campaign, limit: int = 10, tasks: int = 8, excerpts: int = 3
) -> list[dict[str, Any]]:
    """The campaign's patterns as an llm-patch proposer sees them (search split only):
    unsolved ones first (regressed, then open), most frequent first, then addressed ones."""
    rank = {PatternStatus.REGRESSED: 0, PatternStatus.OPEN: 1, PatternStatus.ADDRESSED: 2}
    patterns = sorted(
        FailurePattern.objects.filter(campaign=campaign).select_related("addressed_by"),
        key=lambda p: (rank.get(p.status, 3), -p.occurrences, p.name),
    )[:limit]
    return [
        {
            "name": p.name,
            "status": p.status,
            "signature": p.signature,
            "occurrences": p.occurrences,
            "proposals": p.proposals,
            "tasks": p.task_keys[:tasks],
            "excerpts": [e["excerpt"] for e in p.evidence[-excerpts:]],
            "addressed_by": p.addressed_by.sha if p.addressed_by else None,
            "detail": p.status_detail,
        }
        for p in patterns
    ]


__all__ = [
    "failure_patterns_check_regressions",
    "failure_patterns_for_proposer",
    "failure_patterns_update",
    "failure_signature",
    "message_normalize",
]
