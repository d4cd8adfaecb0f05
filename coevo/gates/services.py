"""Gate writes: create (resolve the baseline, start both evaluations) and advance (decide once
both evaluations are final).

A gate advances when either of its evaluations ends (the ``evaluation_finished`` signal enqueues
``coevo.gates.tasks.gate_advance``) and, as a safety net, from beat (``gate_advance_ready``):
a missed signal delays a verdict, it never loses one. ``gate_advance`` is idempotent: the
verdict is written with a compare-and-swap from an open state, so a redelivered task or the
beat job racing the signal finishes the gate once.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import Count
from django.utils import timezone

from coevo.enqueue import task_enqueue
from coevo.errors import CoevoError, InvalidInput, NotFound, PermissionDenied
from coevo.evaluations.ledger import BudgetLimits, budget_create
from coevo.evaluations.models import (
    EVALUATION_FINAL_STATES,
    Evaluation,
    EvaluationState,
    Rollout,
    RolloutState,
)
from coevo.evaluations.selectors import evaluation_task_scores
from coevo.evaluations.services import evaluation_create
from coevo.gates.models import GATE_OPEN_STATES, Gate, GateState, GateVerdict
from coevo.gates.policy import GatePolicy
from coevo.gates.verdict import EvaluationFacts, GateDecision, gate_decide
from coevo.policies.models import PolicyVersion
from coevo.projects.models import Project
from coevo.reviews.models import Channel
from coevo.suites.models import Split, Suite, Task
from harness_store.models import Candidate

logger = logging.getLogger(__name__)

# The Celery task name (coevo.gates.tasks registers it; services send it by name).
GATE_ADVANCE_TASK = "coevo.gates.tasks.gate_advance"

_SHA = re.compile(r"^[0-9a-fA-F]{7,40}$")


def gate_create(
    *,
    project: Project,
    candidate: Candidate,
    against: str,
    suite: Suite,
    split: str = Split.VALIDATION,
    policy_version: PolicyVersion | None = None,
    epochs: int = 1,
    seed: int = 0,
    min_score: float | None = None,
    max_regression: float | None = None,
    confidence: float = 0.95,
    critical_tasks: Iterable[str] = (),
    max_error_rate: float | None = None,
    budget_usd: Decimal | None = None,
    created_by: AbstractBaseUser | None = None,
) -> Gate:
    """Create the gate and its two evaluations (baseline and candidate, same suite split,
    policy version, epochs and seed) in one transaction; their rollouts are enqueued when it
    commits. An unchanged baseline costs nothing to evaluate again: its rollouts come from the
    rollout cache. ``budget_usd`` bounds both evaluations together (one ledger account, their
    parent): refused (BudgetExceeded, nothing created) when their worst case exceeds it.
    """
    if candidate.project_id != project.id or suite.project_id != project.id:
        raise InvalidInput("The candidate and the suite must belong to this project.")
    if split == Split.HELDOUT:
        raise PermissionDenied(
            "Gates never run on the held-out split: held-out runs only inside a promotion "
            "request. Use the validation (or search) split."
        )
    if split not in Split.values:
        raise InvalidInput(f"Unknown split {split!r}: use validation or search.")
    policy = GatePolicy.build(
        min_score=min_score,
        max_regression=max_regression,
        confidence=confidence,
        critical_tasks=critical_tasks,
        max_error_rate=max_error_rate,
    )
    _check_critical_tasks(suite=suite, split=split, keys=policy.critical_tasks)
    against = (against or "").strip()
    baseline, channel = _resolve_against(project=project, against=against)
    if policy_version is None:
        policy_version = channel.policy_version if channel and channel.policy_version else None
    if policy_version is None:
        from coevo.policies.services import policy_version_get_default

        policy_version = policy_version_get_default()

    with transaction.atomic():
        common = {
            "suite": suite,
            "split": split,
            "policy_version": policy_version,
            "epochs": epochs,
            "seed": seed,
            "created_by": created_by,
        }
        if budget_usd is not None:
            common["parent_budget"] = budget_create(
                project=project,
                name=f"gate {candidate.short_sha} against {against[:100]}",
                limits=BudgetLimits(usd=budget_usd),
            )
        baseline_evaluation = evaluation_create(candidate=baseline, **common)
        # The reference link shows the comparison on the candidate's evaluation page.
        candidate_evaluation = evaluation_create(
            candidate=candidate, reference=baseline_evaluation, **common
        )
        gate = Gate.objects.create(
            project=project,
            candidate=candidate,
            baseline=baseline,
            against=against,
            suite=suite,
            split=split,
            policy_version=policy_version,
            epochs=epochs,
            seed=seed,
            policy=policy.as_dict(),
            candidate_evaluation=candidate_evaluation,
            baseline_evaluation=baseline_evaluation,
            created_by=created_by,
        )
        # Both evaluations may be complete at once (every rollout from the cache) and their
        # signals sent before the gate row was visible: look once more after commit.
        gate_advance_enqueue(gate_id=gate.id)
    logger.info(
        "gate %s created: candidate %s against %s (%s) on %s/%s, rules %s",
        gate.id,
        candidate.short_sha,
        against,
        baseline.short_sha,
        suite,
        split,
        ",".join(policy.rules),
    )
    return gate


def _resolve_against(*, project: Project, against: str) -> tuple[Candidate, Channel | None]:
    """A channel of the project (its current holder), else a candidate SHA of the project."""
    if not against:
        raise InvalidInput("Name a baseline: a channel (e.g. production) or a candidate SHA.")
    channel = (
        Channel.objects.filter(project=project, name=against)
        .select_related("candidate", "policy_version")
        .first()
    )
    if channel is not None:
        if channel.candidate is None:
            raise InvalidInput(
                f"Channel {against!r} of project {project.slug} holds no candidate yet: move it "
                f"first (manage.py channel_move --project {project.slug} --channel {against} "
                "--candidate SHA), or gate against a candidate SHA."
            )
        return channel.candidate, channel
    if not _SHA.match(against):
        raise NotFound(
            f"Project {project.slug} has no channel {against!r}, and it is not a commit SHA: "
            "name a channel (e.g. production) or give a candidate SHA (7 to 40 hex digits)."
        )
    matches = list(Candidate.objects.filter(project=project, sha__startswith=against.lower())[:2])
    if len(matches) != 1:
        raise NotFound(
            f"{'Several candidates match' if matches else 'No candidate matches'} {against} in "
            f"project {project.slug}: "
            + (
                "give more of the SHA."
                if matches
                else "import that commit first (coevo push), or name a channel."
            )
        )
    return matches[0], None


def _check_critical_tasks(*, suite: Suite, split: str, keys: Iterable[str]) -> None:
    keys = list(keys)
    if not keys:
        return
    known = set(
        Task.objects.filter(suite=suite, split=split, key__in=keys).values_list("key", flat=True)
    )
    unknown = [key for key in keys if key not in known]
    if unknown:
        raise InvalidInput(
            f"critical_tasks: {', '.join(unknown[:20])}{' …' if len(unknown) > 20 else ''} "
            f"not in the {split} split of suite {suite}; list task keys of that split."
        )


def gate_advance_enqueue(*, gate_id: Any) -> None:
    """Send ``gate_advance`` for one gate once the caller's transaction commits; a broker that
    is down only delays it (beat's job finds the gate later)."""
    task_enqueue(
        GATE_ADVANCE_TASK, str(gate_id), queue="default", what=f"gate {gate_id}", on_commit=True
    )


def gate_advance(*, gate_id: Any) -> Gate | None:
    """Finish the gate once both evaluations are final; otherwise note that it runs.

    Safe to call any number of times, from any process.
    """
    gate = Gate.objects.filter(id=gate_id).first()
    if gate is None or gate.is_final:
        return gate
    evaluations = {
        e.id: e
        for e in Evaluation.objects.filter(
            id__in=[gate.candidate_evaluation_id, gate.baseline_evaluation_id]
        )
    }
    candidate_eval = evaluations[gate.candidate_evaluation_id]
    baseline_eval = evaluations[gate.baseline_evaluation_id]
    if not (candidate_eval.is_final and baseline_eval.is_final):
        if gate.state == GateState.PENDING and any(
            e.state != EvaluationState.PENDING for e in evaluations.values()
        ):
            Gate.objects.filter(id=gate.id, state=GateState.PENDING).update(
                state=GateState.RUNNING, updated_at=timezone.now()
            )
        return gate
    try:
        decision = gate_decide(
            policy=GatePolicy.from_dict(gate.policy),
            candidate=_facts("candidate", candidate_eval),
            baseline=_facts("baseline", baseline_eval),
            seed=gate.seed,
        )
        state, detail = GateState.FINISHED, ""
    except CoevoError as exc:
        # Inputs the statistics are not defined for: the gate cannot decide, and says why.
        logger.exception("gate %s: could not compute its verdict", gate.id)
        decision = GateDecision(
            verdict=GateVerdict.ERROR,
            reasons=[{"rule": "gate", "outcome": "error", "message": str(exc)}],
            statistics={},
        )
        state, detail = GateState.FAILED, f"The verdict could not be computed: {exc}"
    finished = Gate.objects.filter(id=gate.id, state__in=GATE_OPEN_STATES).update(
        state=state,
        state_detail=detail,
        verdict=decision.verdict,
        reasons=decision.reasons,
        statistics=decision.statistics,
        finished_at=timezone.now(),
        updated_at=timezone.now(),
    )
    if finished:
        logger.info("gate %s %s: verdict %s", gate.id, state, decision.verdict)
    gate.refresh_from_db()
    return gate


def _facts(label: str, evaluation: Evaluation) -> EvaluationFacts:
    outcomes = dict(
        Rollout.objects.filter(evaluation=evaluation, state=RolloutState.DONE)
        .values_list("outcome")
        .annotate(n=Count("id"))
        .values_list("outcome", "n")
    )
    return EvaluationFacts(
        label=label,
        state=evaluation.state,
        state_detail=evaluation.state_detail,
        scores=evaluation_task_scores(evaluation_id=evaluation.id),
        outcomes=outcomes,
    )


def gate_advance_ready(*, limit: int = 500) -> int:
    """Beat's catch-up: finish open gates whose evaluations are both final (their signal was
    missed, say the worker died between commit and send). Returns how many it finished."""
    ready = (
        Gate.objects.filter(
            state__in=GATE_OPEN_STATES,
            candidate_evaluation__state__in=EVALUATION_FINAL_STATES,
            baseline_evaluation__state__in=EVALUATION_FINAL_STATES,
        )
        .order_by("created_at")
        .values_list("id", flat=True)[:limit]
    )
    finished = 0
    for gate_id in list(ready):
        gate = gate_advance(gate_id=gate_id)
        finished += bool(gate and gate.is_final)
    return finished


def gates_for_evaluation(*, evaluation_id: Any) -> list[Any]:
    """Ids of the open gates that wait on this evaluation."""
    from django.db.models import Q

    return list(
        Gate.objects.filter(state__in=GATE_OPEN_STATES)
        .filter(Q(candidate_evaluation_id=evaluation_id) | Q(baseline_evaluation_id=evaluation_id))
        .values_list("id", flat=True)
    )
