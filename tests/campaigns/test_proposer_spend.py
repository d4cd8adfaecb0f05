"""Proposer spend in the ledger: each draft's proposer tokens and wall time are recorded on its
proposal and charged to the campaign's budget as units of their own (never as policy tokens);
the campaign finishes before the next draft once a proposer limit is spent, and its page shows
the spend. The llm-patch proposer answers from a scripted server; rollouts are finished by hand."""

from __future__ import annotations

import time

import pytest
from django.db.models import Sum

from coevo.campaigns.models import CampaignState, Proposal, ProposerKind
from coevo.campaigns.proposers.config import ConfigProposer
from coevo.campaigns.services import campaign_create, campaign_start
from coevo.errors import BudgetExceeded
from coevo.evaluations.ledger import (
    Amount,
    BudgetLimits,
    budget_create,
    budget_reserve,
    budget_settle,
)
from coevo.evaluations.models import LedgerEntry
from tests.campaigns.support import drive, proposer_endpoint
from tests.campaigns.test_llm_patch import QueuedProposer
from tests.support.openai_server import ScriptedOpenAIServer

pytestmark = pytest.mark.django_db(transaction=True)

# No edit: rejected at the applies stage, so a draft costs its tokens and no evaluation.
IDLE = "HYPOTHESIS: leave it as it is"


@pytest.fixture
def proposer():
    policy = QueuedProposer([IDLE] * 5)
    policy.model = "proposer-model"
    with ScriptedOpenAIServer(policy) as server:
        proposer_endpoint(server.url)
        yield policy


def llm_campaign(project, seed, suite, policy_version, **kwargs):
    kwargs.setdefault("max_proposals", 3)
    campaign = campaign_create(
        project=project,
        name="spend",
        seed_candidate=seed,
        policy_version=policy_version,
        suite=suite,
        strategy=[
            {"kind": "llm-patch", "options": {"endpoint": "proposer", "model": "proposer-model"}}
        ],
        **kwargs,
    )
    campaign_start(campaign=campaign)
    return campaign


def drafted(campaign) -> list[Proposal]:
    return list(campaign.proposals.exclude(kind=ProposerKind.SEED).order_by("sequence"))


def test_it_records_each_drafts_spend_and_charges_the_sum_as_proposer_units(
    project, seed, suite, policy_version, proposer
):
    proposer.latency_s = 0.05
    campaign = drive(llm_campaign(project, seed, suite, policy_version), lambda p: False)

    assert campaign.stop_reason == "max proposals reached (3)"
    proposals = drafted(campaign)
    assert len(proposals) == 3
    for p in proposals:
        usage = p.params["usage"]
        assert p.proposer_tokens == usage["prompt_tokens"] + usage["completion_tokens"] > 0
        assert p.proposer_wall_ms >= 50  # the model call, as the server delayed it
    budget = campaign.budget
    budget.refresh_from_db()
    assert budget.spent_proposer_tokens == sum(p.proposer_tokens for p in proposals)
    assert budget.spent_proposer_wall_ms == sum(p.proposer_wall_ms for p in proposals)
    assert budget.reserved_proposer_tokens == budget.reserved_proposer_wall_ms == 0
    # The policy's own units hold the seed's rollouts only: nothing of the proposer's.
    assert budget.spent_tokens == 5 * budget.spent_rollouts
    entries = LedgerEntry.objects.filter(budget=budget, proposer_tokens__gt=0)
    assert [e.note for e in entries] == [f"proposal {p.sequence} (llm-patch)" for p in proposals]
    assert entries.aggregate(t=Sum("proposer_tokens"))["t"] == budget.spent_proposer_tokens


def test_it_finishes_before_the_next_draft_once_the_proposer_tokens_are_spent(
    project, seed, suite, policy_version, proposer
):
    campaign = llm_campaign(
        project, seed, suite, policy_version, max_proposals=5,
        budget_limits=BudgetLimits(proposer_tokens=1),
    )  # fmt: skip
    campaign = drive(campaign, lambda p: False)

    assert campaign.state == CampaignState.FINISHED
    [only] = drafted(campaign)  # the first draft spent it; no second was asked for
    assert len(proposer.answers) == 4
    assert campaign.stop_reason == (
        f"proposer token budget spent: {only.proposer_tokens:,} of 1 tokens"
    )


def test_it_finishes_once_the_proposer_wall_time_is_spent(
    project, seed, suite, policy_version, proposer
):
    proposer.latency_s = 1.1
    campaign = llm_campaign(
        project, seed, suite, policy_version, max_proposals=5,
        budget_limits=BudgetLimits(proposer_wall_s=1),
    )  # fmt: skip
    campaign = drive(campaign, lambda p: False)

    [only] = drafted(campaign)
    assert only.proposer_wall_ms >= 1100
    assert campaign.stop_reason == (
        f"proposer wall-time budget spent: {only.proposer_wall_ms / 1000:,.1f} of 1.0 s"
    )


def test_it_times_a_proposer_that_asks_no_model_around_its_whole_draft(
    project, seed, suite, policy_version, monkeypatch
):
    propose = ConfigProposer.propose

    def slow_propose(self, *, history):
        time.sleep(0.05)
        return propose(self, history=history)

    monkeypatch.setattr(ConfigProposer, "propose", slow_propose)
    campaign = campaign_create(
        project=project,
        name="config spend",
        seed_candidate=seed,
        policy_version=policy_version,
        suite=suite,
        max_proposals=2,
    )
    campaign_start(campaign=campaign)
    campaign = drive(campaign, lambda p: False)

    proposals = drafted(campaign)
    assert [p.kind for p in proposals] == [ProposerKind.CONFIG] * 2
    assert all(p.proposer_wall_ms >= 50 and p.proposer_tokens == 0 for p in proposals)
    campaign.budget.refresh_from_db()
    assert campaign.budget.spent_proposer_wall_ms == sum(p.proposer_wall_ms for p in proposals)


def test_a_spent_proposer_limit_refuses_proposer_work_but_not_rollouts(project):
    budget = budget_create(
        project=project, name="b", limits=BudgetLimits(rollouts=2, proposer_tokens=10)
    )
    budget_settle(budget=budget, reserved=Amount(), actual=Amount(proposer_tokens=12), rollout=None)
    # The proposal the last draft paid for still gets evaluated.
    budget_reserve(budget=budget, amount=Amount(rollouts=1))
    with pytest.raises(BudgetExceeded, match="proposer tokens"):
        budget_reserve(budget=budget, amount=Amount(proposer_tokens=1))
    budget.refresh_from_db()
    assert (budget.reserved_rollouts, budget.spent_proposer_tokens) == (1, 12)


def test_the_page_shows_proposer_spend_with_its_limits(
    client, owner, project, seed, suite, policy_version, proposer
):
    campaign = llm_campaign(
        project, seed, suite, policy_version, max_proposals=1,
        budget_limits=BudgetLimits(proposer_tokens=50_000, proposer_wall_s=600),
    )  # fmt: skip
    campaign = drive(campaign, lambda p: False)
    [only] = drafted(campaign)
    client.force_login(owner)

    content = client.get(f"/p/demo/campaigns/{campaign.id}/").content.decode()

    tokens_row = content.split('class="spend-proposer-tokens"')[1].split("</tr>")[0]
    assert f"<td>{only.proposer_tokens}</td>" in tokens_row and "50000" in tokens_row
    wall_row = content.split('class="spend-proposer-wall-s"')[1].split("</tr>")[0]
    assert f"<td>{round(only.proposer_wall_ms / 1000, 1)}</td>" in wall_row
    assert "<td>600 (" in wall_row  # the limit, and the share used
    assert "proposer tokens 50000" in content  # the budgets line
