"""Evaluation lifecycle: create and fan out, claim and execute rollouts, finish.

Every state change is a compare-and-swap update, so a redelivered Celery task (acks_late) or
two workers racing on the same rollout never do the work twice. The plan (stages, early
stopping), cancel, pause and resume live in ``coevo.evaluations.lifecycle``; budgets in
``coevo.evaluations.ledger``.
"""

from __future__ import annotations

import logging
import tempfile
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import close_old_connections, connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from coevo.errors import InvalidInput, InvalidManifest
from coevo.evaluations.cache import cache_lookup, rollout_cache_key
from coevo.evaluations.ledger import (
    Amount,
    BudgetLimits,
    budget_create,
    budget_reserve,
    budget_settle,
    budget_unit,
    wall_seconds,
)
from coevo.evaluations.models import (
    Budget,
    Evaluation,
    EvaluationStage,
    EvaluationState,
    Outcome,
    Rollout,
    RolloutState,
)
from coevo.evaluations.plans import EvaluationPlan, stages_for
from coevo.evaluations.traces import TraceWriter
from coevo.policies.models import PolicyVersion
from coevo.policies.services import policy_client_for, policy_endpoint_reachable
from coevo.suites.models import Split, Suite, Task
from harness_store.models import Candidate
from harness_store.selectors import candidate_export

logger = logging.getLogger(__name__)


class RolloutRetry(Exception):
    """An infra_error with attempts left: the caller re-enqueues the rollout after ``countdown``."""

    def __init__(self, message: str, *, countdown: int) -> None:
        super().__init__(message)
        self.countdown = countdown


class RolloutCancelled(Exception):
    """The rollout was cancelled while it ran (its evaluation was cancelled or stopped)."""


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
) -> Evaluation:
    """Create the evaluation, its stages and rollouts, reserve its budget, and start it once the
    transaction commits. Refused (nothing created) when the budget cannot cover the worst case.
    """
    plan = plan or EvaluationPlan()
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
    stages = stages_for(tasks, plan=plan, seed=seed, key=lambda task: task.key)
    unit = Amount(
        rollouts=1,
        tokens=manifest.limits.max_tokens,
        wall_s=min(manifest.limits.wall_time_s, settings.COEVO_ROLLOUT_WALL_S),
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
                        tree_sha=candidate.tree_sha,
                        policy_version_id=policy_version.id,
                        suite_content_hash=suite.content_hash,
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
        reused = _reuse_cached(rollouts) if use_cache else 0
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
    from coevo.evaluations.lifecycle import evaluation_advance

    evaluation_advance(evaluation_id=evaluation_id)


def _rollout_seed(evaluation_seed: int, epoch: int) -> int:
    return evaluation_seed * 1_000_003 + epoch


def _manifest_of(candidate: Candidate) -> Any:
    """The candidate's validated manifest, read the way workers read candidates (from the
    database snapshot, so it also works where the store's disk is not)."""
    from workers.manifest import load_manifest

    with tempfile.TemporaryDirectory(prefix="coevo-manifest-") as tmp:
        candidate_export(candidate=candidate, destination=Path(tmp))
        try:
            return load_manifest(Path(tmp))
        except InvalidManifest as exc:
            raise InvalidInput(f"Candidate {candidate.short_sha} cannot run: {exc}") from None


def _reuse_cached(rollouts: list[Rollout]) -> int:
    hits = cache_lookup(keys=[r.cache_key for r in rollouts])
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
        rollout.finished_at = now
    return sum(1 for r in rollouts if r.reused_from_id)


def evaluation_enqueue(
    *, evaluation_id: Any, stage: int | None = None, only_unsent: bool = False
) -> int:
    """Send pending rollouts (of one stage, or all; or only those not sent yet) to the
    ``rollouts`` queue.

    A broker that is down does not lose work: the rollout stays pending without ``enqueued_at``
    and the watchdog sends it again.
    """

    pending = Rollout.objects.filter(evaluation_id=evaluation_id, state=RolloutState.PENDING)
    if stage is not None:
        pending = pending.filter(stage=stage)
    if only_unsent:
        pending = pending.filter(enqueued_at__isnull=True)
    sent = 0
    for rollout_id in pending.values_list("id", flat=True):
        if not _send(rollout_id):
            break
        sent += 1
    return sent


def _send(rollout_id: Any) -> bool:
    """Publish one rollout; False (and a warning) when the broker cannot take it now."""
    from workers.tasks import rollout_run

    try:
        result = rollout_run.apply_async(args=[str(rollout_id)], queue="rollouts")
    except Exception as exc:  # kombu's errors differ by transport
        logger.warning(
            "could not send rollout %s to the broker (%s); the watchdog will send it again",
            rollout_id,
            exc,
        )
        return False
    Rollout.objects.filter(id=rollout_id).update(
        celery_task_id=result.id, enqueued_at=timezone.now()
    )
    return True


def rollout_claim(*, rollout_id: Any, worker: str) -> Rollout | None:
    """Pending → running, or None when another delivery already has it, it is final, or its
    evaluation is paused or over."""
    now = timezone.now()
    claimed = Rollout.objects.filter(
        id=rollout_id,
        state=RolloutState.PENDING,
        evaluation__state__in=[EvaluationState.PENDING, EvaluationState.RUNNING],
    ).update(
        state=RolloutState.RUNNING,
        attempts=F("attempts") + 1,
        worker=worker,
        started_at=now,
        heartbeat_at=now,
    )
    if claimed != 1:
        return None
    rollout = Rollout.objects.select_related(
        "evaluation__candidate__project",
        "evaluation__policy_version__endpoint",
        "evaluation__suite",
        "task",
    ).get(id=rollout_id)
    Evaluation.objects.filter(id=rollout.evaluation_id, state=EvaluationState.PENDING).update(
        state=EvaluationState.RUNNING, started_at=now
    )
    return rollout


class _Heartbeat:
    """Beats for a running rollout from a thread of its own, so a long model call does not look
    like a dead worker; notices when the rollout was cancelled under it."""

    def __init__(self, rollout: Rollout) -> None:
        self.rollout = rollout
        self.cancelled = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="heartbeat")

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def beat(self) -> None:
        alive = Rollout.objects.filter(
            id=self.rollout.id, state=RolloutState.RUNNING, attempts=self.rollout.attempts
        ).update(heartbeat_at=timezone.now())
        if not alive:
            self.cancelled.set()

    def _run(self) -> None:
        try:
            while not self._stop.wait(settings.COEVO_HEARTBEAT_S):
                try:
                    self.beat()
                except Exception:
                    logger.exception("rollout %s: heartbeat failed", self.rollout.id)
        finally:
            connection.close()


def rollout_execute(*, rollout_id: Any, worker: str) -> Rollout | None:
    """Claim and run one rollout; record its trace and outcome. Safe to call twice."""
    from workers.environments import adapter_for
    from workers.rollout import RolloutResult, Step

    close_old_connections()
    rollout = rollout_claim(rollout_id=rollout_id, worker=worker)
    if rollout is None:
        logger.info("rollout %s: already claimed, final or paused; nothing to do", rollout_id)
        return None
    evaluation = rollout.evaluation
    adapter = adapter_for(evaluation.suite.kind)
    # Steps are written in batches; every way out below flushes first, so the trace is
    # complete before the outcome is recorded (or the rollout is given up).
    trace = TraceWriter(rollout_id=rollout.id, attempt=rollout.attempts)

    with _Heartbeat(rollout) as heartbeat:

        def on_step(step: Step) -> None:
            if heartbeat.cancelled.is_set():
                raise RolloutCancelled(f"rollout {rollout.id} was cancelled")
            trace.add(step)

        started = timezone.now()
        try:
            result = _rollout_run_in_sandbox(rollout=rollout, adapter=adapter, on_step=on_step)
            trace.flush()
        except RolloutCancelled:
            trace.flush_after_failure()
            logger.info("rollout %s: cancelled while running", rollout.id)
            return None
        except Exception as exc:  # a fault of this worker, not of the candidate: retry it
            trace.flush_after_failure()
            logger.exception("rollout %s: worker error", rollout.id)
            result = RolloutResult(
                outcome=Outcome.INFRA_ERROR,
                score=None,
                detail=f"worker error: {type(exc).__name__}: {exc}",
            )
    latency_ms = int((timezone.now() - started).total_seconds() * 1000)
    if result.outcome == Outcome.INFRA_ERROR:
        try:
            _handle_infra_error(rollout=rollout, detail=result.detail)
        except RolloutCancelled as exc:
            logger.info("rollout %s: %s", rollout.id, exc)
            return None
    rollout_finish(
        rollout=rollout,
        outcome=result.outcome,
        score=result.score,
        detail=result.detail,
        answer=result.answer,
        prompt_tokens=result.prompt_tokens,
        completion_tokens=result.completion_tokens,
        model_calls=result.model_calls,
        latency_ms=latency_ms,
    )
    rollout.refresh_from_db()
    return rollout


def _handle_infra_error(*, rollout: Rollout, detail: str) -> None:
    """Decide what an infra error means; returns only when the rollout should end with it.

    A policy server that does not answer is an outage, not this rollout's fault: the attempt is
    given back, and past COEVO_INFRA_PAUSE_THRESHOLD outages the whole evaluation pauses until
    the server answers again (the watchdog resumes it). Other infra errors use up an attempt.
    """
    evaluation = rollout.evaluation
    if not policy_endpoint_reachable(version=evaluation.policy_version):
        Evaluation.objects.filter(id=evaluation.id).update(policy_outages=F("policy_outages") + 1)
        outages = Evaluation.objects.values_list("policy_outages", flat=True).get(id=evaluation.id)
        moved = Rollout.objects.filter(
            id=rollout.id, state=RolloutState.RUNNING, attempts=rollout.attempts
        ).update(
            state=RolloutState.PENDING,
            forgiven_attempts=F("forgiven_attempts") + 1,
            detail=f"policy outage (attempt not counted): {detail}"[:10000],
        )
        if not moved:
            raise RolloutCancelled(f"rollout {rollout.id} is no longer running")
        if outages >= settings.COEVO_INFRA_PAUSE_THRESHOLD:
            from coevo.evaluations.lifecycle import evaluation_pause

            evaluation_pause(
                evaluation_id=evaluation.id,
                reason=(
                    f"paused after {outages} policy outages: {detail[:300]}. It resumes by "
                    "itself once the policy server answers again."
                ),
            )
            raise RolloutCancelled(f"evaluation {evaluation.id} paused")
        raise RolloutRetry(detail, countdown=settings.COEVO_ROLLOUT_RETRY_BASE_S)
    if rollout.counted_attempts < settings.COEVO_ROLLOUT_MAX_ATTEMPTS:
        moved = Rollout.objects.filter(
            id=rollout.id, state=RolloutState.RUNNING, attempts=rollout.attempts
        ).update(state=RolloutState.PENDING, detail=f"attempt {rollout.attempts}: {detail}")
        if not moved:
            raise RolloutCancelled(f"rollout {rollout.id} is no longer running")
        raise RolloutRetry(
            detail,
            countdown=min(
                300, settings.COEVO_ROLLOUT_RETRY_BASE_S * 2 ** (rollout.counted_attempts - 1)
            ),
        )


def error_kind_for(outcome: str, detail: str) -> str:
    """A short, stable class of what went wrong, for breakdowns and metrics."""
    if outcome in (Outcome.PASSED, Outcome.TASK_FAILURE):
        return ""
    text = detail.lower()
    for needle, kind in (
        ("limit exceeded", "limit"),
        ("protocol violation", "protocol"),
        ("invalid harness", "manifest"),
        ("the harness raised", "exception"),
        ("before answering", "exited"),
        ("stopped heartbeating", "worker_lost"),
        ("worker error", "worker"),
        ("sandbox", "sandbox"),
        ("policy", "policy"),
    ):
        if needle in text:
            return kind
    return "other"


def rollout_finish(
    *,
    rollout: Rollout,
    outcome: str,
    score: float | None,
    detail: str,
    answer: Any = None,
    prompt_tokens: int = 0,
    completion_tokens: int = 0,
    model_calls: int = 0,
    latency_ms: int = 0,
) -> bool:
    """Running → done with the outcome, settle its budget, then move the evaluation along.

    The swap also matches the attempt: a worker the watchdog gave up on (its rollout was
    requeued and claimed again) cannot overwrite the result of the newer attempt.
    """
    with transaction.atomic():
        finished = Rollout.objects.filter(
            id=rollout.id, state=RolloutState.RUNNING, attempts=rollout.attempts
        ).update(
            state=RolloutState.DONE,
            outcome=outcome,
            error_kind=error_kind_for(outcome, detail),
            score=score,
            detail=detail[:10000],
            answer=answer,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            model_calls=model_calls,
            latency_ms=latency_ms,
            finished_at=timezone.now(),
        )
        if finished:
            budget = Budget.objects.filter(evaluation_id=rollout.evaluation_id).first()
            if budget is not None:
                budget_settle(
                    budget=budget,
                    reserved=budget_unit(budget),
                    actual=Amount(1, prompt_tokens + completion_tokens, wall_seconds(latency_ms)),
                    rollout=rollout,
                    note=outcome,
                )
    logger.info(
        "rollout %s (evaluation %s, task %s): %s %s",
        rollout.id,
        rollout.evaluation_id,
        rollout.task.key,
        outcome,
        detail[:200],
    )
    if finished:
        from coevo.evaluations.lifecycle import evaluation_advance

        evaluation_advance(evaluation_id=rollout.evaluation_id)
    return finished == 1


def _rollout_run_in_sandbox(*, rollout: Rollout, adapter: Any, on_step: Any) -> Any:
    from workers.rollout import RolloutInputs, TaskEnvironment, execute_rollout

    evaluation = rollout.evaluation
    with tempfile.TemporaryDirectory(prefix="coevo-harness-") as tmp:
        harness_dir = Path(tmp) / "harness"
        harness_dir.mkdir()
        candidate_export(candidate=evaluation.candidate, destination=harness_dir)
        inputs = RolloutInputs(
            harness_dir=harness_dir,
            task_key=rollout.task.key,
            task_view=adapter.harness_view(rollout.task.inputs),
            knob_overrides=evaluation.knobs,
            seed=rollout.seed,
            wall_time_s=settings.COEVO_ROLLOUT_WALL_S,
            policy_version=str(evaluation.policy_version),
        )
        environment = TaskEnvironment(
            adapter=adapter, inputs=rollout.task.inputs, verifier=rollout.task.verifier
        )
        with policy_client_for(version=evaluation.policy_version) as policy:
            return execute_rollout(inputs, policy=policy, environment=environment, on_step=on_step)


def rollout_requeue_stale(*, stale_after_s: int) -> tuple[int, int]:
    """Rollouts whose worker stopped heartbeating are re-run or given up.

    A running rollout whose heartbeat is older than ``stale_after_s`` lost its worker (killed,
    machine gone). With attempts left it goes back to pending and is enqueued again; otherwise
    it ends as an infra_error. Returns (requeued, failed).
    """
    cutoff = timezone.now() - timedelta(seconds=stale_after_s)
    requeued = failed = 0
    stale = Rollout.objects.filter(state=RolloutState.RUNNING, heartbeat_at__lt=cutoff)
    for rollout in stale.select_related("task"):
        detail = f"worker {rollout.worker or '?'} stopped heartbeating (attempt {rollout.attempts})"
        if rollout.counted_attempts < settings.COEVO_ROLLOUT_MAX_ATTEMPTS:
            moved = Rollout.objects.filter(
                id=rollout.id, state=RolloutState.RUNNING, heartbeat_at__lt=cutoff
            ).update(state=RolloutState.PENDING, detail=detail, enqueued_at=None)
            if moved:
                _send(rollout.id)  # or, if the broker is down too, the resend check will
                requeued += 1
        elif rollout_finish(
            rollout=rollout, outcome=Outcome.INFRA_ERROR, score=None, detail=detail
        ):
            failed += 1
    if requeued or failed:
        logger.warning("watchdog: %d stale rollouts requeued, %d given up", requeued, failed)
    return requeued, failed


def rollout_resend_lost(*, unsent_after_s: int) -> int:
    """Send again pending rollouts of running stages whose message may be lost.

    A broker restart without persistence, a failed publish or a worker killed with messages
    prefetched all leave a rollout pending with nobody to run it. Sending it twice is harmless
    (the claim is a compare-and-swap), so the rule is simple: a rollout of a running stage that
    has waited longer than ``unsent_after_s`` since it was last sent is sent again.
    """
    from workers.tasks import rollouts_queue_depth

    if rollouts_queue_depth():
        # Messages are still waiting: workers are behind, not lost. (A deep queue of a long
        # evaluation would otherwise be sent again on every watchdog run.)
        return 0
    cutoff = timezone.now() - timedelta(seconds=unsent_after_s)
    running_stages = EvaluationStage.objects.filter(
        evaluation__state=EvaluationState.RUNNING,
        evaluation__stage=F("index"),
    ).values_list("evaluation_id", "index")
    resent = 0
    for evaluation_id, index in running_stages:
        waiting = Rollout.objects.filter(
            evaluation_id=evaluation_id, stage=index, state=RolloutState.PENDING
        ).filter(Q(enqueued_at__isnull=True) | Q(enqueued_at__lt=cutoff))
        if waiting.exists():
            Rollout.objects.filter(id__in=waiting.values("id")).update(enqueued_at=None)
            resent += evaluation_enqueue(evaluation_id=evaluation_id, stage=index, only_unsent=True)
    # Rollouts sent back to pending by the stale check above wait for this, too.
    if resent:
        logger.warning("watchdog: %d pending rollouts sent again", resent)
    return resent


def evaluations_resume_paused() -> int:
    """Resume evaluations paused for a policy outage once their policy server answers."""
    from coevo.evaluations.lifecycle import evaluation_resume

    resumed = 0
    for evaluation in Evaluation.objects.filter(state=EvaluationState.PAUSED).select_related(
        "policy_version__endpoint"
    ):
        if policy_endpoint_reachable(version=evaluation.policy_version):
            evaluation_resume(evaluation=evaluation)
            resumed += 1
    return resumed
