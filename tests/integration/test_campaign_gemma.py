"""A config campaign against the real llama.cpp server and Gemma 3 270M, on TextWorld games,
run by a real Celery worker: it finishes by itself and picks its best candidate on validation."""

from __future__ import annotations

import time

import pytest

from coevo.campaigns.models import CampaignState, Proposal, ProposerKind
from coevo.campaigns.services import campaign_advance_enqueue, campaign_create, campaign_start
from coevo.demo.campaign import CAMPAIGN_KNOBS, TEXTWORLD_HARNESS, demo_textworld_suite
from coevo.evaluations.models import Outcome, Rollout
from coevo.policies.embedded import DEFAULT_MODEL_ALIAS

pytestmark = [pytest.mark.llm, pytest.mark.timeout(900)]

PROPOSALS = 2
GAMES = 1  # per split
MAX_STEPS = 8


def test_it_runs_a_config_campaign_with_gemma_to_a_best_candidate_chosen_on_validation(
    llama_server, celery_worker_thread, project, owner, settings
):
    from coevo.policies.services import policy_version_get_default
    from harness_store.services import candidate_import_directory

    settings.COEVO_POLICY_URL = llama_server
    settings.COEVO_POLICY_MODEL = DEFAULT_MODEL_ALIAS
    seed, _ = candidate_import_directory(
        project=project,
        directory=TEXTWORLD_HARNESS,
        message="Seed harness: textworld-basic",
        author_name="Owner",
        created_by=owner,
    )
    suite = demo_textworld_suite(project=project, games=GAMES, max_steps=MAX_STEPS)
    campaign = campaign_create(
        project=project,
        name="gemma config",
        seed_candidate=seed,
        policy_version=policy_version_get_default(),
        suite=suite,
        strategy=[{"kind": "config", "options": {"knobs": CAMPAIGN_KNOBS}}],
        max_proposals=PROPOSALS,
        seed=1,
    )
    campaign_start(campaign=campaign)

    deadline = time.monotonic() + 840
    nudged = time.monotonic()
    while time.monotonic() < deadline:
        campaign.refresh_from_db()
        if campaign.is_final:
            break
        if time.monotonic() - nudged > 30:  # beat's campaign job; the signal should suffice
            campaign_advance_enqueue(campaign_id=campaign.id)
            nudged = time.monotonic()
        time.sleep(1)

    assert campaign.state == CampaignState.FINISHED, (campaign.state, campaign.stop_reason)
    assert campaign.stop_reason == f"max proposals reached ({PROPOSALS})"
    proposals = list(Proposal.objects.filter(campaign=campaign).order_by("sequence"))
    assert [p.kind for p in proposals] == [ProposerKind.SEED] + [ProposerKind.CONFIG] * PROPOSALS
    assert all(p.is_final for p in proposals)
    validated = [p for p in proposals if p.validation_score is not None]
    assert proposals[0] in validated, "the seed is evaluated on validation first"
    # The best is the top validation score (the earliest one on ties), never a search score.
    top = max(p.validation_score for p in validated)
    first_top = next(p for p in validated if p.validation_score == top)
    assert campaign.best_validation_score == top
    assert campaign.best_candidate_id == first_top.candidate_id
    for p in proposals[1:]:
        assert p.trial_number is not None and p.params, p.sequence
        assert set(p.params) == set(CAMPAIGN_KNOBS)
    # Gemma may lose every game, but nothing may go wrong in the pipeline.
    evaluation_ids = [
        e for p in proposals for e in (p.search_evaluation_id, p.validation_evaluation_id) if e
    ]
    outcomes = set(
        Rollout.objects.filter(evaluation_id__in=evaluation_ids, state="done").values_list(
            "outcome", flat=True
        )
    )
    assert outcomes <= {Outcome.PASSED, Outcome.TASK_FAILURE}, outcomes
    print(
        f"seed validation {proposals[0].validation_score}, best {campaign.best_validation_score}, "
        f"proposals {[(p.sequence, p.state, p.params, p.validation_score) for p in proposals]}"
    )
