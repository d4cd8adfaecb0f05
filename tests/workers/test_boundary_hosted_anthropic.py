"""Tool calls between a program harness and a hosted Anthropic model: the harness speaks
Anthropic's Messages API (the unmodified ``anthropic`` SDK) or OpenAI's chat API (the ``openai``
SDK) to its model boundary, and the policy is an endpoint of kind ``anthropic``, here a local
server that behaves like Anthropic's API (tests/support/provider_server.py: it requires its key
and version header, answers ``tool_use`` blocks with stop_reason "tool_use", and refuses a bad
tool schema or a ``tool_use`` left without its ``tool_result`` in Anthropic's error shape).
Real sandbox, real boundary, the real policy client; each call priced at the endpoint's price."""

from __future__ import annotations

import json
import textwrap
from datetime import UTC, datetime
from decimal import Decimal

import httpx
import pytest

from coevo.policies.client import PolicyClient
from coevo.policies.pricing import Price, PriceSchedule
from tests.support.provider_server import ProviderPolicy, ProviderServer
from tests.workers.test_boundary_anthropic import ADD_TOOL, sdk_program
from tests.workers.test_program_harness import program, steps
from workers.environments.base import Verdict
from workers.outcomes import RolloutOutcome
from workers.rollout import RolloutInputs, execute_rollout

KEY = "sk-ant-test-0123456789abcdefghijklmnop"
MILLION = Decimal(1_000_000)
PRICE = Price(
    id=7,
    model="",
    effective_from=datetime(2026, 1, 1, tzinfo=UTC),
    input_per_m=Decimal(3),
    cached_input_per_m=Decimal("0.3"),
    cache_write_per_m=Decimal("3.75"),
    output_per_m=Decimal(15),
)


@pytest.fixture
def provider():
    policy = ProviderPolicy(api_key=KEY, provider="anthropic", model="claude-test")
    with ProviderServer(policy) as server:
        yield server


def hosted_rollout(harness, provider: ProviderServer, *, kind: str = "anthropic"):
    inputs = RolloutInputs(
        harness_dir=harness,
        task_key="q1",
        task_view={"question": "add 2 and 3"},
        knob_overrides={},
        seed=11,
        wall_time_s=60,
        policy_version="claude",
    )
    client = PolicyClient(
        provider.url,
        model="claude-test",
        retries=0,
        kind=kind,
        api_key=KEY,
        prices=PriceSchedule((PRICE,)),
    )
    with client:
        return execute_rollout(
            inputs, policy=client, verify=lambda answer: Verdict(passed=True, score=1.0, detail="")
        )


def test_the_anthropic_sdk_round_trips_a_tool_use_with_a_hosted_anthropic_model(tmp_path, provider):
    provider.policy.tool_rules = [("add 2 and 3", [("add", {"a": 2, "b": 3})])]
    provider.policy.rules = [("5", "the sum is 5")]
    provider.policy.cached_tokens, provider.policy.cache_write_tokens = 20, 10
    harness = sdk_program(
        tmp_path,
        f"""
        tools = [{ADD_TOOL!r}]
        messages = [{{"role": "user", "content": task["question"]}}]
        first = client.messages.create(model="claude-x", max_tokens=64, tools=tools,
                                       messages=messages)
        (use,) = [b for b in first.content if b.type == "tool_use"]
        messages += [
            {{"role": "assistant", "content": first.content}},
            {{"role": "user", "content": [{{"type": "tool_result", "tool_use_id": use.id,
                                          "content": str(use.input["a"] + use.input["b"])}}]}},
        ]
        second = client.messages.create(model="claude-x", max_tokens=64, tools=tools,
                                        messages=messages)
        try:
            client.messages.create(model="claude-x", max_tokens=8, messages=messages,
                                   tools=[dict(tools[0], input_schema={{"type": "array"}})])
            refused = None
        except anthropic.BadRequestError as exc:
            refused = [exc.status_code, exc.body["error"]["type"], exc.body["error"]["message"]]
        answer({{"first": [first.stop_reason, use.id, use.name, use.input],
                "second": [second.stop_reason, second.content[0].text], "refused": refused}})
        """,
    )

    result = hosted_rollout(harness, provider)

    assert result.outcome == RolloutOutcome.PASSED, result.detail
    answer = result.answer
    assert answer["first"] == ["tool_use", "toolu_000", "add", {"a": 2, "b": 3}]
    assert answer["second"] == ["end_turn", "the sum is 5"]
    # The provider's refusal reaches the program as Anthropic's error, in the provider's words,
    # without the provider's address.
    status, kind, message = answer["refused"]
    assert (status, kind) == (400, "invalid_request_error")
    assert "tools.0.custom.input_schema.type: Input should be 'object'" in message
    assert f":{provider.port}" not in message and KEY not in message

    requests = provider.policy.requests
    assert [r["path"] for r in requests] == ["/v1/messages"] * 3
    assert all(h["x-api-key"] == KEY and h["anthropic-version"] for h in provider.policy.headers)
    assert requests[0]["tools"] == [
        {
            "name": "add",
            "input_schema": ADD_TOOL["input_schema"],
            "description": "Add two numbers.",
        }
    ]
    # The tool use went back to the provider as it came, its result in the next user turn.
    assert requests[1]["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "add 2 and 3"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "toolu_000", "name": "add", "input": {"a": 2, "b": 3}}
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_000", "content": "5"}],
        },
    ]

    first, second, third = sorted(steps(result, "model_call"), key=lambda c: c["call"])
    assert first["tool_calls"][0]["id"] == "toolu_000" and first["finish_reason"] == "tool_calls"
    assert "tools.0.custom.input_schema.type" in third["rejected"] and "cost" not in third
    for call in (first, second):
        cost = call["cost"]
        assert (cost["cached_tokens"], cost["cache_write_tokens"]) == (20, 10)
        assert cost["price"]["id"] == PRICE.id
    prompt = [s.prompt_tokens for s in result.steps if s.kind == "model_call"][:2]
    completion = [s.completion_tokens for s in result.steps if s.kind == "model_call"][:2]
    expected = sum(
        (
            (p - 30) * PRICE.input_per_m + 20 * Decimal("0.3") + 10 * Decimal("3.75") + c * 15
            for p, c in zip(prompt, completion, strict=True)
        ),
        Decimal(0),
    )
    assert result.cost_usd == expected / MILLION


OPENAI_AGENT = """
import json, os
from openai import OpenAI

client = OpenAI(max_retries=0)  # OPENAI_BASE_URL and OPENAI_API_KEY: the boundary's
tools = [{"type": "function", "function": {
    "name": "add", "description": "Add two numbers.", "parameters": {"type": "object",
    "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}]
messages = [{"role": "user", "content": "add them: 2 and 3, 4 and 5"}]
first = client.chat.completions.create(model="gpt-4o", messages=messages, tools=tools,
                                       tool_choice="auto", max_tokens=64)
said = first.choices[0].message
messages.append(said.model_dump(exclude_none=True))
for call in said.tool_calls:
    arguments = json.loads(call.function.arguments)
    messages.append({"role": "tool", "tool_call_id": call.id,
                     "content": str(arguments["a"] + arguments["b"])})
chunks = client.chat.completions.create(model="gpt-4o", messages=messages, tools=tools,
                                        max_tokens=64, stream=True)
final = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
json.dump({"first": [first.choices[0].finish_reason,
                     [(c.id, c.function.name) for c in said.tool_calls]], "final": final},
          open(os.environ["COEVO_ANSWER_FILE"], "w"))
"""


def test_an_openai_sdk_program_calls_tools_of_a_hosted_anthropic_model(tmp_path, provider):
    """The program's chat request becomes a Messages request, the tool_use blocks come back as
    tool_calls, and its two tool messages go back as one user turn of tool_result blocks (the
    provider refuses a tool_use left without its result in the next message)."""
    provider.policy.tool_rules = [("add them", [("add", {"a": 2, "b": 3}), ("add", {"a": 4, "b": 5})])]  # fmt: skip
    provider.policy.rules = [("9", "5 and 9")]
    harness = program(tmp_path, {"agent.py": textwrap.dedent(OPENAI_AGENT)}, command='["python3", "agent.py"]')  # fmt: skip

    result = hosted_rollout(harness, provider)

    assert result.answer == {
        "first": ["tool_calls", [["toolu_000", "add"], ["toolu_001", "add"]]],
        "final": "5 and 9",
    }, result.detail
    first, second = provider.policy.requests
    assert first["tool_choice"] == {"type": "auto"}
    assert first["tools"][0]["input_schema"]["properties"] == {
        "a": {"type": "number"},
        "b": {"type": "number"},
    }
    assert second["messages"][-1] == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_000", "content": "5"},
            {"type": "tool_result", "tool_use_id": "toolu_001", "content": "9"},
        ],
    }
    assert "stream" not in second or second["stream"] is False  # the boundary streams it back
    calls = sorted(steps(result, "model_call"), key=lambda c: c["call"])
    assert [c["finish_reason"] for c in calls] == ["tool_calls", "stop"]
    assert (calls[1]["parent"], calls[1]["relation"]) == (0, "continues")
    assert result.cost_usd is not None and result.cost_usd > 0


# A system prompt as long as a coding agent's: Anthropic caches a prefix of at least 1024 tokens.
LONG_SYSTEM = " ".join(f"Rule {i}: keep the change small." for i in range(300))


def test_a_marked_system_prompt_is_written_to_anthropics_cache_then_read_and_priced_so(
    tmp_path, provider
):
    """The anthropic SDK marks its long system prompt for Anthropic's prompt cache and asks
    twice: the marker reaches the provider, which writes the prefix to its cache the first time
    and reads it the second; the program sees Anthropic's cache usage, and each call is priced
    at the cache-write, then the cached-input price."""
    harness = sdk_program(
        tmp_path,
        f"""
        system = [{{"type": "text", "text": {LONG_SYSTEM!r},
                    "cache_control": {{"type": "ephemeral"}}}}]
        usages = []
        for question in ("what is 2 + 3?", "what is 4 + 5?"):
            reply = client.messages.create(model="claude-x", max_tokens=16, system=system,
                                           messages=[{{"role": "user", "content": question}}])
            u = reply.usage
            usages.append([u.input_tokens, u.cache_creation_input_tokens,
                           u.cache_read_input_tokens])
        answer(usages)
        """,
    )

    result = hosted_rollout(harness, provider)

    assert result.outcome == RolloutOutcome.PASSED, result.detail
    cached = len(LONG_SYSTEM.split())  # the provider counts a text block's words
    first, second = provider.policy.requests
    for request in (first, second):
        assert request["system"] == [
            {"type": "text", "text": LONG_SYSTEM, "cache_control": {"type": "ephemeral"}}
        ]
    (rest, written, read), (rest_again, written_again, read_again) = result.answer
    assert (written, read) == (cached, 0)
    assert (written_again, read_again) == (0, cached)
    assert rest == rest_again > 0

    calls = sorted(steps(result, "model_call"), key=lambda c: c["call"])
    assert [(c["cost"]["cache_write_tokens"], c["cost"]["cached_tokens"]) for c in calls] == [
        (cached, 0),
        (0, cached),
    ]
    completion = [s.completion_tokens for s in result.steps if s.kind == "model_call"]
    assert [s.prompt_tokens for s in result.steps if s.kind == "model_call"] == [rest + cached] * 2
    write_cost = (
        rest * PRICE.input_per_m + cached * Decimal("3.75") + completion[0] * 15
    ) / MILLION
    read_cost = (rest * PRICE.input_per_m + cached * Decimal("0.3") + completion[1] * 15) / MILLION
    assert [Decimal(c["cost"]["usd"]) for c in calls] == [write_cost, read_cost]
    assert result.cost_usd == write_cost + read_cost


def test_an_openai_endpoint_gets_a_marked_messages_request_without_anthropics_keys(tmp_path):
    """OpenAI's API refuses a key it does not know inside a message (the local provider does
    too): the markers and the error flag an Anthropic harness sets are left out for an endpoint
    of kind openai, and the model-call step names them as dropped."""
    policy = ProviderPolicy(api_key=KEY, rules=[("no b", "sorry")])
    policy.tool_rules = [("add 2", [("add", {"a": 2})])]
    marker = {"type": "ephemeral"}
    with ProviderServer(policy) as openai_provider:
        refused = httpx.post(
            f"{openai_provider.url}/chat/completions",
            headers={"Authorization": f"Bearer {KEY}"},
            json={"model": "gpt-test", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": marker}]}]},
        )  # fmt: skip
        assert refused.status_code == 400 and "'cache_control' was unexpected" in refused.text
        harness = sdk_program(
            tmp_path,
            f"""
            system = [{{"type": "text", "text": "Add.", "cache_control": {marker!r}}}]
            tools = [dict({ADD_TOOL!r}, cache_control={marker!r})]
            messages = [{{"role": "user", "content": [
                {{"type": "text", "text": "add 2 and 3", "cache_control": {marker!r}}}]}}]
            first = client.messages.create(model="gpt-x", max_tokens=16, system=system,
                                           tools=tools, messages=messages)
            (use,) = [b for b in first.content if b.type == "tool_use"]
            messages += [
                {{"role": "assistant", "content": first.content}},
                {{"role": "user", "content": [{{"type": "tool_result", "tool_use_id": use.id,
                                              "content": "no b", "is_error": True,
                                              "cache_control": {marker!r}}}]}},
            ]
            second = client.messages.create(model="gpt-x", max_tokens=16, system=system,
                                            tools=tools, messages=messages)
            answer([first.stop_reason, second.content[0].text])
            """,
        )

        result = hosted_rollout(harness, openai_provider, kind="openai")

    assert result.outcome == RolloutOutcome.PASSED, result.detail
    assert result.answer == ["tool_use", "sorry"]
    _, first, second = policy.requests  # after the refused one
    sent = json.dumps([first, second])
    assert "cache_control" not in sent and "is_error" not in sent
    assert first["messages"][0] == {"role": "system", "content": "Add."}
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "call_1_0", "content": "no b"}
    for call in steps(result, "model_call"):
        assert {"cache_control", "is_error"} & set(call["dropped"]) == (
            {"cache_control", "is_error"} if call["call"] else {"cache_control"}
        )
