"""Creating an evaluation (stages, rollouts, cache hits, budget) and sending its rollouts."""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from coevo.errors import InvalidInput, InvalidManifest, PermissionDenied
from coevo.evaluations.cache import cache_lookup, rollout_cache_key
from coevo.evaluations.ledger import (
    Amount,
    BudgetLimits,
    budget_create,
    budget_reserve,
)
from coevo.evaluations.lifecycle import evaluation_advance
from coevo.evaluations.models import (
    Budget,
    Evaluation,
    EvaluationStage,
    Rollout,
    RolloutState,
)
from coevo.evaluations.plans import EvaluationPlan, stages_for
from coevo.policies.models import PolicyVersion
from coevo.policies.prices import price_worst_per_token
from coevo.suites.models import Split, Suite, Task
from coevo.suites.selectors import suite_unrunnable_patterns
from harness_store.manifest import Manifest
from harness_store.models import Candidate
from harness_store.selectors import candidate_manifest

logger = logging.getLogger(__name__)

# Celery task names (coevo.evaluations.tasks registers them; services send them by name).
ROLLOUTS_WATCHDOG_TASK = "coevo.evaluations.tasks.rollouts_watchdog"

# The only purpose that may evaluate the held-out split (see evaluation_create).
HELDOUT_PURPOSE = "promotion"


def evaluation_create(
    *,
    candidate: Candidate,
    suite: Suite,
    split: str,
    policy_version: PolicyVersion,
    epochs: int = 1,
    task_limit: int | None = None,
    knobs: dict[str, Any] | None = None,
    seed: int = 0,
    plan: EvaluationPlan | None = None,
    reference: Evaluation | None = None,
    budget_limits: BudgetLimits | None = None,
    parent_budget: Budget | None = None,
    use_cache: bool = True,
    created_by: AbstractBaseUser | None = None,
    purpose: str = "evaluation",
    paced: bool = False,
) -> Evaluation:
    """Create the evaluation, its stages and rollouts, reserve its budget, and start it once the
    transaction commits. Refused (nothing created) when the budget cannot cover the worst case.

    The held-out split is sealed (docs/architecture.md, "The held-out seal"): only a promotion request runs it, and says so
    with ``purpose="promotion"`` (coevo.reviews.promotions), so every held-out look is one the
    request counts and shows to its reviewers.

    A ``paced`` evaluation's rollouts are sent by its pacer (``evaluation_enqueue`` with
    ``rollout_ids``), not a stage at once.
    """
    plan = plan or EvaluationPlan()
    if split == Split.HELDOUT and purpose != HELDOUT_PURPOSE:
        raise PermissionDenied(
            "Held-out evaluations run only inside a promotion request (its held-out looks are "
            "counted and shown to reviewers): request a promotion, or use the search or "
            "validation split."
        )
    if suite.project_id != candidate.project_id:
        raise InvalidInput("The suite and the candidate belong to different projects.")
    if split not in Split.values:
        raise InvalidInput(f"Unknown split {split!r}: use one of {', '.join(Split.values)}.")
    if not 1 <= epochs <= 100:
        raise InvalidInput("epochs must be between 1 and 100.")
    if task_limit is not None and task_limit < 1:
        raise InvalidInput("task_limit must be at least 1.")
    if reference is not None and (reference.suite_id != suite.id or reference.split != split):
        raise InvalidInput(
            "The reference evaluation must be on the same suite and split as this one."
        )
    if plan.early_stop and reference is None:
        raise InvalidInput("Early stopping compares against a reference evaluation: name one.")
    manifest = _manifest_of(candidate)
    try:
        resolved_knobs = manifest.knob_values(knobs or {})
    except InvalidManifest as exc:
        raise InvalidInput(
            f"Bad knob settings for candidate {candidate.short_sha}: {exc}"
        ) from None
    tasks = list(
        Task.objects.filter(suite=suite, split=split).order_by("position").only("id", "key")
    )
    if task_limit is not None:
        tasks = tasks[:task_limit]
    if not tasks:
        raise InvalidInput(f"Suite {suite} has no tasks in the {split} split.")
    unrunnable = suite_unrunnable_patterns(suite=suite, task_ids=[task.id for task in tasks])
    if unrunnable:
        # Counted, not named: the tasks may be held-out ones.
        raise InvalidInput(
            f"Suite {suite} was imported before coevo matched regexes with RE2, and {unrunnable} "
            f"of its {split} tasks hold patterns RE2 refuses (lookaround, backreferences, …): "
            "every one would fail. Import the suite again (the import names each line whose "
            "pattern must change and why), then evaluate the new version."
        )
    stages = stages_for(tasks, plan=plan, seed=seed, key=lambda task: task.key)
    unit = Amount(
        rollouts=1,
        tokens=manifest.limits.max_tokens,
        wall_s=min(manifest.limits.wall_time_s, settings.COEVO_ROLLOUT_WALL_S),
        # The worst case in dollars: every token the manifest allows at the dearest price.
        usd=manifest.limits.max_tokens * price_worst_per_token(version=policy_version),
    )
    with transaction.atomic():
        evaluation = Evaluation.objects.create(
            project_id=candidate.project_id,
            candidate=candidate,
            policy_version=policy_version,
            suite=suite,
            split=split,
            epochs=epochs,
            seed=seed,
            task_limit=task_limit,
            knobs=knobs or {},
            plan=plan.as_dict(),
            reference=reference,
            use_cache=use_cache,
            created_by=created_by,
            paced=paced,
        )
        EvaluationStage.objects.bulk_create(
            EvaluationStage(evaluation=evaluation, index=i, kind=stage.kind, tasks=len(stage.tasks))
            for i, stage in enumerate(stages)
        )
        rollouts = []
        for index, stage in enumerate(stages):
            for task in stage.tasks:
                for epoch in range(epochs):
                    rollout_seed = _rollout_seed(seed, epoch)
                    key = rollout_cache_key(
                        project_id=candidate.project_id,
                        split=split,
                        tree_sha=candidate.tree_sha,
                        policy_version_id=policy_version.id,
                        suite_content_hash=suite.content_hash,
                        suite_split_seed=suite.split_seed,
                        task_key=task.key,
                        seed=rollout_seed,
                        knobs=resolved_knobs,
                    )
                    rollouts.append(
                        Rollout(
                            evaluation=evaluation,
                            task=task,
                            epoch=epoch,
                            seed=rollout_seed,
                            stage=index,
                            cache_key=key,
                        )
                    )
        reused = _reuse_cached(evaluation, rollouts) if use_cache else 0
        Rollout.objects.bulk_create(rollouts)
        budget = budget_create(
            project=candidate.project,
            name=f"evaluation {str(evaluation.id)[:8]}",
            limits=budget_limits,
            unit=unit,
            evaluation_id=evaluation.id,
            parent=parent_budget,
        )
        budget_reserve(
            budget=budget,
            amount=unit * (len(rollouts) - reused),
            note=f"{len(rollouts) - reused} rollouts ({reused} reused from the cache)",
        )
        transaction.on_commit(lambda: _start(evaluation.id))
    logger.info(
        "evaluation %s created: candidate %s, %d rollouts (%d reused) in %d stage(s)",
        evaluation.id,
        candidate.short_sha,
        len(rollouts),
        reused,
        len(stages),
    )
    return evaluation


def _start(evaluation_id: Any) -> None:
    evaluation_advance(evaluation_id=evaluation_id)


def _rollout_seed(evaluation_seed: int, epoch: int) -> int:
    return evaluation_seed * 1_000_003 + epoch


def _manifest_of(candidate: Candidate) -> Manifest:
    """The candidate's validated manifest, read the way workers read candidates (from the
    database snapshot, so it also works where the store's disk is not)."""
    try:
        return candidate_manifest(candidate=candidate)
    except InvalidManifest as exc:
        raise InvalidInput(f"Candidate {candidate.short_sha} cannot run: {exc}") from None


def _reuse_cached(evaluation: Evaluation, rollouts: list[Rollout]) -> int:
    hits = cache_lookup(
        project_id=evaluation.project_id,
        split=evaluation.split,
        keys=[r.cache_key for r in rollouts],
    )
    now = timezone.now()
    for rollout in rollouts:
        source = hits.get(rollout.cache_key)
        if source is None:
            continue
        rollout.reused_from = source
        rollout.state = RolloutState.DONE
        rollout.outcome = source.outcome
        rollout.score = source.score
        rollout.detail = f"reused from rollout {source.id}: {source.detail}"[:10000]
        rollout.answer = source.answer
        rollout.prompt_tokens = source.prompt_tokens
        rollout.completion_tokens = source.completion_tokens
        rollout.model_calls = source.model_calls
        rollout.latency_ms = source.latency_ms
        # What the result cost when it was made, as its tokens are (the ledger is not charged).
        rollout.cost_usd = source.cost_usd
        rollout.finished_at = now
    return sum(1 for r in rollouts if r.reused_from_id)
