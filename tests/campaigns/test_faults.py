"""A campaign survives its worker being killed: real worker processes, SIGKILLed mid-proposal.

The watchdog's jobs (requeue rollouts of dead workers, send lost messages again) and beat's
campaign nudge are called here in the loop, as beat would call them. The campaign must finish
as if nothing happened: no proposal repeated, no Optuna trial asked twice, every evaluation's
rollouts scored exactly once per task.
"""

from __future__ import annotations

import time

import pytest
from django.db import connection

from coevo.campaigns.models import CampaignState, Proposal, ProposalState, ProposerKind
from coevo.campaigns.proposers.config import optuna_storage, study_name
from coevo.campaigns.services import campaign_advance_enqueue, campaign_create, campaign_start
from coevo.celery import app
from coevo.evaluations.models import (
    Evaluation,
    EvaluationState,
    Rollout,
    RolloutState,
    TraceStep,
)
from coevo.evaluations.services import (
    evaluations_resume_paused,
    rollout_requeue_stale,
    rollout_resend_lost,
)
from coevo.policies.models import PolicyEndpoint
from tests.campaigns.support import marked_suite, styled_seed
from tests.support.openai_server import ScriptedOpenAIServer, ScriptedPolicy
from tests.support.processes import WorkerProcess
from workers.outcomes import RolloutOutcome

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

PROPOSALS = 3


@pytest.fixture
def slow_policy(settings):
    """Answers "yes" (right) to style=good and "no" otherwise, slowly enough that a proposal's
    rollouts are in flight when the worker dies."""
    policy = ScriptedPolicy(latency_s=1.5, default="no")
    policy.rules.append(("style=good", "yes"))
    server = ScriptedOpenAIServer(policy)
    server.start()
    settings.COEVO_POLICY_URL = server.url
    settings.COEVO_POLICY_MODEL = "scripted"
    yield server
    server.stop()


@pytest.fixture
def policy(slow_policy):
    from coevo.policies.services import policy_version_get_default

    version = policy_version_get_default()
    PolicyEndpoint.objects.filter(id=version.endpoint_id).update(max_concurrency=4)
    return version


@pytest.fixture
def workers(tmp_path, settings):
    started: list[WorkerProcess] = []

    def start(name: str) -> WorkerProcess:
        worker = WorkerProcess(
            name=name,
            broker_url=app.conf.broker_url,
            log_dir=tmp_path,
            COEVO_WORKER_CONCURRENCY="2",
            COEVO_POLICY_RETRIES="1",
            COEVO_ROLLOUT_RETRY_BASE_S="1",
            # The runner reads and commits candidates: the worker needs this test's store.
            COEVO_HARNESS_STORE_DIR=settings.COEVO_HARNESS_STORE_DIR,
        )
        started.append(worker)
        return worker

    app.control.purge()
    yield start
    for worker in started:
        worker.stop()
    connection.close()


def wait_for(condition, *, timeout_s: float, what: str, campaign, worker: WorkerProcess) -> None:
    deadline = time.monotonic() + timeout_s
    nudged = time.monotonic()
    while time.monotonic() < deadline:
        rollout_requeue_stale(stale_after_s=4)
        rollout_resend_lost(unsent_after_s=4)
        evaluations_resume_paused()
        if time.monotonic() - nudged > 5:  # beat's campaigns job, every few seconds
            campaign_advance_enqueue(campaign_id=campaign.id)
            nudged = time.monotonic()
        if condition():
            return
        time.sleep(0.5)
    campaign.refresh_from_db()
    proposals = list(
        Proposal.objects.filter(campaign=campaign).values_list("sequence", "state", "state_detail")
    )
    raise AssertionError(
        f"timed out after {timeout_s}s waiting for {what}: campaign {campaign.state} "
        f"({campaign.stop_reason}), proposals {proposals}\n{worker.log_tail()}"
    )


def running_in_a_proposal(campaign) -> set:
    """Rollouts running now in a (non-seed) proposal's evaluation."""
    evaluation_ids = [
        e
        for p in Proposal.objects.filter(campaign=campaign, sequence__gte=1)
        for e in (p.search_evaluation_id, p.validation_evaluation_id)
        if e
    ]
    return set(
        Rollout.objects.filter(
            evaluation_id__in=evaluation_ids, state=RolloutState.RUNNING
        ).values_list("id", flat=True)
    )


def assert_scored_exactly_once(evaluation: Evaluation) -> None:
    assert evaluation.state == EvaluationState.FINISHED, (evaluation.id, evaluation.state_detail)
    rollouts = list(Rollout.objects.filter(evaluation=evaluation).select_related("task"))
    keys = [(r.task.key, r.epoch) for r in rollouts]
    assert len(keys) == len(set(keys)), keys
    for rollout in rollouts:
        if rollout.state == RolloutState.CANCELLED:
            # Only an early stop cancels the rest of an evaluation; a cancelled rollout never ran.
            assert evaluation.stop_reason, rollout.task.key
            assert not TraceStep.objects.filter(rollout=rollout, kind="verdict").exists()
            continue
        assert rollout.state == RolloutState.DONE, (rollout.task.key, rollout.state)
        assert rollout.outcome in (RolloutOutcome.PASSED, RolloutOutcome.TASK_FAILURE), (
            rollout.task.key,
            rollout.outcome,
            rollout.detail,
        )
        verdicts = TraceStep.objects.filter(rollout=rollout, kind="verdict")
        assert list(verdicts.values_list("attempt", flat=True)) == [rollout.attempts], (
            rollout.task.key
        )


def test_a_campaign_resumes_after_its_worker_is_killed_mid_proposal(
    workers, project, tmp_path, policy
):
    seed = styled_seed(project, tmp_path)
    suite = marked_suite(project)
    campaign = campaign_create(
        project=project,
        name="fault",
        seed_candidate=seed,
        policy_version=policy,
        suite=suite,
        # temperature gives every trial a new tree (style alone has two values: duplicates).
        strategy=[{"kind": "config", "options": {"knobs": ["style", "temperature"]}}],
        max_proposals=PROPOSALS,
        seed=5,
    )
    first = workers("first")
    campaign_start(campaign=campaign)

    wait_for(
        lambda: bool(running_in_a_proposal(campaign)),
        timeout_s=120,
        what="a proposal's rollout running on the first worker",
        campaign=campaign,
        worker=first,
    )
    first.kill()
    killed = running_in_a_proposal(campaign)
    assert killed, "the kill landed between rollouts"
    killed_sequences = set(
        Proposal.objects.filter(
            campaign=campaign, state__in=["proposed", "evaluating"]
        ).values_list("sequence", flat=True)
    )
    assert killed_sequences and min(killed_sequences) >= 1

    second = workers("second")
    wait_for(
        lambda: campaign.__class__.objects.get(id=campaign.id).is_final,
        timeout_s=200,
        what="the campaign to finish on the second worker",
        campaign=campaign,
        worker=second,
    )
    campaign.refresh_from_db()
    assert campaign.state == CampaignState.FINISHED, (campaign.state, campaign.stop_reason)
    assert campaign.stop_reason == f"max proposals reached ({PROPOSALS})"

    proposals = list(Proposal.objects.filter(campaign=campaign).order_by("sequence"))
    # No proposal repeated: contiguous sequence numbers, the seed once, then PROPOSALS trials.
    assert [p.sequence for p in proposals] == list(range(PROPOSALS + 1))
    assert [p.kind for p in proposals] == [ProposerKind.SEED] + [ProposerKind.CONFIG] * PROPOSALS
    trials = [p.trial_number for p in proposals[1:]]
    assert None not in trials and len(set(trials)) == len(trials), trials
    # One candidate per trial: proposals that reached evaluation each made their own commit.
    evaluated = [p for p in proposals if p.state != ProposalState.INVALID]
    shas = [p.candidate.sha for p in evaluated]
    assert len(set(shas)) == len(shas), shas
    # The proposal the kill interrupted was not abandoned: it ended like the others.
    for p in proposals:
        assert p.state in (ProposalState.EVALUATED, ProposalState.INVALID), (
            p.sequence,
            p.state,
            p.state_detail,
        )

    # Optuna's study holds exactly the proposals' trials, none asked twice or left running.
    study = optuna_storage().get_study_id_from_name(study_name(campaign))
    study_trials = optuna_storage().get_all_trials(study, deepcopy=False)
    # Besides the proposals' trials, the seed's own point, told once.
    seeds = [t for t in study_trials if t.user_attrs.get("coevo") == "seed"]
    assert len(seeds) == 1
    assert sorted(t.number for t in study_trials if t not in seeds) == sorted(trials)
    assert all(t.state.is_finished() for t in study_trials)

    for p in evaluated:
        assert p.search_evaluation_id, p.sequence
        assert_scored_exactly_once(Evaluation.objects.get(id=p.search_evaluation_id))
        if p.validation_evaluation_id:
            assert_scored_exactly_once(Evaluation.objects.get(id=p.validation_evaluation_id))
    # The rollouts running at the kill were run again by the second worker, once each.
    for rollout in Rollout.objects.filter(id__in=killed):
        assert rollout.state in (RolloutState.DONE, RolloutState.CANCELLED), rollout.state
        if rollout.state == RolloutState.DONE:
            assert rollout.attempts >= 2 and rollout.worker.startswith("second@"), (
                rollout.attempts,
                rollout.worker,
            )
