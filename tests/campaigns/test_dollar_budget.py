"""A campaign whose llm-patch proposer runs on a hosted-style endpoint (the local provider
server: OpenAI's API, its key required, its usage reported) with a price: each draft's dollars
are charged to the campaign's ledger as proposer spend, shown on the campaign page and in the
API beside the policy's, and the campaign stops on its proposer dollar budget, saying so."""

from __future__ import annotations

import time
from decimal import Decimal

import pytest
from cryptography.fernet import Fernet
from django.urls import reverse

from coevo.accounts.services import token_create
from coevo.campaigns.models import CampaignState, ProposerKind
from coevo.campaigns.services import campaign_create, campaign_start
from coevo.evaluations.ledger import BudgetLimits
from coevo.evaluations.models import Budget, LedgerEntry
from coevo.policies.models import EndpointKind, PolicyEndpoint
from coevo.policies.prices import model_price_create
from coevo.policies.services import policy_endpoint_api_key_set
from tests.support.provider_server import ProviderPolicy, ProviderServer

KEY = "sk-test-proposer-0123456789abcdefghijklmn"
MILLION = Decimal(1_000_000)
# Seven words: seven completion tokens as the provider server counts them (and three prompt).
ANSWER = "I think the prompt could be better."


@pytest.fixture
def hosted_proposer(db, settings):
    settings.COEVO_SECRETS_KEY = Fernet.generate_key().decode()
    with ProviderServer(ProviderPolicy(api_key=KEY, default=ANSWER, model="frontier")) as server:
        endpoint = PolicyEndpoint.objects.create(
            name="frontier", base_url=server.url, kind=EndpointKind.OPENAI
        )
        policy_endpoint_api_key_set(endpoint=endpoint, api_key=KEY, actor=None)
        model_price_create(
            endpoint=endpoint,
            model="frontier",
            input_per_m=Decimal(1000),
            cached_input_per_m=Decimal(500),
            output_per_m=Decimal(2000),
        )
        yield server


def test_a_hosted_proposers_dollars_are_in_the_ledger_and_the_campaign_stops_on_them(
    celery_worker_thread,
    client,
    owner,
    project,
    seed,
    suite,
    policy_version,
    scripted_policy,
    hosted_proposer,
):
    # The policy's endpoint has a price too: the seed's evaluation is the policy's spend.
    model_price_create(
        endpoint=policy_version.endpoint,
        model="",
        input_per_m=Decimal(1),
        cached_input_per_m=Decimal(1),
        output_per_m=Decimal(1),
    )
    per_draft = (3 * Decimal(1000) + 7 * Decimal(2000)) / MILLION  # $0.017
    campaign = campaign_create(
        project=project,
        name="hosted proposer",
        seed_candidate=seed,
        policy_version=policy_version,
        suite=suite,
        strategy=[
            {
                "kind": "llm-patch",
                "options": {"endpoint": "frontier", "model": "frontier", "answer_format": "text"},
            }
        ],
        max_proposals=6,
        # Two drafts pass it: the second is charged once written, the third never drafted.
        budget_limits=BudgetLimits(proposer_usd=Decimal("0.03")),
    )
    campaign_start(campaign=campaign)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        campaign.refresh_from_db()
        if campaign.is_final:
            break
        time.sleep(0.5)
    assert campaign.state == CampaignState.FINISHED, campaign.stop_reason
    assert campaign.stop_reason == "proposer dollar budget spent: $0.0340 of $0.0300"

    drafts = list(campaign.proposals.filter(kind=ProposerKind.LLM_PATCH).order_by("sequence"))
    assert len(drafts) == 2
    for draft in drafts:
        assert draft.proposer_cost_usd == per_draft
        assert draft.params["endpoint"] == "frontier"
        assert Decimal(draft.params["usage"]["cost"]["usd"]) == per_draft
    assert [r["path"] for r in hosted_proposer.policy.requests].count("/v1/completions") == 2
    assert all(h.get("Authorization") == f"Bearer {KEY}" for h in hosted_proposer.policy.headers)

    budget = Budget.objects.get(id=campaign.budget_id)
    assert budget.spent_proposer_usd == 2 * per_draft
    assert LedgerEntry.objects.filter(budget=budget, proposer_usd=per_draft).count() == 2
    # The policy's dollars (the seed's rollouts on the priced endpoint), apart from them.
    assert budget.spent_usd > 0 and budget.reserved_usd == 0

    client.force_login(owner)
    page = client.get(reverse("web:campaign", args=[project.slug, campaign.id])).content.decode()
    assert "proposer dollar budget spent: $0.0340 of $0.0300" in page
    assert '<tr class="spend-proposer-us"><td>proposer US$</td><td>0.034000</td>' in page
    assert f"<td>policy US$</td><td>{budget.spent_usd.quantize(Decimal('0.000001'))}</td>" in page

    _, raw = token_create(user=owner, name="read", kind="ci", scopes=["read"], created_by=owner)
    api = client.get(
        f"/api/v1/projects/{project.slug}/campaigns/{campaign.id}/",
        HTTP_AUTHORIZATION=f"Bearer {raw}",
    ).json()
    assert api["spend"]["proposer_usd"] == {"spent": "0.034", "reserved": "0", "limit": "0.03"}
    assert Decimal(api["spend"]["usd"]["spent"]) == budget.spent_usd
