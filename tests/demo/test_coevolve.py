"""The demo's co-evolution (coevo.demo.coevolve): the alternating campaign it starts, what it
prints of the steps, and the harness x policy matrix it builds once the policy step ended.
The real run (training, conversion, llama.cpp) is tests/integration/test_policy_step_gemma.py."""

from __future__ import annotations

import pytest

from coevo.campaigns.models import Campaign, CampaignState, Proposal, ProposalState
from coevo.demo import coevolve
from coevo.demo.campaign import CAMPAIGN_KNOBS
from coevo.policies.embedded import DEFAULT_MODEL_ALIAS
from coevo.policies.models import EndpointKind
from coevo.policies.services import policy_version_create, policy_version_get_default
from coevo.suites.models import Split

pytestmark = pytest.mark.django_db


@pytest.fixture
def host_policy(settings):
    """The demo's default policy: Gemma behind the llama.cpp host (nothing serves it here)."""
    settings.COEVO_POLICY_URL = "http://127.0.0.1:9/v1"
    settings.COEVO_POLICY_MODEL = DEFAULT_MODEL_ALIAS
    settings.COEVO_POLICY_KIND = EndpointKind.LLAMACPP
    return policy_version_get_default()


@pytest.fixture
def campaign(project, owner, host_policy) -> Campaign:
    return coevolve.demo_coevolve_campaign(
        project=project, user=owner, games=1, max_steps=4, seed=6
    )


def test_it_starts_a_harness_step_a_policy_step_and_a_harness_step(campaign, host_policy):
    assert campaign.state != CampaignState.PENDING
    assert campaign.max_proposals == 2 and campaign.policy_version == host_policy
    assert campaign.strategy == [{"kind": "config", "options": {"knobs": CAMPAIGN_KNOBS}}]
    alternation = campaign.alternation
    assert alternation["trainer"] == coevolve.DEMO_TRAINER
    assert (alternation["harness_steps"], alternation["policy_steps"]) == (1, 1)
    assert alternation["max_policy_steps"] == 1
    # It trains on the search split only, never validation (which selects) or held-out.
    assert alternation["export"]["format"] == "prompt_completion"
    trainer = coevolve.demo_trainer()
    assert trainer.command[1:3] == ["-m", "coevo.training.cpu_lora"]
    assert list(coevolve.TRAINER_OPTIONS) == trainer.command[-len(coevolve.TRAINER_OPTIONS) :]


def _finished_policy_step(campaign: Campaign, base, found, *, adopted: bool):
    """The campaign as it ends: the seed, a harness step (a config draw that won), the
    policy step (a trained version), a harness step under the adopted policy."""
    trained = policy_version_create(
        name="gemma-demo-cpu-lora-1",
        endpoint=base.endpoint,
        adapter_name="gemma-demo-cpu-lora-1",
        adapter_path="/adapters/gemma-demo-cpu-lora-1",
        parent=base,
        provenance={
            "trainer": coevolve.DEMO_TRAINER,
            "export": "e1",
            "adapter_sha256": "a" * 64,
            "adapter_gguf": {"tensors": 144},
        },
    )
    seed = campaign.seed_candidate
    common = {"state": ProposalState.EVALUATED, "parent_shas": [seed.sha]}
    Proposal.objects.create(campaign=campaign, sequence=0, kind="seed", candidate=seed,
                            policy_version=base, validation_score=0.0, **common)  # fmt: skip
    Proposal.objects.create(campaign=campaign, sequence=1, kind="config", candidate=found,
                            policy_version=base, validation_score=0.5,
                            params={"order": "priority"}, improved=True, **common)  # fmt: skip
    Proposal.objects.create(campaign=campaign, sequence=2, kind="policy", candidate=found,
                            policy_version=trained, validation_score=0.75 if adopted else 0.25,
                            improved=adopted, **common)  # fmt: skip
    Campaign.objects.filter(id=campaign.id).update(
        state=CampaignState.FINISHED,
        best_candidate=found,
        best_validation_score=0.75 if adopted else 0.5,
        current_policy_version=trained if adopted else None,
        best_policy_version=trained if adopted else base,
    )
    campaign.refresh_from_db()
    return trained


def test_the_summary_names_each_step_and_the_new_policy_version(
    campaign, host_policy, child_candidate
):
    trained = _finished_policy_step(campaign, host_policy, child_candidate, adopted=True)

    lines = coevolve.coevolve_summary(campaign)

    assert lines[0].strip().startswith("seed: validation 0.0%")
    assert "step 1: harness step: validation 50.0%" in lines[1] and "priority" in lines[1]
    assert "step 2: policy step: validation 75.0%" in lines[2] and trained.name in lines[2]
    assert f"New policy version {trained.name} (parent {host_policy.name})" in lines[3]
    assert "llama.cpp adapter 144 tensors" in lines[3]
    assert lines[4].startswith("The campaign adopted it")


def test_a_policy_step_that_did_not_help_is_said_so(campaign, host_policy, child_candidate):
    _finished_policy_step(campaign, host_policy, child_candidate, adopted=False)
    assert coevolve.coevolve_summary(campaign)[-1].startswith("The campaign kept the base policy")


def test_the_matrix_crosses_the_harness_found_for_the_base_policy_with_both_policies(
    campaign, host_policy, owner, child_candidate
):
    found = child_candidate
    trained = _finished_policy_step(campaign, host_policy, found, adopted=True)

    matrix = coevolve.demo_matrix(campaign=campaign, user=owner)

    assert matrix.split == Split.VALIDATION and matrix.seed == campaign.seed
    cells = {(c.candidate_id, c.policy_version_id) for c in matrix.cells.all()}
    assert cells == {(found.id, host_policy.id), (found.id, trained.id)}
    lines = coevolve.matrix_summary(matrix)
    assert host_policy.name in lines[0] and trained.name in lines[0]
    assert lines[1].strip().startswith(found.short_sha)


def test_no_matrix_without_a_trained_policy(campaign, owner):
    assert coevolve.demo_matrix(campaign=campaign, user=owner) is None
