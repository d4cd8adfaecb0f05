"""A campaign whose proposer (llm-patch, or the agentic proposer's program) runs on a
hosted-style endpoint (the local provider server: OpenAI's API or Anthropic's, its key
required, its usage reported) with a price: each draft's dollars are charged to the campaign's
ledger as proposer spend, shown on the campaign page and in the API beside the policy's, and
the campaign stops on its proposer dollar budget, saying so."""

from __future__ import annotations

from decimal import Decimal

import pytest
from cryptography.fernet import Fernet
from django.urls import reverse

from coevo.accounts.services import token_create
from coevo.campaigns.models import CampaignState, ProposalState, ProposerKind
from coevo.campaigns.services import campaign_create, campaign_start
from coevo.evaluations.ledger import BudgetLimits
from coevo.evaluations.models import Budget, LedgerEntry
from coevo.policies.models import EndpointKind, PolicyEndpoint
from coevo.policies.prices import model_price_create
from coevo.policies.services import policy_endpoint_api_key_set
from tests.campaigns.test_agentic_proposer import proposer_program
from tests.campaigns.test_alternating import wait_final
from tests.support.provider_server import ProviderPolicy, ProviderServer

KEY = "sk-test-proposer-0123456789abcdefghijklmn"
MILLION = Decimal(1_000_000)
# Seven words: seven completion tokens as the provider server counts them (and three prompt).
ANSWER = "I think the prompt could be better."


@pytest.fixture
def hosted_proposer(db, settings):
    settings.COEVO_SECRETS_KEY = Fernet.generate_key().decode()
    with ProviderServer(ProviderPolicy(api_key=KEY, default=ANSWER, model="frontier")) as server:
        hosted_endpoint(
            server,
            name="frontier",
            kind=EndpointKind.OPENAI,
            model="frontier",
            input_per_m=Decimal(1000),
            cached_input_per_m=Decimal(500),
            output_per_m=Decimal(2000),
        )
        yield server


def hosted_endpoint(server: ProviderServer, *, name: str, kind: str, model: str, **prices) -> None:
    """An endpoint of ``kind`` at the provider server, with its key and ``model``'s price."""
    endpoint = PolicyEndpoint.objects.create(name=name, base_url=server.url, kind=kind)
    policy_endpoint_api_key_set(endpoint=endpoint, api_key=KEY, actor=None)
    model_price_create(endpoint=endpoint, model=model, **prices)


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
    wait_final(campaign, timeout_s=120)
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


# An agentic proposer program (no dependencies) that works as a coding agent on a hosted model
# does: it offers the model a tool, runs the call it gets (setting the working copy's style),
# sends the tool's result back, and states the model's last word as its hypothesis.
TOOL_PROGRAM = """
import json, os, urllib.request

task = json.load(open(os.environ["COEVO_TASK_FILE"]))
record = open("/history/record.md").read()
tools = [{"type": "function", "function": {"name": "set_style", "description": "Set the style.",
          "parameters": {"type": "object", "properties": {"style": {"type": "string"}}}}}]
def chat(messages):
    body = {"model": "any", "messages": messages, "tools": tools, "max_tokens": 200}
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=json.dumps(body).encode(),
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    return json.load(urllib.request.urlopen(request))["choices"][0]
messages = [{"role": "user", "content": task["instruction"] + "\\n\\n" + record[-500:]}]
first = chat(messages)
assert first["finish_reason"] == "tool_calls", first
(call,) = first["message"]["tool_calls"]
style = json.loads(call["function"]["arguments"])["style"]
manifest = open("/app/harness.toml").read()
open("/app/harness.toml", "w").write(manifest.replace('default = "bad"', f'default = "{style}"'))
messages += [first["message"], {"role": "tool", "tool_call_id": call["id"], "content": "done"}]
said = chat(messages)["message"]["content"]
json.dump(said, open(os.environ["COEVO_ANSWER_FILE"], "w"))
"""


@pytest.fixture
def hosted_claude(db, settings):
    """An Anthropic-like provider as the proposer's endpoint, its key set, priced with prompt
    caching: each reply says it read 50 prompt tokens from the provider's cache and wrote 20."""
    settings.COEVO_SECRETS_KEY = Fernet.generate_key().decode()
    policy = ProviderPolicy(
        api_key=KEY,
        provider="anthropic",
        model="claude-test",
        tool_rules=[("Improve this LLM-agent harness", [("set_style", {"style": "good"})])],
        rules=[("done", "the good style answers right")],
    )
    policy.cached_tokens, policy.cache_write_tokens = 50, 20
    with ProviderServer(policy) as server:
        hosted_endpoint(
            server,
            name="frontier-claude",
            kind=EndpointKind.ANTHROPIC,
            model="claude-test",
            input_per_m=Decimal(1000),
            cached_input_per_m=Decimal(100),
            cache_write_per_m=Decimal(1250),
            output_per_m=Decimal(2000),
        )
        yield server


def test_an_agentic_proposer_on_a_hosted_model_has_its_dollars_in_the_ledger(
    celery_worker_thread,
    client,
    owner,
    project,
    tmp_path,
    seed,
    suite,
    policy_version,
    scripted_policy,
    hosted_claude,
):
    scripted_policy.rules.append(("style=good", "yes"))
    scripted_policy.default = "no"
    program = proposer_program(project, tmp_path, source=TOOL_PROGRAM)
    campaign = campaign_create(
        project=project,
        name="agentic on claude",
        seed_candidate=seed,
        policy_version=policy_version,
        suite=suite,
        strategy=[
            {
                "kind": "agentic",
                "options": {
                    "program": program.sha,
                    "endpoint": "frontier-claude",
                    "model": "claude-test",
                },
            }
        ],
        max_proposals=3,
        # One draft costs more than this: the campaign finishes before a second.
        budget_limits=BudgetLimits(proposer_usd=Decimal("0.01")),
    )
    campaign_start(campaign=campaign)
    wait_final(campaign, timeout_s=240)
    assert campaign.state == CampaignState.FINISHED, campaign.stop_reason

    (draft,) = campaign.proposals.filter(kind=ProposerKind.AGENTIC)
    assert draft.state == ProposalState.EVALUATED, (draft.stages, draft.state_detail)
    assert draft.params["endpoint"] == "frontier-claude" and draft.params["model_calls"] == 2
    assert draft.params["hypothesis"] == "the good style answers right"
    assert '+default = "good"' in draft.patch
    # Each of its two calls: the uncached prompt at the input price, 50 cache reads at the
    # cached-input price, 20 cache writes at the cache-write price, the reply at the output's.
    usage = draft.params["usage"]
    uncached = usage["prompt_tokens"] - 2 * (50 + 20)
    expected = (
        uncached * 1000 + 2 * 50 * 100 + 2 * 20 * 1250 + usage["completion_tokens"] * 2000
    ) / MILLION
    assert draft.proposer_cost_usd == expected > Decimal("0.01")
    assert campaign.stop_reason == f"proposer dollar budget spent: ${expected:.4f} of $0.0100"

    # The provider got Anthropic's Messages API with the endpoint's key, never the program's.
    requests = hosted_claude.policy.requests
    assert [r["path"] for r in requests] == ["/v1/messages"] * 2
    assert all(h["x-api-key"] == KEY for h in hosted_claude.policy.headers)
    assert requests[0]["tools"][0]["name"] == "set_style"
    assert requests[1]["messages"][-1]["content"][0]["type"] == "tool_result"

    budget = Budget.objects.get(id=campaign.budget_id)
    assert budget.spent_proposer_usd == expected
    assert LedgerEntry.objects.filter(budget=budget, proposer_usd=expected).count() == 1

    client.force_login(owner)
    page = client.get(reverse("web:campaign", args=[project.slug, campaign.id])).content.decode()
    shown = expected.quantize(Decimal("0.000001"))
    assert f'<tr class="spend-proposer-us"><td>proposer US$</td><td>{shown}</td>' in page
    _, raw = token_create(user=owner, name="read", kind="ci", scopes=["read"], created_by=owner)
    api = client.get(
        f"/api/v1/projects/{project.slug}/campaigns/{campaign.id}/",
        HTTP_AUTHORIZATION=f"Bearer {raw}",
    ).json()
    assert Decimal(api["spend"]["proposer_usd"]["spent"]) == expected
    assert api["spend"]["proposer_usd"]["limit"] == "0.01"
