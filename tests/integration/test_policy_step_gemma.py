"""A real policy step on the CPU, end to end (issue 20): an alternating campaign on TextWorld
with Gemma 3 270M served by the coevo llama.cpp host, run by a real Celery worker. Its policy
step exports the best candidate's search turns, trains a LoRA adapter with the built-in CPU
trainer (real transformers and PEFT, from the shipped GGUF weights, a few steps), converts it
to GGUF, has llama.cpp load it, registers it as a policy version and evaluates the best
candidate under it: the host loads the adapter at run time and answers under its name."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from coevo.campaigns.models import CampaignState, ProposalState, ProposerKind
from coevo.campaigns.services import campaign_advance_enqueue, campaign_create, campaign_start
from coevo.demo.campaign import CAMPAIGN_KNOBS, demo_textworld_suite, naive_seed_import
from coevo.evaluations.models import (
    Rollout,
)
from coevo.policies.embedded import DEFAULT_MODEL_ALIAS
from coevo.policies.services import policy_version_get_default
from coevo.training.builtin import trainer_register_cpu_lora
from coevo.training.models import TrainingState
from workers.outcomes import RolloutOutcome

pytestmark = [pytest.mark.llm, pytest.mark.timeout(1500)]

# As small as a real step can be: one game a split, a few moves, two optimizer steps.
GAMES = 1
MAX_STEPS = 4
TRAINER_OPTIONS = ("--steps", "2", "--batch-size", "2", "--max-length", "768")


def test_a_policy_step_trains_converts_registers_and_serves_a_lora_adapter_of_gemma(
    llama_server, celery_worker_thread, project, owner, settings
):
    settings.COEVO_POLICY_URL = llama_server
    settings.COEVO_POLICY_MODEL = DEFAULT_MODEL_ALIAS
    settings.COEVO_POLICY_KIND = "llamacpp"
    base = policy_version_get_default()
    trainer = trainer_register_cpu_lora(
        name="cpu-lora-ci", replace=True, time_limit_s=900, options=TRAINER_OPTIONS
    )
    seed, _ = naive_seed_import(project=project, user=owner, author="test")
    suite = demo_textworld_suite(project=project, games=GAMES, max_steps=MAX_STEPS)
    campaign = campaign_create(
        project=project,
        name="gemma co-evolution",
        seed_candidate=seed,
        policy_version=base,
        suite=suite,
        strategy=[{"kind": "config", "options": {"knobs": CAMPAIGN_KNOBS}}],
        # Harness proposals (policy steps have their own quota): a harness step, the policy
        # step, a harness step under whichever policy the campaign then has.
        max_proposals=2,
        seed=6,
        created_by=owner,
        alternation={
            "trainer": trainer.name,
            "harness_steps": 1,
            "policy_steps": 1,
            "max_policy_steps": 1,
            # Every turn of the best candidate's search game: a 270M model rarely wins one.
            "export": {"format": "prompt_completion", "successful_only": False},
        },
    )
    campaign_start(campaign=campaign)

    deadline = time.monotonic() + 1400
    nudged = time.monotonic()
    while time.monotonic() < deadline:
        campaign.refresh_from_db()
        if campaign.is_final:
            break
        if time.monotonic() - nudged > 30:  # beat's campaign job; the signals should suffice
            campaign_advance_enqueue(campaign_id=campaign.id)
            nudged = time.monotonic()
        time.sleep(1)
    assert campaign.state == CampaignState.FINISHED, (campaign.state, campaign.stop_reason)

    step = campaign.proposals.get(kind=ProposerKind.POLICY)
    assert step.state == ProposalState.EVALUATED, (step.state_detail, step.stages)
    assert [s["stage"] for s in step.stages if s["ok"]][:3] == ["export", "train", "register"]

    # Trained for real: the run's log shows the optimizer steps the trainer was asked for.
    run = step.training_run
    assert run.state == TrainingState.SUCCEEDED, run.state_detail
    assert run.export.rows > 0
    assert "step 2/2 loss" in run.log_tail, run.log_tail[-2000:]

    # Registered as a child of the base policy, on the same llama.cpp endpoint, with the GGUF
    # conversion llama.cpp loaded before registration, all content-hashed.
    version = step.policy_version
    assert version.parent_id == base.id and version.endpoint_id == base.endpoint_id
    assert version.has_adapter and version.served_name == version.adapter_name
    installed = Path(version.adapter_path)
    assert (installed / "adapter.gguf").is_file()
    assert (installed / "adapter_model.safetensors").is_file()
    provenance = version.provenance
    assert provenance["training_run"] == str(run.id)
    assert provenance["export"] == str(run.export_id)
    assert provenance["adapter_sha256"] == run.adapter_sha256
    assert provenance["adapter_gguf"]["tensors"] > 0
    assert provenance["adapter_gguf"]["load_check_text"] is not None

    # Served: the best candidate was evaluated under the new version, the host loaded the
    # adapter at run time, and the games were played (no infrastructure error).
    evaluation = step.search_evaluation
    assert evaluation.policy_version_id == version.id
    outcomes = set(Rollout.objects.filter(evaluation=evaluation).values_list("outcome", flat=True))
    assert outcomes and outcomes <= {RolloutOutcome.PASSED, RolloutOutcome.TASK_FAILURE}, outcomes
    models = httpx.get(f"{llama_server}/models", timeout=10).json()["data"]
    assert version.served_name in {m["id"] for m in models}
    print(
        f"policy step: {run.export.rows} rows, trained in {run.duration_s:.0f} s, "
        f"{provenance['adapter_gguf']['tensors']} GGUF tensors; search "
        f"{step.search_score} under {version.name} vs the best's before"
    )
