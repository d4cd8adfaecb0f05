"""Hosted endpoints (OpenAI's API, Anthropic's, OpenAI-compatible providers) against a local
server that behaves like the provider (tests/support/provider_server.py): the key in the
provider's header, only the parameters the provider takes, rate limits waited out; and the
key itself encrypted at rest, write-only in the admin, audited when set, rotated or revoked."""

from __future__ import annotations

import json
import time

import pytest
from cryptography.fernet import Fernet
from django.urls import reverse

from coevo.audit.models import AuditEvent
from coevo.errors import PolicyRequestRejected, PolicyUnavailable
from coevo.policies.client import Sampling
from coevo.policies.models import EndpointKind, PolicyEndpoint
from coevo.policies.secrets import SecretsKeyMissing, SecretUnreadable
from coevo.policies.services import (
    policy_client_for,
    policy_endpoint_api_key_revoke,
    policy_endpoint_api_key_set,
    policy_endpoints_check,
    policy_version_create,
)
from tests.support.provider_server import ProviderPolicy, ProviderServer

KEY = "sk-test-0123456789abcdefghijklmnopqrstuvwxyz"
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "capital?"}]


@pytest.fixture
def secrets_key(settings):
    settings.COEVO_SECRETS_KEY = Fernet.generate_key().decode()
    settings.COEVO_POLICY_RETRIES = 2
    return settings.COEVO_SECRETS_KEY


def hosted(db, url: str, kind: str, *, key: str | None = KEY):
    endpoint = PolicyEndpoint.objects.create(name=f"hosted-{kind}", base_url=url, kind=kind)
    if key:
        policy_endpoint_api_key_set(endpoint=endpoint, api_key=key, actor=None)
    return policy_version_create(
        name=f"v-{kind}", endpoint=endpoint, base_model="gpt-test", served_name="gpt-test"
    )


@pytest.fixture
def openai_provider():
    with ProviderServer(ProviderPolicy(api_key=KEY, rules=[("capital", "Paris")])) as server:
        yield server


@pytest.fixture
def anthropic_provider():
    policy = ProviderPolicy(api_key=KEY, provider="anthropic", rules=[("capital", "Paris")])
    with ProviderServer(policy) as server:
        yield server


@pytest.mark.parametrize("kind", [EndpointKind.OPENAI, EndpointKind.OPENAI_COMPATIBLE])
def test_an_openai_kind_sends_its_key_as_bearer_and_only_what_the_provider_takes(
    db, secrets_key, openai_provider, kind
):
    version = hosted(db, openai_provider.url, kind)

    with policy_client_for(version=version) as client:
        chat = client.chat(CHAT, Sampling(max_tokens=16, seed=1))
        completion = client.complete("capital?", Sampling(max_tokens=16))
        # What a program harness may send through the boundary: vLLM's extension included.
        forwarded = client.forward(
            "chat", {"messages": CHAT, "max_tokens": 8, "return_token_ids": True}
        )

    assert (chat.text, completion.text, forwarded.text) == ("Paris", "Paris", "Paris")
    assert forwarded.dropped == ("return_token_ids",)
    headers = openai_provider.policy.headers
    assert all(h["Authorization"] == f"Bearer {KEY}" for h in headers)
    first = openai_provider.policy.requests[0]
    if kind == EndpointKind.OPENAI:
        assert first["max_completion_tokens"] == 16 and "max_tokens" not in first
    else:
        assert first["max_tokens"] == 16


def test_the_anthropic_kind_speaks_messages_with_its_key_and_version(
    db, secrets_key, anthropic_provider
):
    version = hosted(db, anthropic_provider.url, EndpointKind.ANTHROPIC)

    with policy_client_for(version=version) as client:
        chat = client.chat(CHAT, Sampling(max_tokens=16, temperature=0.5, stop=("\n",), seed=4))

    assert chat.text == "Paris" and chat.finish_reason == "stop"
    # Its usage's input and output tokens (the local server counts the words it got).
    assert (chat.prompt_tokens, chat.completion_tokens) == (4, 1)
    (request,) = anthropic_provider.policy.requests
    assert request == {
        "path": "/v1/messages",
        "model": "gpt-test",
        "system": "Be brief.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "capital?"}]}],
        "max_tokens": 16,
        "temperature": 0.5,
        "stop_sequences": ["\n"],
        "stream": False,
    }
    (headers,) = anthropic_provider.policy.headers
    assert headers["x-api-key"] == KEY and headers["anthropic-version"] == "2023-06-01"
    assert "Authorization" not in headers
    # Its seed and penalties are not Anthropic's: left out, and recorded as left out.
    assert set(chat.dropped) == {"seed", "frequency_penalty", "presence_penalty"}
    assert chat.sampling == {"max_tokens": 16, "temperature": 0.5, "stop_sequences": ["\n"]}


def test_the_anthropic_kind_refuses_what_its_api_cannot_do_before_sending(
    db, secrets_key, anthropic_provider
):
    version = hosted(db, anthropic_provider.url, EndpointKind.ANTHROPIC)

    with policy_client_for(version=version) as client:
        with pytest.raises(PolicyRequestRejected, match="no completions"):
            client.complete("x", Sampling())
        with pytest.raises(PolicyRequestRejected, match="n = 1"):
            client.forward("chat", {"messages": CHAT, "max_tokens": 4, "n": 2})

    assert anthropic_provider.policy.requests == []


ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two numbers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "number"}}},
    },
}


def test_the_anthropic_kind_round_trips_parallel_tool_calls_as_anthropics_blocks(
    db, secrets_key, anthropic_provider
):
    anthropic_provider.policy.tool_rules = [
        ("add them", [("add", {"a": 2, "b": 3}), ("add", {"a": 4, "b": 5})])
    ]
    anthropic_provider.policy.rules = [("9", "5 and 9")]
    version = hosted(db, anthropic_provider.url, EndpointKind.ANTHROPIC)
    asked = [{"role": "user", "content": "add them"}]
    tools = {"tools": [ADD], "tool_choice": "auto", "max_tokens": 32}

    with policy_client_for(version=version) as client:
        first = client.forward("chat", {"messages": asked, **tools})
        calls = first.raw["choices"][0]["message"]["tool_calls"]
        results = [
            {"role": "tool", "tool_call_id": call["id"], "content": str(total)}
            for call, total in zip(calls, (5, 9), strict=True)
        ]
        said = first.raw["choices"][0]["message"]
        second = client.forward("chat", {"messages": [*asked, said, *results], **tools})

    assert first.finish_reason == "tool_calls"
    assert [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("toolu_000", "add", {"a": 2, "b": 3}),
        ("toolu_001", "add", {"a": 4, "b": 5}),
    ]  # fmt: skip
    assert (second.text, second.finish_reason) == ("5 and 9", "stop")
    sent_first, sent_second = anthropic_provider.policy.requests
    assert sent_first["tools"] == [
        {
            "name": "add",
            "input_schema": {"type": "object", "properties": {"a": {"type": "number"}}},
            "description": "Add two numbers.",
        }
    ]
    assert sent_first["tool_choice"] == {"type": "auto"}
    # Both results in the one user turn after the calls, as Anthropic requires (the provider
    # server refuses a tool_use left without its tool_result in the next message).
    assert sent_second["messages"][1:] == [
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "toolu_000", "name": "add", "input": {"a": 2, "b": 3}},
                {"type": "tool_use", "id": "toolu_001", "name": "add", "input": {"a": 4, "b": 5}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_000", "content": "5"},
                {"type": "tool_result", "tool_use_id": "toolu_001", "content": "9"},
            ],
        },
    ]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"parameters": {"type": "array"}},
            "tools.0.custom.input_schema.type: Input should be 'object'",
        ),
        ({"name": "read file"}, "tools.0.custom.name: String should match pattern"),
    ],
)
def test_a_tool_anthropic_refuses_is_the_requests_fault_in_its_own_words(
    db, secrets_key, anthropic_provider, change, message
):
    version = hosted(db, anthropic_provider.url, EndpointKind.ANTHROPIC)
    tool = {"type": "function", "function": {**ADD["function"], **change}}

    with (
        policy_client_for(version=version) as client,
        pytest.raises(PolicyRequestRejected) as caught,
    ):
        client.forward("chat", {"messages": CHAT, "tools": [tool], "max_tokens": 8})

    assert caught.value.status == 400
    error = json.loads(caught.value.reply)
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert message in error["error"]["message"]
    assert len(anthropic_provider.policy.requests) == 1  # the request's fault: not retried
    version.endpoint.refresh_from_db()
    assert version.endpoint.healthy


def test_a_provider_that_refuses_the_key_is_an_infra_error_and_the_probe_says_so(
    db, secrets_key, openai_provider
):
    version = hosted(db, openai_provider.url, EndpointKind.OPENAI, key=None)

    with policy_client_for(version=version) as client, pytest.raises(PolicyUnavailable) as caught:
        client.chat(CHAT, Sampling())

    assert not isinstance(caught.value, PolicyRequestRejected)
    assert "Set the endpoint's API key" in str(caught.value)
    assert len(openai_provider.policy.requests) == 1  # not retried
    # With its key set, the beat check and the next request go through.
    policy_endpoint_api_key_set(endpoint=version.endpoint, api_key=KEY, actor=None)
    assert policy_endpoints_check() == {version.endpoint.name: True}
    with policy_client_for(version=version) as client:
        assert client.chat(CHAT, Sampling()).text == "Paris"


def test_a_rate_limit_is_waited_out_as_retry_after_asks(db, secrets_key, openai_provider):
    openai_provider.policy.rate_limit_next = 1
    openai_provider.policy.retry_after = "1"
    version = hosted(db, openai_provider.url, EndpointKind.OPENAI)

    started = time.monotonic()
    with policy_client_for(version=version) as client:
        reply = client.chat(CHAT, Sampling())
    waited = time.monotonic() - started

    assert reply.text == "Paris"
    assert len(openai_provider.policy.requests) == 2
    assert 1.0 <= waited < 5  # the client's own backoff (0.5 s) was stretched to Retry-After
    version.endpoint.refresh_from_db()
    assert version.endpoint.healthy and version.endpoint.consecutive_failures == 0


def test_a_rate_limit_that_outlasts_the_retries_is_capacity_not_an_outage(
    db, secrets_key, openai_provider, settings
):
    settings.COEVO_POLICY_RETRIES = 1
    openai_provider.policy.rate_limit_next = 10
    openai_provider.policy.retry_after = "0"
    version = hosted(db, openai_provider.url, EndpointKind.OPENAI)

    with policy_client_for(version=version) as client, pytest.raises(PolicyUnavailable) as caught:
        client.chat(CHAT, Sampling())

    assert not caught.value.endpoint_down  # an infra_error; the endpoint is not marked down
    assert "rate-limited (HTTP 429)" in str(caught.value)
    version.endpoint.refresh_from_db()
    assert version.endpoint.healthy


def test_a_key_a_provider_quotes_back_is_taken_out_of_the_error(db, secrets_key, openai_provider):
    openai_provider.policy.api_key = "another-key-entirely"
    openai_provider.policy.echo_key_in_errors = True
    version = hosted(db, openai_provider.url, EndpointKind.OPENAI)

    with policy_client_for(version=version) as client, pytest.raises(PolicyUnavailable) as caught:
        client.chat(CHAT, Sampling())

    assert KEY not in str(caught.value) and "[api key]" in str(caught.value)


# --- the key at rest ---------------------------------------------------------------------


def test_the_key_is_stored_encrypted_and_each_change_is_audited_without_it(db, secrets_key):
    endpoint = PolicyEndpoint.objects.create(
        name="openai", base_url="https://api.openai.invalid/v1", kind=EndpointKind.OPENAI
    )

    policy_endpoint_api_key_set(endpoint=endpoint, api_key=KEY, actor=None)
    stored = PolicyEndpoint.objects.values_list("api_key_encrypted", flat=True).get()
    policy_endpoint_api_key_set(endpoint=endpoint, api_key=KEY + "2", actor=None)
    assert policy_endpoint_api_key_revoke(endpoint=endpoint, actor=None)
    assert not policy_endpoint_api_key_revoke(endpoint=endpoint, actor=None)

    assert KEY not in stored and Fernet(secrets_key).decrypt(stored.encode()).decode() == KEY
    events = sorted(AuditEvent.objects.values_list("action", "before", "after"))
    assert events == [
        ("policyendpoint.api_key_revoked", {"api_key": "set"}, {"api_key": "not set"}),
        ("policyendpoint.api_key_rotated", {"api_key": "set"}, {"api_key": "set"}),
        ("policyendpoint.api_key_set", {"api_key": "not set"}, {"api_key": "set"}),
    ]
    assert not PolicyEndpoint.objects.get().has_api_key


def test_no_key_is_stored_without_the_operators_secrets_key(db, settings):
    settings.COEVO_SECRETS_KEY = ""
    endpoint = PolicyEndpoint.objects.create(
        name="openai", base_url="https://api.openai.invalid/v1", kind=EndpointKind.OPENAI
    )

    with pytest.raises(SecretsKeyMissing, match="COEVO_SECRETS_KEY"):
        policy_endpoint_api_key_set(endpoint=endpoint, api_key=KEY, actor=None)
    assert not PolicyEndpoint.objects.get().has_api_key


def test_a_secrets_key_taken_out_of_the_setting_leaves_the_key_unreadable(
    db, secrets_key, settings, openai_provider
):
    version = hosted(db, openai_provider.url, EndpointKind.OPENAI)
    new = Fernet.generate_key().decode()

    settings.COEVO_SECRETS_KEY = f"{new},{secrets_key}"  # rotation: the old key still decrypts
    with policy_client_for(version=version) as client:
        assert client.chat(CHAT, Sampling()).text == "Paris"
    settings.COEVO_SECRETS_KEY = new
    with pytest.raises(SecretUnreadable, match="set the endpoint's API key again"):
        policy_client_for(version=version)


@pytest.mark.parametrize("bad", ["", "a b", "key\r\nX-Evil: 1", "k" * 1001])
def test_it_refuses_a_key_that_cannot_go_in_a_header(db, secrets_key, bad):
    endpoint = PolicyEndpoint.objects.create(
        name="openai", base_url="https://api.openai.invalid/v1", kind=EndpointKind.OPENAI
    )
    from coevo.errors import InvalidInput

    with pytest.raises(InvalidInput):
        policy_endpoint_api_key_set(endpoint=endpoint, api_key=bad, actor=None)


def test_the_admin_takes_a_key_and_never_shows_it_again(client, operator, secrets_key):
    client.force_login(operator)
    endpoint = PolicyEndpoint.objects.create(
        name="openai", base_url="https://api.openai.invalid/v1", kind=EndpointKind.OPENAI
    )
    url = reverse("admin:policies_policyendpoint_change", args=[endpoint.id])
    form = {
        "name": "openai",
        "base_url": endpoint.base_url,
        "kind": "openai",
        "max_concurrency": 4,
    }

    assert "not set" in client.get(url).content.decode()
    saved = client.post(url, {**form, "api_key": KEY})
    assert saved.status_code == 302, saved.content[:800]
    page = client.get(url).content.decode()
    kept = client.post(url, {**form, "max_concurrency": 8})  # no key typed: the key stays
    revoked = client.post(url, {**form, "max_concurrency": 8, "revoke_api_key": "on"})

    assert KEY not in page and ">set" in page
    assert kept.status_code == 302 and revoked.status_code == 302
    endpoint.refresh_from_db()
    assert not endpoint.has_api_key and endpoint.max_concurrency == 8
    actions = set(AuditEvent.objects.values_list("action", flat=True))
    assert "policyendpoint.api_key_set" in actions and "policyendpoint.api_key_revoked" in actions
    for event in AuditEvent.objects.all():
        assert KEY not in str(event.before) + str(event.after)
