"""Cost in money: a price table per endpoint and model (versioned, add-only), each call priced
at the row that applied when it was answered and recorded with it on its model-call step, the
cost summed per rollout and evaluation, shown on their pages and in the API, and dollars in the
ledger (reserved at the worst case, settled on the actual)."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from cryptography.fernet import Fernet
from django.urls import reverse
from django.utils import timezone

from coevo.accounts.services import token_create
from coevo.audit.models import AuditEvent
from coevo.errors import BudgetExceeded, InvalidInput
from coevo.evaluations.ledger import BudgetLimits
from coevo.evaluations.models import Budget, Evaluation, Rollout, TraceStep
from coevo.evaluations.services import evaluation_create
from coevo.policies.client import Sampling
from coevo.policies.models import EndpointKind, ModelPrice, PolicyEndpoint
from coevo.policies.prices import model_price_create, price_worst_per_token
from coevo.policies.services import (
    policy_client_for,
    policy_endpoint_api_key_set,
    policy_version_create,
)
from tests.campaigns.support import marked_suite, styled_seed
from tests.conftest import wait_until_final
from tests.support.provider_server import ProviderPolicy, ProviderServer

KEY = "sk-test-prices-0123456789abcdefghijklmnop"
MILLION = Decimal(1_000_000)


def price(endpoint, *, model="", inp="1.25", cached="0.125", out="10", at=None):
    return model_price_create(
        endpoint=endpoint,
        model=model,
        input_per_m=Decimal(inp),
        cached_input_per_m=Decimal(cached),
        output_per_m=Decimal(out),
        effective_from=at,
    )


@pytest.fixture
def provider(db, settings):
    settings.COEVO_SECRETS_KEY = Fernet.generate_key().decode()
    policy = ProviderPolicy(api_key=KEY, rules=[("capital", "Paris is the capital")])
    policy.cached_tokens = 2
    with ProviderServer(policy) as server:
        endpoint = PolicyEndpoint.objects.create(
            name="hosted", base_url=server.url, kind=EndpointKind.OPENAI
        )
        policy_endpoint_api_key_set(endpoint=endpoint, api_key=KEY, actor=None)
        version = policy_version_create(
            name="hosted", endpoint=endpoint, base_model="gpt-test", served_name="gpt-test"
        )
        yield server, endpoint, version


def api_get(client, user, path: str) -> dict:
    _, raw = token_create(user=user, name="read", kind="ci", scopes=["read"], created_by=user)
    return client.get(path, HTTP_AUTHORIZATION=f"Bearer {raw}").json()


def ask(version):
    with policy_client_for(version=version) as client:
        return client.chat([{"role": "user", "content": "capital?"}], Sampling(max_tokens=8))


def test_a_call_costs_its_tokens_at_the_price_that_applied_when_it_was_answered(provider):
    server, endpoint, version = provider
    first = price(endpoint)
    # A row for another model and one that starts tomorrow apply to none of these calls.
    price(endpoint, model="other-model", inp="99", out="99")
    price(endpoint, inp="50", out="50", at=timezone.now() + timedelta(days=1))

    completion = ask(version)
    # 3 prompt tokens, 2 of them from the provider's cache; 4 completion tokens.
    assert (completion.prompt_tokens, completion.cached_tokens) == (3, 2)
    assert completion.completion_tokens == 4
    expected = (1 * Decimal("1.25") + 2 * Decimal("0.125") + 4 * Decimal("10")) / MILLION
    assert completion.cost_usd == expected
    assert completion.price["id"] == first.id
    assert completion.price["output_per_m"] == "10.000000"

    # A new price from now on: the next call is charged it; the first keeps its own.
    second = price(endpoint, model="gpt-test", inp="2", cached="1", out="20")
    later = ask(version)
    assert later.price["id"] == second.id
    assert later.cost_usd == (1 * Decimal(2) + 2 * Decimal(1) + 4 * Decimal(20)) / MILLION
    assert completion.cost_usd == expected and completion.cost_record()["price"]["id"] == first.id


def test_an_endpoint_without_a_price_has_no_cost_not_a_zero_one(provider):
    _, _, version = provider
    completion = ask(version)
    assert completion.cost_usd is None and completion.cost_record() is None


def test_a_price_never_starts_in_the_past_nor_outside_its_bounds(provider):
    _, endpoint, _ = provider
    with pytest.raises(InvalidInput, match="cannot start in the past"):
        price(endpoint, at=timezone.now() - timedelta(hours=1))
    with pytest.raises(InvalidInput, match="output price must be between 0 and"):
        price(endpoint, out="-1")
    with pytest.raises(InvalidInput, match="input price must be between 0 and"):
        price(endpoint, inp="1000000")
    assert not ModelPrice.objects.exists()


def test_the_admin_adds_prices_audited_and_changes_none(client, operator, provider):
    _, endpoint, _ = provider
    client.force_login(operator)
    add = reverse("admin:policies_modelprice_add")
    form = {
        "endpoint": endpoint.id,
        "model": "gpt-test",
        "input_per_m": "1.5",
        "cached_input_per_m": "0.75",
        "output_per_m": "6",
        "note": "list price",
    }
    past = (timezone.now() - timedelta(days=1)).strftime("%Y-%m-%d %H:%M:%S")
    refused = client.post(add, {**form, "effective_from": past})
    assert refused.status_code == 200 and b"cannot start in the past" in refused.content
    assert not ModelPrice.objects.exists()

    assert client.post(add, form).status_code == 302
    row = ModelPrice.objects.get()
    assert (row.input_per_m, row.output_per_m) == (Decimal("1.5"), Decimal(6))
    event = AuditEvent.objects.get(action="modelprice.created")
    assert Decimal(event.after["output_per_m"]) == 6

    change = reverse("admin:policies_modelprice_change", args=[row.id])
    page = client.get(change)
    assert page.status_code == 200 and b'name="output_per_m"' not in page.content
    client.post(change, {**form, "output_per_m": "0"})
    row.refresh_from_db()
    assert row.output_per_m == Decimal(6)
    delete = reverse("admin:policies_modelprice_delete", args=[row.id])
    assert client.post(delete, {"post": "yes"}).status_code == 403
    assert ModelPrice.objects.count() == 1


@pytest.fixture
def priced_policy(policy_version):
    """The scripted policy's endpoint at $1 input / $0.5 cached / $2 output per million."""
    return price(policy_version.endpoint, inp="1", cached="0.5", out="2")


def test_a_rollouts_calls_are_priced_in_its_trace_summed_settled_and_shown(
    celery_worker_thread, client, owner, project, tmp_path, policy_version, priced_policy
):
    seed, suite = styled_seed(project, tmp_path), marked_suite(project)
    # The manifest's max_tokens is 100: the worst case is 100 tokens at $2 per million each.
    unit = 100 * Decimal(2) / MILLION
    with pytest.raises(BudgetExceeded, match=r"needs \$0\.0008 in policy calls"):
        evaluation_create(
            candidate=seed, suite=suite, split="search", policy_version=policy_version,
            budget_limits=BudgetLimits(usd=unit * 4 - Decimal("0.000001")),
        )  # fmt: skip
    assert not Evaluation.objects.exists()

    evaluation = evaluation_create(
        candidate=seed, suite=suite, split="search", policy_version=policy_version,
        budget_limits=BudgetLimits(usd=unit * 4),
    )  # fmt: skip
    budget = Budget.objects.get(evaluation=evaluation)
    assert budget.reserved_usd == unit * 4 and budget.unit_usd == unit
    wait_until_final(evaluation)

    rollouts = list(Rollout.objects.filter(evaluation=evaluation))
    assert len(rollouts) == 4
    for rollout in rollouts:
        (step,) = TraceStep.objects.filter(rollout=rollout, kind="model_call")
        cost = step.payload["cost"]
        assert cost["price"]["id"] == priced_policy.id
        assert (
            Decimal(cost["usd"])
            == (step.prompt_tokens * Decimal(1) + step.completion_tokens * Decimal(2)) / MILLION
        )
        assert rollout.cost_usd == Decimal(cost["usd"]) > 0
    total = sum((r.cost_usd for r in rollouts), Decimal(0))
    budget.refresh_from_db()
    assert (budget.reserved_usd, budget.spent_usd) == (0, total)

    # A later price change re-prices nothing that was made.
    price(policy_version.endpoint, inp="100", cached="100", out="100")
    rollout = Rollout.objects.get(id=rollouts[0].id)
    assert rollout.cost_usd == rollouts[0].cost_usd

    api = api_get(client, owner, f"/api/v1/projects/{project.slug}/evaluations/{evaluation.id}/")
    assert Decimal(api["cost_usd"]) == total
    client.force_login(owner)
    page = client.get(reverse("web:evaluation", args=[project.slug, evaluation.id]))
    assert f"cost ${total:,.6f}" in page.content.decode()
    page = client.get(reverse("web:rollout", args=[project.slug, rollout.id])).content.decode()
    assert f"${rollout.cost_usd:,.6f}" in page
    assert f"price row {priced_policy.id}" in page


def test_a_rollout_on_an_unpriced_endpoint_shows_no_cost(
    celery_worker_thread, client, owner, project, tmp_path, policy_version
):
    seed, suite = styled_seed(project, tmp_path), marked_suite(project)
    evaluation = evaluation_create(
        candidate=seed, suite=suite, split="search", policy_version=policy_version, task_limit=1
    )
    wait_until_final(evaluation)
    rollout = Rollout.objects.get(evaluation=evaluation)
    assert rollout.cost_usd is None and rollout.model_calls == 1
    assert Budget.objects.get(evaluation=evaluation).spent_usd == 0
    api = api_get(client, owner, f"/api/v1/projects/{project.slug}/evaluations/{evaluation.id}/")
    assert api["cost_usd"] is None
    client.force_login(owner)
    page = client.get(reverse("web:rollout", args=[project.slug, rollout.id])).content.decode()
    assert '<dd class="rollout-cost">—</dd>' in page


@pytest.fixture
def anthropic_provider(db, settings):
    """An Anthropic-like provider whose every reply says it read 100 prompt tokens from its
    prompt cache and wrote 40 to it (besides the uncached input it counts)."""
    settings.COEVO_SECRETS_KEY = Fernet.generate_key().decode()
    policy = ProviderPolicy(
        api_key=KEY, provider="anthropic", model="claude-test", rules=[("capital", "Paris")]
    )
    policy.cached_tokens, policy.cache_write_tokens = 100, 40
    with ProviderServer(policy) as server:
        endpoint = PolicyEndpoint.objects.create(
            name="anthropic", base_url=server.url, kind=EndpointKind.ANTHROPIC
        )
        policy_endpoint_api_key_set(endpoint=endpoint, api_key=KEY, actor=None)
        version = policy_version_create(
            name="claude", endpoint=endpoint, base_model="claude-test", served_name="claude-test"
        )
        yield endpoint, version


def test_anthropic_cache_reads_and_writes_are_each_charged_their_own_price(anthropic_provider):
    endpoint, version = anthropic_provider
    row = model_price_create(
        endpoint=endpoint,
        model="claude-test",
        input_per_m=Decimal(3),
        cached_input_per_m=Decimal("0.3"),
        cache_write_per_m=Decimal("3.75"),
        output_per_m=Decimal(15),
    )

    completion = ask(version)

    # 4 uncached input tokens (the words of the request's last content, as the provider server
    # counts), 100 read from the cache, 40 written to it; 1 output token ("Paris").
    assert (completion.prompt_tokens, completion.completion_tokens) == (144, 1)
    assert (completion.cached_tokens, completion.cache_write_tokens) == (100, 40)
    expected = (4 * 3 + 100 * Decimal("0.3") + 40 * Decimal("3.75") + 1 * 15) / MILLION
    assert completion.cost_usd == expected
    record = completion.cost_record()
    assert (record["cached_tokens"], record["cache_write_tokens"]) == (100, 40)
    assert record["price"]["id"] == row.id and record["price"]["cache_write_per_m"] == "3.750000"
    # The provider's own counts stay in the reply (what a harness behind the boundary reads).
    usage = completion.raw["usage"]
    assert (usage["cache_read_input_tokens"], usage["cache_creation_input_tokens"]) == (100, 40)


def test_a_price_without_a_cache_write_price_charges_cache_writes_as_input(anthropic_provider):
    endpoint, version = anthropic_provider
    price(endpoint, inp="3", cached="0.3", out="15")

    completion = ask(version)

    expected = ((4 + 40) * 3 + 100 * Decimal("0.3") + 1 * 15) / MILLION
    assert completion.cost_usd == expected
    assert completion.price["cache_write_per_m"] is None
    assert completion.cache_write_tokens == 40


def test_the_worst_case_counts_a_dearer_cache_write_price(anthropic_provider):
    endpoint, version = anthropic_provider
    model_price_create(
        endpoint=endpoint,
        model="",
        input_per_m=Decimal(3),
        cached_input_per_m=Decimal("0.3"),
        cache_write_per_m=Decimal(30),
        output_per_m=Decimal(15),
    )
    assert price_worst_per_token(version=version) == Decimal(30) / MILLION
    with pytest.raises(InvalidInput, match="cache write price must be between 0 and"):
        model_price_create(
            endpoint=endpoint,
            model="claude-test",
            input_per_m=Decimal(3),
            cached_input_per_m=Decimal("0.3"),
            cache_write_per_m=Decimal(-1),
            output_per_m=Decimal(15),
        )


def test_the_admin_takes_a_cache_write_price_or_leaves_it_to_the_input_price(
    client, operator, anthropic_provider
):
    endpoint, _ = anthropic_provider
    client.force_login(operator)
    add = reverse("admin:policies_modelprice_add")
    form = {
        "endpoint": endpoint.id,
        "input_per_m": "3",
        "cached_input_per_m": "0.3",
        "output_per_m": "15",
    }

    assert client.post(add, {**form, "model": "claude-test", "cache_write_per_m": "3.75"}).status_code == 302  # fmt: skip
    assert client.post(add, {**form, "model": "other", "cache_write_per_m": ""}).status_code == 302
    refused = client.post(add, {**form, "model": "third", "cache_write_per_m": "-1"})

    assert b"cache write price must be between 0 and" in refused.content
    rows = dict(ModelPrice.objects.values_list("model", "cache_write_per_m"))
    assert rows == {"claude-test": Decimal("3.75"), "other": None}
    audited = {
        e.after["model"]: e.after["cache_write_per_m"]
        for e in AuditEvent.objects.filter(action="modelprice.created")
    }
    assert Decimal(audited["claude-test"]) == Decimal("3.75") and audited["other"] is None
