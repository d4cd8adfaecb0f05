"""An alternating campaign's policy steps, driven by hand: ``campaign_advance`` as the runner
task would call it, rollouts finished through the real claim/finish services (with recorded
model calls, so exports have rows), and the export build and the training run executed in
this process between advances (no worker). The trainer is tests/support/tiny_trainer.py, a
real subprocess."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest
from django.db import connection

from coevo.campaigns.models import Campaign, CampaignState, Proposal, ProposalState, ProposerKind
from coevo.campaigns.runner import campaign_advance
from coevo.campaigns.services import campaign_create, campaign_start, campaign_stop
from coevo.evaluations.models import (
    Evaluation,
    Rollout,
    RolloutState,
    TraceStep,
)
from coevo.evaluations.services import rollout_claim, rollout_finish
from coevo.exports.models import ExportState
from coevo.exports.services import trajectory_export_build
from coevo.policies.models import PolicyVersion
from coevo.training.models import Trainer, TrainingRun, TrainingState
from coevo.training.services import training_run_execute
from coevo.training.trainers import trainer_register
from workers.outcomes import RolloutOutcome

pytestmark = pytest.mark.django_db(transaction=True)

TRAINER = str(Path(__file__).resolve().parents[1] / "support" / "tiny_trainer.py")
OPEN = [ProposalState.PROPOSED, ProposalState.EVALUATING]


@pytest.fixture(autouse=True)
def dirs(settings, tmp_path):
    settings.COEVO_TRAINING_DIR = tmp_path / "training"
    settings.COEVO_ADAPTER_DIR = tmp_path / "adapters"
    settings.COEVO_EXPORT_DIR = tmp_path / "exports"
    return tmp_path


def register(*extra: str) -> None:
    trainer_register(
        name="tiny-lora",
        command=[sys.executable, TRAINER, "--data", "{export}", "--base", "{base_model}",
                 "--out", "{output_dir}", *extra],
        time_limit_s=120,
    )  # fmt: skip


def start(project, seed, suite, base_policy, *, max_proposals: int, **alternation) -> Campaign:
    campaign = campaign_create(
        project=project,
        name="alternating",
        seed_candidate=seed,
        policy_version=base_policy,
        suite=suite,
        strategy=[{"kind": "config", "options": {"knobs": ["style"]}}],
        max_proposals=max_proposals,
        seed=3,
        alternation={"trainer": "tiny-lora", **alternation},
    )
    return campaign_start(campaign=campaign)


def seed_only(proposal: Proposal) -> bool:
    return proposal.kind == ProposerKind.SEED


def nothing(proposal: Proposal) -> bool:
    return False


def finish_with_calls(evaluation: Evaluation, passed: bool) -> None:
    """Finish the evaluation's enqueued rollouts, each after one recorded model call (what a
    worker's harness run leaves behind, and what an export turns into rows)."""
    version = evaluation.policy_version
    for rollout in Rollout.objects.filter(
        evaluation=evaluation, state=RolloutState.PENDING
    ).select_related("task"):
        if not rollout.enqueued_at:
            continue
        claimed = rollout_claim(rollout_id=rollout.id, worker="test")
        if claimed is None:
            continue
        TraceStep.objects.create(
            rollout=rollout,
            attempt=claimed.attempts,
            index=1,
            kind="model_call",
            payload={
                "api": "completions",
                "model": version.served_name,
                "policy_version": version.name,
                "prompt": f"style=bad {rollout.task.key}",
                "completion": "yes" if passed else "no",
            },
        )
        outcome = RolloutOutcome.PASSED if passed else RolloutOutcome.TASK_FAILURE
        rollout_finish(
            rollout=claimed,
            outcome=outcome,
            score=float(passed),
            detail=outcome,
            prompt_tokens=5,
            model_calls=1,
        )


def open_proposal(campaign: Campaign) -> Proposal | None:
    return Proposal.objects.filter(campaign=campaign, state__in=OPEN).first()


def drive(campaign: Campaign, passes, *, until=None, train: bool = True, max_rounds: int = 80):
    """Advance the campaign; finish rollouts (``passes(proposal)``), build a policy step's
    export and execute its training run (``train``) as the workers would. Returns when the
    campaign ends or ``until(campaign)`` holds."""
    for _ in range(max_rounds):
        campaign_advance(campaign_id=campaign.id)
        campaign.refresh_from_db()
        if campaign.is_final or (until is not None and until(campaign)):
            return campaign
        proposal = open_proposal(campaign)
        if proposal is None:
            continue
        if proposal.kind == ProposerKind.POLICY and proposal.search_evaluation_id is None:
            if proposal.training_run_id is not None:
                if train:
                    training_run_execute(run_id=proposal.training_run_id)
            elif proposal.export_id is not None:
                trajectory_export_build(export_id=proposal.export_id)
            continue
        for evaluation_id in (proposal.search_evaluation_id, proposal.validation_evaluation_id):
            if evaluation_id:
                finish_with_calls(Evaluation.objects.get(id=evaluation_id), passes(proposal))
    raise AssertionError(f"campaign still {campaign.state} after {max_rounds} rounds")


def kinds(campaign: Campaign) -> list[str]:
    return list(campaign.proposals.order_by("sequence").values_list("kind", flat=True))


def policy_steps(campaign: Campaign) -> list[Proposal]:
    return list(campaign.proposals.filter(kind=ProposerKind.POLICY).order_by("sequence"))


def training_pending(campaign: Campaign) -> bool:
    return Proposal.objects.filter(
        campaign=campaign, kind=ProposerKind.POLICY, state__in=OPEN, training_run__isnull=False
    ).exists()


# --- the export stage ------------------------------------------------------------------------


def test_a_policy_step_with_nothing_to_train_on_is_invalid_and_the_campaign_goes_on(
    project, seed, suite, base_policy
):
    register()
    campaign = start(
        project, seed, suite, base_policy, max_proposals=2,
        harness_steps=1, policy_steps=1, max_policy_steps=1,
    )  # fmt: skip
    # Nothing ever passes: the best candidate (the seed) has no successful rollout to learn.
    campaign = drive(campaign, nothing)

    assert campaign.state == CampaignState.FINISHED
    # Policy steps do not use up max_proposals: two harness steps besides the policy step.
    assert campaign.stop_reason == "max proposals reached (2)"
    assert kinds(campaign) == [
        ProposerKind.SEED,
        ProposerKind.CONFIG,
        ProposerKind.POLICY,
        ProposerKind.CONFIG,
    ]
    (step,) = policy_steps(campaign)
    assert step.state == ProposalState.INVALID
    assert step.state_detail.startswith("rejected at the export stage: nothing to train on")
    assert [(s["stage"], s["ok"]) for s in step.stages] == [("export", False)]
    assert step.candidate == seed and step.parent_shas == [seed.sha]
    assert step.shown["export"]["candidate"] == seed.sha
    assert step.shown["export"]["policy_version"] == "base"
    assert step.search_evaluation_id is None and step.training_run_id is None
    assert step.export.state == ExportState.READY and step.export.rows == 0
    assert step.export.filters["successful_only"] is True
    assert step.export.filters["splits"] == ["search"]
    assert not TrainingRun.objects.exists()
    assert campaign.current_policy_version == base_policy


# --- the train stage -------------------------------------------------------------------------


def test_a_failing_trainer_makes_the_step_invalid_and_counts_as_a_policy_step(
    project, seed, suite, base_policy
):
    register("--fail")
    campaign = start(
        project, seed, suite, base_policy, max_proposals=3,
        harness_steps=1, policy_steps=1, max_policy_steps=1,
    )  # fmt: skip
    campaign = drive(campaign, seed_only)

    assert campaign.state == CampaignState.FINISHED, campaign.stop_reason
    # One policy step only: the failed one used up max_policy_steps.
    assert kinds(campaign) == [
        ProposerKind.SEED,
        ProposerKind.CONFIG,
        ProposerKind.POLICY,
        ProposerKind.CONFIG,
        ProposerKind.CONFIG,
    ]
    (step,) = policy_steps(campaign)
    assert step.state == ProposalState.INVALID
    run = step.training_run
    assert run.state == TrainingState.FAILED and run.exit_code == 3
    assert step.state_detail == (
        "rejected at the train stage: training failed: the command exited with status 3; "
        "the log's end says why"
    )
    export = step.export
    assert export.rows >= 1
    assert step.stages == [
        {
            "stage": "export",
            "ok": True,
            "reason": f"{export.rows} row(s) from {export.rollouts} rollout(s)",
        },
        {"stage": "train", "ok": False, "reason": f"training failed: {run.state_detail}"},
    ]
    assert step.policy_version_id is None and step.search_evaluation_id is None
    assert run.parent_policy == base_policy and run.export == export
    assert not PolicyVersion.objects.filter(parent=base_policy).exists()


def test_a_trainer_disabled_after_the_start_makes_the_step_invalid_at_the_train_stage(
    project, seed, suite, base_policy
):
    register()
    campaign = start(
        project, seed, suite, base_policy, max_proposals=2,
        harness_steps=1, policy_steps=1, max_policy_steps=1,
    )  # fmt: skip
    Trainer.objects.filter(name="tiny-lora").update(enabled=False)
    campaign = drive(campaign, seed_only)

    assert campaign.state == CampaignState.FINISHED, campaign.stop_reason
    (step,) = policy_steps(campaign)
    assert step.state == ProposalState.INVALID
    assert step.state_detail == ("rejected at the train stage: The trainer tiny-lora is disabled.")
    assert [(s["stage"], s["ok"]) for s in step.stages] == [("export", True), ("train", False)]
    assert step.training_run_id is None and not TrainingRun.objects.exists()
    assert kinds(campaign)[-1] == ProposerKind.CONFIG


# --- evaluate: not adopted -------------------------------------------------------------------


def test_a_policy_step_that_does_not_improve_is_not_adopted(project, seed, suite, base_policy):
    register()
    campaign = start(
        project, seed, suite, base_policy, max_proposals=2,
        harness_steps=1, policy_steps=1, max_policy_steps=1,
    )  # fmt: skip
    # The seed passes everything under the base policy; under the trained adapter it fails.
    campaign = drive(campaign, seed_only)

    assert campaign.state == CampaignState.FINISHED, campaign.stop_reason
    assert kinds(campaign) == [
        ProposerKind.SEED,
        ProposerKind.CONFIG,
        ProposerKind.POLICY,
        ProposerKind.CONFIG,
    ]
    (step,) = policy_steps(campaign)
    run = step.training_run
    assert run.state == TrainingState.SUCCEEDED, run.state_detail
    trained = run.policy_version
    assert trained.parent == base_policy
    assert step.policy_version == trained
    assert [s["stage"] for s in step.stages][:3] == ["export", "train", "register"]
    assert step.stages[2]["reason"] == run.state_detail
    # Evaluated like any proposal, under the trained version, and worse than the seed.
    assert step.state == ProposalState.EVALUATED, step.state_detail
    assert step.search_evaluation.policy_version == trained
    assert step.search_evaluation.candidate == seed
    assert step.search_score == 0.0
    assert not step.improved
    # Not adopted: the campaign keeps the base policy, and so does the next harness step.
    assert campaign.current_policy_version == base_policy
    assert campaign.best_policy_version == base_policy
    assert campaign.best_candidate == seed and campaign.best_validation_score == 1.0
    seed_search = campaign.proposals.get(kind=ProposerKind.SEED).search_evaluation
    assert step.search_evaluation.reference == seed_search
    after = campaign.proposals.get(sequence=step.sequence + 1)
    assert after.kind == ProposerKind.CONFIG and after.state == ProposalState.EVALUATED
    assert after.policy_version == base_policy
    assert after.search_evaluation.policy_version == base_policy
    assert after.search_evaluation.reference == seed_search


def test_a_policy_step_that_improves_is_adopted_for_later_harness_steps(
    project, seed, suite, base_policy
):
    register()
    campaign = start(
        project, seed, suite, base_policy, max_proposals=2,
        harness_steps=1, policy_steps=1, max_policy_steps=1,
        export={"successful_only": False},
    )  # fmt: skip
    # Only the trained policy answers right: the seed under it beats the seed under the base.
    campaign = drive(campaign, lambda p: p.kind == ProposerKind.POLICY)

    assert campaign.state == CampaignState.FINISHED, campaign.stop_reason
    (step,) = policy_steps(campaign)
    trained = step.training_run.policy_version
    assert step.state == ProposalState.EVALUATED and step.improved
    assert step.validation_score == 1.0
    assert step.export.filters["successful_only"] is False and step.export.rows >= 1
    assert campaign.current_policy_version == trained
    assert campaign.best_policy_version == trained
    assert campaign.best_candidate == seed and campaign.best_validation_score == 1.0
    # Later harness steps run under the adopted policy, paired against the step's evaluation.
    after = campaign.proposals.get(sequence=step.sequence + 1)
    assert after.kind == ProposerKind.CONFIG
    assert after.policy_version == trained
    assert after.search_evaluation.policy_version == trained
    assert after.search_evaluation.reference == step.search_evaluation


# --- stopping the campaign during training ---------------------------------------------------


def test_stopping_the_campaign_cancels_a_pending_training_run(project, seed, suite, base_policy):
    register()
    campaign = start(
        project, seed, suite, base_policy, max_proposals=3,
        harness_steps=1, policy_steps=1, max_policy_steps=1,
    )  # fmt: skip
    campaign = drive(campaign, seed_only, until=training_pending, train=False)
    (step,) = policy_steps(campaign)
    run = step.training_run
    assert run.state == TrainingState.PENDING

    campaign = campaign_stop(campaign=campaign, reason="enough")
    assert campaign.state == CampaignState.STOPPED
    run.refresh_from_db()
    step.refresh_from_db()
    assert run.state == TrainingState.CANCELLED
    assert run.state_detail == "cancelled before it started"
    assert step.state == ProposalState.FAILED
    assert step.state_detail == "campaign stopped: enough"
    # A late delivery of the training task does nothing; neither does an advance.
    assert training_run_execute(run_id=run.id) is None
    campaign_advance(campaign_id=campaign.id)
    assert kinds(campaign)[-1] == ProposerKind.POLICY


def test_stopping_the_campaign_stops_a_running_training_run(project, seed, suite, base_policy):
    register("--sleep", "60")
    campaign = start(
        project, seed, suite, base_policy, max_proposals=3,
        harness_steps=1, policy_steps=1, max_policy_steps=1,
    )  # fmt: skip
    campaign = drive(campaign, seed_only, until=training_pending, train=False)
    (step,) = policy_steps(campaign)
    run_id = step.training_run_id

    errors: list[BaseException] = []

    def execute() -> None:
        try:
            training_run_execute(run_id=run_id)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    worker = threading.Thread(target=execute, daemon=True)
    worker.start()
    deadline = time.monotonic() + 60
    while "epoch 1/2" not in TrainingRun.objects.get(id=run_id).log_tail:
        assert time.monotonic() < deadline, "the trainer never started"
        time.sleep(0.1)

    campaign_stop(campaign=campaign, reason="enough")
    worker.join(timeout=60)
    assert not worker.is_alive() and not errors, errors

    run = TrainingRun.objects.get(id=run_id)
    assert run.state == TrainingState.CANCELLED
    assert run.state_detail == "cancelled: the command was stopped"
    assert run.cancel_requested and run.policy_version is None
    step.refresh_from_db()
    assert step.state == ProposalState.FAILED
    campaign.refresh_from_db()
    assert campaign.state == CampaignState.STOPPED
    assert not PolicyVersion.objects.filter(parent=base_policy).exists()


# --- the patience switch rule ----------------------------------------------------------------


def test_the_patience_rule_takes_a_policy_step_after_steps_without_improvement(
    project, seed, suite, base_policy
):
    register()
    campaign = start(
        project, seed, suite, base_policy, max_proposals=3,
        switch="patience", patience=2, max_policy_steps=1,
    )  # fmt: skip
    campaign = drive(campaign, nothing)

    assert campaign.state == CampaignState.FINISHED, campaign.stop_reason
    assert kinds(campaign) == [
        ProposerKind.SEED,
        ProposerKind.CONFIG,
        ProposerKind.CONFIG,
        ProposerKind.POLICY,
        ProposerKind.CONFIG,
    ]
    harness = campaign.proposals.filter(kind=ProposerKind.CONFIG).order_by("sequence")
    assert not any(p.improved for p in harness[:2])
    assert campaign.stop_reason == "max proposals reached (3)"
