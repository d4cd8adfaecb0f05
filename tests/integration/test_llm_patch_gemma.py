"""The real Gemma 3 270M as the llm-patch proposer: whatever it writes is validated stage by
stage, and no invalid candidate is evaluated. (A base model of this size rarely writes a
valid patch; the point is the pipeline's behaviour on real, unscripted output.)"""

from __future__ import annotations

import time

import pytest

from coevo.campaigns.models import CampaignState, ProposalState, ProposerKind
from coevo.campaigns.services import campaign_create, campaign_start
from coevo.evaluations.models import Evaluation
from coevo.policies.embedded import DEFAULT_MODEL_ALIAS
from tests.campaigns.support import MARKER, marked_suite, proposer_endpoint, styled_seed

pytestmark = pytest.mark.llm

VALIDATED = ["applies", "manifest", "imports", "duplicate"]


def test_it_validates_whatever_gemma_proposes(
    llama_server, celery_worker_thread, project, tmp_path, policy_version, scripted_policy
):
    scripted_policy.default = "no"
    seed = styled_seed(project, tmp_path)
    campaign = campaign_create(
        project=project,
        name="gemma-proposer",
        seed_candidate=seed,
        policy_version=policy_version,
        suite=marked_suite(project),
        strategy=[
            {
                "kind": "llm-patch",
                "options": {
                    "endpoint": proposer_endpoint(llama_server).name,
                    "model": DEFAULT_MODEL_ALIAS,
                    "api": "completions",
                    "max_tokens": 96,
                    "temperature": 0.8,
                    "workspace_chars": 4000,
                },
            }
        ],
        max_proposals=2,
    )
    campaign_start(campaign=campaign)
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline:
        campaign.refresh_from_db()
        if campaign.is_final:
            break
        time.sleep(1)
    assert campaign.state == CampaignState.FINISHED, (campaign.state, campaign.stop_reason)

    proposals = list(campaign.proposals.exclude(kind=ProposerKind.SEED).order_by("sequence"))
    assert [p.kind for p in proposals] == [ProposerKind.LLM_PATCH] * 2
    evaluated_candidates = set(Evaluation.objects.values_list("candidate_id", flat=True))
    for p in proposals:
        assert p.prompt and MARKER not in p.prompt
        assert p.proposer_tokens > 0 and "usage" in p.params
        assert p.stages and p.stages[0]["stage"] == "applies"
        failed = next((s for s in p.stages if not s["ok"]), None)
        if failed is None:
            assert p.state == ProposalState.EVALUATED
            assert [s["stage"] for s in p.stages] == [*VALIDATED, "smoke"]
            continue
        assert p.state == ProposalState.INVALID and failed["reason"]
        assert p.validation_evaluation_id is None
        if failed["stage"] != "smoke":
            # Rejected before evaluation: nothing of it was evaluated.
            assert p.search_evaluation_id is None
            if p.candidate_id and failed["stage"] != "duplicate":
                assert p.candidate_id not in evaluated_candidates
