"""A config campaign run by a real worker against the scripted policy, end to end."""

from __future__ import annotations

import json
import time

from coevo.campaigns.models import CampaignState, ProposalState, ProposerKind
from coevo.campaigns.selectors import campaign_best_series, campaign_pareto_front, campaign_progress
from coevo.campaigns.services import campaign_create, campaign_start
from tests.campaigns.support import MARKER, marked_suite, styled_seed


def test_it_runs_a_config_campaign_to_the_end_on_a_real_worker(
    celery_worker_thread, project, tmp_path, policy_version, scripted_policy
):
    scripted_policy.rules.append(("style=good", "yes"))
    scripted_policy.default = "no"
    seed = styled_seed(project, tmp_path)
    suite = marked_suite(project)
    campaign = campaign_create(
        project=project,
        name="e2e",
        seed_candidate=seed,
        policy_version=policy_version,
        suite=suite,
        strategy=[{"kind": "config", "options": {"knobs": ["style"]}}],
        max_proposals=2,
        seed=3,
    )
    campaign_start(campaign=campaign)

    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        campaign.refresh_from_db()
        if campaign.is_final:
            break
        time.sleep(0.5)
    assert campaign.state == CampaignState.FINISHED, campaign.stop_reason
    assert campaign.stop_reason == "max proposals reached (2)"
    proposals = list(campaign.proposals.order_by("sequence"))
    assert [p.kind for p in proposals] == [ProposerKind.SEED] + [ProposerKind.CONFIG] * 2
    seed_proposal = proposals[0]
    assert seed_proposal.validation_score == 0.0
    # style has two values and the seed holds one: the first new tree is style=good.
    good = [p for p in proposals if p.state == ProposalState.EVALUATED and p.kind == "config"]
    # (The sampler is seeded, so which trial draws it is fixed: seed=3 draws it within two.)
    assert good, [(p.params, p.state, p.state_detail) for p in proposals]
    assert good[0].params == {"style": "good"}
    assert good[0].validation_score == 1.0 and good[0].search_score == 1.0
    # Chosen on validation, over the seed (validation 0.0).
    assert campaign.best_candidate_id == good[0].candidate_id
    assert campaign.best_validation_score == 1.0
    assert 'default = "good"' in good[0].patch
    assert campaign_pareto_front(campaign=campaign)[0].id == good[0].id
    for p in proposals:
        dumped = json.dumps(
            [p.shown, p.prompt, p.response, p.patch, p.stages, p.params, p.state_detail]
        )
        assert MARKER not in dumped
    progress = campaign_progress(campaign=campaign)
    assert progress.proposals == 2 and progress.budget.spent_rollouts > 0
    assert len(campaign_best_series(campaign=campaign)) == 3
