"""An alternating campaign end to end on CPU: harness steps, then a policy step whose trainer
really runs (tests/support/tiny_trainer.py), writes a LoRA adapter that coevo validates,
installs and registers, the vLLM test server loads it, and the best harness is re-evaluated
under it; adopted, it answers the later harness steps."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from coevo.campaigns.models import CampaignState, ProposalState, ProposerKind
from coevo.campaigns.services import campaign_create, campaign_start
from coevo.evaluations.models import Rollout, TraceStep
from coevo.exports.services import export_path
from coevo.training.models import TrainingState
from coevo.training.trainers import trainer_register
from tests.campaigns.support import marked_suite, styled_seed
from tests.support.factories import make_vllm_policy
from tests.support.vllm_server import VLLMPolicy, VLLMTestServer

TRAINER = str(Path(__file__).resolve().parents[1] / "support" / "tiny_trainer.py")


@pytest.fixture
def vllm():
    # The base model answers one search task (q0) and one validation task (v0) right; any
    # adapter it loads answers everything right: training "helps".
    policy = VLLMPolicy(model="base-model", default="no", adapter_default="yes")
    policy.rules += [("q0", "yes"), ("v0", "yes")]
    with VLLMTestServer(policy) as server:
        policy.url = server.url
        yield policy


@pytest.fixture
def served_base_policy(db, vllm):
    return make_vllm_policy(base_url=vllm.url, max_concurrency=4)


@pytest.fixture
def dirs(settings, tmp_path):
    settings.COEVO_TRAINING_DIR = tmp_path / "training"
    settings.COEVO_ADAPTER_DIR = tmp_path / "adapters"
    settings.COEVO_EXPORT_DIR = tmp_path / "exports"
    return tmp_path


def wait_final(campaign, timeout_s: float = 240):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        campaign.refresh_from_db()
        if campaign.is_final:
            return campaign
        time.sleep(0.5)
    raise AssertionError(f"campaign still {campaign.state}: {campaign.state_detail}")


def test_an_alternating_campaign_trains_registers_and_adopts_an_adapter(
    celery_worker_thread, project, tmp_path, dirs, vllm, served_base_policy
):
    trainer_register(
        name="tiny-lora",
        command=[sys.executable, TRAINER, "--data", "{export}", "--base", "{base_model}",
                 "--out", "{output_dir}"],
        time_limit_s=120,
    )  # fmt: skip
    seed = styled_seed(project, tmp_path)
    suite = marked_suite(project)
    campaign = campaign_create(
        project=project,
        name="alternating",
        seed_candidate=seed,
        policy_version=served_base_policy,
        suite=suite,
        strategy=[{"kind": "config", "options": {"knobs": ["style"]}}],
        max_proposals=2,
        seed=3,
        alternation={
            "trainer": "tiny-lora",
            "switch": "fixed",
            "harness_steps": 1,
            "policy_steps": 1,
            "max_policy_steps": 1,
        },
    )
    campaign_start(campaign=campaign)
    campaign = wait_final(campaign)

    assert campaign.state == CampaignState.FINISHED, campaign.stop_reason
    proposals = list(campaign.proposals.order_by("sequence"))
    kinds = [p.kind for p in proposals]
    assert kinds == [
        ProposerKind.SEED,
        ProposerKind.CONFIG,
        ProposerKind.POLICY,
        ProposerKind.CONFIG,
    ]
    seed_p, harness_1, step, harness_2 = proposals
    # Under the base model the seed answers q0 and v0 only.
    assert seed_p.policy_version == served_base_policy
    assert seed_p.search_score == 0.25 and seed_p.validation_score == 0.5
    assert harness_1.policy_version == served_base_policy

    # The policy step: export → train → register → evaluate, each stage recorded.
    assert step.state == ProposalState.EVALUATED, (step.state_detail, step.stages)
    assert [s["stage"] for s in step.stages] == ["export", "train", "register", "smoke"]
    assert all(s["ok"] for s in step.stages)
    export = step.export
    assert export.rows == 1 and export.filters["candidate"] == seed.sha
    assert export.filters["splits"] == ["search"] and export.filters["policy_version"] == "base"
    assert export.filters["successful_only"] is True
    rows = [json.loads(line) for line in export_path(sha256=export.sha256).read_text().splitlines()]
    assert len(rows) == 1
    assert rows[0]["provenance"]["harness_sha"] == seed.sha
    assert rows[0]["provenance"]["policy_version"] == "base"
    assert rows[0]["provenance"]["split"] == "search" and rows[0]["provenance"]["task"] == "s0"

    run = step.training_run
    assert run.state == TrainingState.SUCCEEDED, run.state_detail
    assert run.exit_code == 0
    assert "epoch 2/2" in run.log_tail and "saved adapter" in run.log_tail
    assert run.command[1] == TRAINER and run.command[3] == str(export_path(sha256=export.sha256))
    trained = run.policy_version
    assert step.policy_version == trained
    assert trained.parent == served_base_policy and trained.base_model == "base-model"
    assert Path(trained.adapter_path).parent == dirs / "adapters"
    assert (Path(trained.adapter_path) / "adapter_model.safetensors").is_file()
    assert trained.provenance["export"] == str(export.id)
    assert trained.provenance["training_run"] == str(run.id)
    assert trained.provenance["trainer_command"] == run.command
    assert trained.provenance["adapter_sha256"] == run.adapter_sha256

    # vLLM's protocol: loaded, then used by name.
    loads = [r for r in vllm.requests if r["path"] == "/v1/load_lora_adapter"]
    assert [r["lora_name"] for r in loads] == [trained.adapter_name]
    assert loads[0]["lora_path"] == trained.adapter_path

    # Re-evaluated under the adapter, the seed scores 100%: adopted.
    assert step.candidate == seed_p.candidate
    assert step.search_evaluation.policy_version == trained
    assert step.validation_score == 1.0 and step.improved
    assert campaign.current_policy_version == trained
    assert campaign.best_policy_version == trained
    assert campaign.best_validation_score == 1.0

    # The next harness step ran under the adopted policy, and every recorded model call of
    # its rollouts names that policy version.
    assert harness_2.policy_version == trained
    assert harness_2.search_evaluation.policy_version == trained
    calls = TraceStep.objects.filter(
        rollout__evaluation=harness_2.search_evaluation, kind="model_call"
    )
    assert calls.exists()
    for call in calls:
        assert call.payload.get("policy_version") == trained.name, call.payload
    assert Rollout.objects.filter(evaluation=harness_2.search_evaluation).count() >= 1
