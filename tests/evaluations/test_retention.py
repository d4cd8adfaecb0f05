"""Trace retention (coevo.evaluations.retention, manage.py prune_traces, the beat job): old trace bodies
go, scores stay, and nothing a channel, promotion or export references is ever pruned."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from coevo.evaluations import retention
from coevo.evaluations.models import (
    Evaluation,
    EvaluationState,
    Rollout,
    RolloutState,
    TraceStep,
)
from coevo.evaluations.retention import protect_candidates, protect_evaluations, traces_prune
from coevo.evaluations.traces import COMPRESS_OVER_BYTES, TraceWriter
from coevo.suites.models import Split
from tests.evaluations.test_traces import FakeStep
from workers.outcomes import RolloutOutcome

pytestmark = pytest.mark.django_db


@pytest.fixture
def make_evaluation(seed_candidate, humaneval_suite, policy_version):
    tasks = list(humaneval_suite.tasks.filter(split=Split.SEARCH).order_by("position")[:2])

    def make(
        *,
        days_ago: float,
        candidate=None,
        state: str = EvaluationState.FINISHED,
        steps: int = 3,
    ) -> Evaluation:
        candidate = candidate or seed_candidate
        ended = timezone.now() - timedelta(days=days_ago)
        evaluation = Evaluation.objects.create(
            project=candidate.project,
            candidate=candidate,
            policy_version=policy_version,
            suite=humaneval_suite,
            split=Split.SEARCH,
            state=state,
            finished_at=ended if state != EvaluationState.RUNNING else None,
        )
        # Started when it ended, as far as months go (an evaluation created this month would
        # wait for this month's trace partition: tests/evaluations/test_trace_partitions.py).
        Evaluation.objects.filter(id=evaluation.id).update(created_at=ended)
        for task in tasks:
            rollout = Rollout.objects.create(
                evaluation=evaluation,
                task=task,
                seed=1,
                state=RolloutState.DONE,
                outcome=RolloutOutcome.PASSED,
                score=1.0,
                prompt_tokens=100,
                completion_tokens=20,
                attempts=1,
                finished_at=ended,
            )
            with TraceWriter(rollout_id=rollout.id, attempt=1) as writer:
                for i in range(steps - 1):
                    writer.add(FakeStep("log", {"message": f"step {i}"}))
                # One body large enough to be stored compressed.
                writer.add(FakeStep("model_call", {"prompt": "x" * (COMPRESS_OVER_BYTES * 2)}))
        return evaluation

    return make


def steps_of(evaluation: Evaluation) -> int:
    return TraceStep.objects.filter(rollout__evaluation=evaluation).count()


@pytest.fixture
def registry():
    """Registrations made by a test are removed afterwards."""
    saved = (list(retention._protected_candidates), list(retention._protected_evaluations))
    yield
    retention._protected_candidates[:] = saved[0]
    retention._protected_evaluations[:] = saved[1]


def test_it_prunes_old_final_traces_and_keeps_scores(make_evaluation):
    old = make_evaluation(days_ago=100)
    report = traces_prune(older_than_days=90)

    assert (report.evaluations, report.steps) == (1, 6)
    assert steps_of(old) == 0
    old.refresh_from_db()
    assert old.traces_pruned_at is not None
    rollouts = list(old.rollouts.all())
    assert [(r.score, r.outcome, r.prompt_tokens) for r in rollouts] == [(1.0, "passed", 100)] * 2


def test_it_keeps_recent_and_unfinished_evaluations(make_evaluation):
    recent = make_evaluation(days_ago=10)
    running = make_evaluation(days_ago=100, state=EvaluationState.RUNNING)

    assert traces_prune(older_than_days=90).evaluations == 0
    assert steps_of(recent) == 6 and steps_of(running) == 6


def test_it_dry_run_reports_what_it_would_free_and_deletes_nothing(make_evaluation):
    old = make_evaluation(days_ago=100)
    dry = traces_prune(older_than_days=90, dry_run=True)

    assert (dry.evaluations, dry.steps) == (1, 6)
    assert dry.bytes > 0 and "Would free 6 trace steps" in dry.describe()
    assert steps_of(old) == 6
    old.refresh_from_db()
    assert old.traces_pruned_at is None
    # The compressed bodies count with their stored size, and the real run frees the same.
    assert traces_prune(older_than_days=90).bytes == dry.bytes


def test_it_is_idempotent(make_evaluation):
    make_evaluation(days_ago=100)
    traces_prune(older_than_days=90)
    again = traces_prune(older_than_days=90)
    assert (again.evaluations, again.steps) == (0, 0)


def test_it_finishes_after_an_interrupted_run(make_evaluation, monkeypatch):
    old = make_evaluation(days_ago=100, steps=5)
    calls = {"n": 0}
    real = retention._step_sizes

    def interrupted(steps):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(steps)

    monkeypatch.setattr(retention, "_step_sizes", interrupted)
    with pytest.raises(KeyboardInterrupt):
        traces_prune(older_than_days=90, batch_size=3)
    old.refresh_from_db()
    # The first batch is gone (its own transaction); the evaluation is not marked pruned yet.
    assert steps_of(old) == 7 and old.traces_pruned_at is None

    monkeypatch.setattr(retention, "_step_sizes", real)
    report = traces_prune(older_than_days=90, batch_size=3)
    old.refresh_from_db()
    assert report.steps == 7 and steps_of(old) == 0 and old.traces_pruned_at is not None


def test_it_never_prunes_a_candidate_on_a_channel_or_in_its_history(
    make_evaluation, seed_candidate, child_candidate
):
    from coevo.reviews.services import channel_get_or_create, channel_move

    channel = channel_get_or_create(project=seed_candidate.project, name="production")
    channel_move(channel=channel, candidate=seed_candidate, policy_version=None, moved_by=None)
    channel.refresh_from_db()
    channel_move(channel=channel, candidate=child_candidate, policy_version=None, moved_by=None)
    was_held = make_evaluation(days_ago=100, candidate=seed_candidate)
    held = make_evaluation(days_ago=100, candidate=child_candidate)

    report = traces_prune(older_than_days=90)
    assert (report.evaluations, report.protected) == (0, 2)
    assert steps_of(was_held) == 6 and steps_of(held) == 6


def test_it_never_prunes_what_a_registered_promotion_or_export_references(
    make_evaluation, child_candidate, registry
):
    promoted = make_evaluation(days_ago=100, candidate=child_candidate)
    exported = make_evaluation(days_ago=100)
    other = make_evaluation(days_ago=100)
    # Stand-ins for the promotion and export apps: one protects a candidate, one an evaluation;
    # the NULLs a nullable foreign key yields must not switch the protection off.
    protect_candidates(
        lambda: (
            Evaluation.objects.filter(id=promoted.id)
            .values("candidate_id")
            .union(Rollout.objects.filter(reused_from__isnull=True).values("reused_from_id"))
        )
    )
    protect_evaluations(
        lambda: (
            Evaluation.objects.filter(id__in=[exported.id])
            .values("id")
            .union(Evaluation.objects.filter(reference__isnull=True).values("reference_id"))
        )
    )

    report = traces_prune(older_than_days=90)
    assert (report.evaluations, report.protected) == (1, 2)
    assert steps_of(promoted) == 6 and steps_of(exported) == 6 and steps_of(other) == 0


def test_a_protection_yielding_nulls_in_a_plain_queryset_protects_only_its_ids(
    make_evaluation, registry
):
    kept = make_evaluation(days_ago=100)
    pruned = make_evaluation(days_ago=100)
    # reference_id is NULL on every evaluation but kept's: NOT IN (…, NULL) would match nothing.
    pruned.reference = None
    Evaluation.objects.filter(id=kept.id).update(reference=kept)
    protect_evaluations(lambda: Evaluation.objects.values("reference_id"))

    traces_prune(older_than_days=90)
    assert steps_of(kept) == 6 and steps_of(pruned) == 0


def test_it_keeps_the_cache_sources_of_a_protected_evaluation(make_evaluation, registry):
    source = make_evaluation(days_ago=100)
    reuser = make_evaluation(days_ago=100)
    first = reuser.rollouts.order_by("task__position").first()
    first.reused_from = source.rollouts.order_by("task__position").first()
    first.save(update_fields=["reused_from"])
    protect_evaluations(lambda: Evaluation.objects.filter(id=reuser.id).values("id"))

    traces_prune(older_than_days=90)
    assert steps_of(source) == 6 and steps_of(reuser) == 6


def test_zero_days_keeps_traces_forever(make_evaluation, settings):
    old = make_evaluation(days_ago=10_000)
    settings.COEVO_TRACE_RETENTION_DAYS = 0
    report = traces_prune()
    assert report.cutoff is None and "off" in report.describe()
    assert steps_of(old) == 6


def test_the_command_dry_runs_and_prunes(make_evaluation):
    old = make_evaluation(days_ago=40)
    out = StringIO()
    call_command("prune_traces", "--dry-run", "--older-than-days", "30", stdout=out)
    assert "Would free 6 trace steps" in out.getvalue() and steps_of(old) == 6

    out = StringIO()
    call_command("prune_traces", "--older-than-days", "30", stdout=out)
    assert "Freed 6 trace steps" in out.getvalue() and steps_of(old) == 0


def test_the_beat_job_uses_the_configured_retention(make_evaluation, settings):
    from coevo.celery import app
    from coevo.ops.tasks import traces_prune as job

    old, recent = make_evaluation(days_ago=40), make_evaluation(days_ago=20)
    settings.COEVO_TRACE_RETENTION_DAYS = 30
    job.apply().get()
    assert steps_of(old) == 0 and steps_of(recent) == 6
    assert settings.CELERY_BEAT_SCHEDULE["traces-retention"]["task"] == job.name
    app.loader.import_default_modules()
    assert job.name in app.tasks


def test_the_trace_viewer_says_the_bodies_were_pruned(make_evaluation, client, owner):
    old = make_evaluation(days_ago=100)
    traces_prune(older_than_days=90)
    rollout = old.rollouts.first()
    client.force_login(owner)
    page = client.get(f"/p/{old.project.slug}/r/{rollout.id}/")
    assert page.status_code == 200
    assert 'id="traces-pruned"' in page.content.decode()
    assert "No trace recorded" not in page.content.decode()
