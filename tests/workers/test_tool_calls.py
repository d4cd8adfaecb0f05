"""Tool calling in ``run(task, ctx)`` harnesses: real sandboxed rollouts, the scripted server.

The model asks for tool calls through ``ctx.llm.chat(..., tools=...)``; the tools are harness
code, run in the sandbox, and their results go back to the model as ``role: "tool"`` messages
in the next call. Every call is recorded with its tools and the tool calls it got.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from coevo.policies.client import PolicyClient
from workers.environments.base import Verdict
from workers.outcomes import ErrorKind
from workers.rollout import RolloutInputs, RolloutOutcome, execute_rollout

QUESTION = "What is 6*7? Use the calculator."
CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}

# The harness's tool is its own code: a small arithmetic evaluator, run in the sandbox.
AGENT = """
import ast
import operator

TOOLS = {tools}
OPS = {{ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv}}


def calculate(expression):
    def value(node):
        if isinstance(node, ast.BinOp):
            return OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.Constant):
            return node.value
        raise ValueError(expression)
    return value(ast.parse(expression, mode="eval").body)


def run(task, ctx):
    messages = [{{"role": "user", "content": task["question"]}}]
    for _ in range(4):
        reply = ctx.llm.chat(messages, tools=TOOLS, max_tokens=64{extra})
        if not reply.tool_calls:
            return {{"text": reply.text, "finish_reasons": reply.finish_reasons,
                    "samples": [[c.name for c in s] for s in reply.tool_calls_by_sample]}}
        messages.append(reply.message)
        for call in reply.tool_calls:
            result = calculate(call.parsed_arguments()["expression"])
            ctx.log("tool", call.name, result=result)
            messages.append(call.tool_message(result))
    return "gave up"
"""


def make_harness(tmp_path: Path, agent: str) -> Path:
    harness = tmp_path / "harness"
    harness.mkdir()
    (harness / "harness.toml").write_text(
        '[harness]\nname = "t"\nentrypoint = "agent:run"\npolicy_api = "chat"\n'
        "[limits]\nwall_time_s = 30\nmax_model_calls = 8\n"
    )
    (harness / "agent.py").write_text(textwrap.dedent(agent))
    return harness


def tool_agent(tmp_path: Path, *, extra: str = "") -> Path:
    return make_harness(tmp_path, AGENT.format(tools=repr([CALCULATOR]), extra=extra))


def run(harness: Path, url: str, *, question: str = QUESTION):
    inputs = RolloutInputs(
        harness_dir=harness,
        task_key="calc-1",
        task_view={"question": question},
        knob_overrides={},
        seed=5,
        wall_time_s=60,
        policy_version="base-v1",
    )

    def verify(answer: Any) -> Verdict:
        text = answer.get("text", "") if isinstance(answer, dict) else ""
        return Verdict("42" in text, float("42" in text), text)

    with PolicyClient(url, model="scripted", retries=1, backoff_s=0.01) as client:
        return execute_rollout(inputs, policy=client, verify=verify)


def model_calls(result) -> list[dict[str, Any]]:
    return [step.payload for step in result.steps if step.kind == "model_call"]


@pytest.fixture
def calculator_policy(scripted_policy):
    scripted_policy.tool_rules.append(("6*7", [("calculator", {"expression": "6*7"})]))
    scripted_policy.rules.append(("42", "The answer is 42."))
    return scripted_policy


def test_it_runs_the_harness_tool_on_the_models_call_and_sends_the_result_back(
    calculator_policy, tmp_path
):
    result = run(tool_agent(tmp_path), calculator_policy.url)

    assert result.outcome == RolloutOutcome.PASSED, result.detail
    assert result.answer == {
        "text": "The answer is 42.",
        "finish_reasons": ["stop"],
        "samples": [[]],
    }
    requests = calculator_policy.requests
    assert [r["path"] for r in requests] == ["/v1/chat/completions"] * 2
    assert all(r["tools"] == [CALCULATOR] for r in requests)
    assert "tool_choice" not in requests[0]
    # The explicit sampling parameters go with the tools, as on every call.
    assert requests[0]["max_tokens"] == 64 and requests[0]["frequency_penalty"] == 0.0
    assert requests[0]["seed"] == 5 and requests[0]["model"] == "scripted"
    assert requests[1]["messages"] == [
        {"role": "user", "content": QUESTION},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1_0",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": '{"expression": "6*7"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1_0", "content": "42"},
    ]
    assert result.model_calls == 2


def test_it_records_the_tools_and_the_tool_calls_of_each_model_call(calculator_policy, tmp_path):
    result = run(tool_agent(tmp_path), calculator_policy.url)

    first, second = model_calls(result)
    assert first["tools"] == [CALCULATOR] and second["tools"] == [CALCULATOR]
    assert first["tool_calls"] == [
        {
            "choice": 0,
            "id": "call_1_0",
            "name": "calculator",
            "arguments": '{"expression": "6*7"}',
        }
    ]
    assert first["finish_reason"] == "tool_calls" and first["completion"] == ""
    assert second["tool_calls"] == []
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "call_1_0", "content": "42"}
    assert second["completion"] == "The answer is 42."
    assert "tool_choice" not in first
    logs = [s.payload for s in result.steps if s.kind == "log"]
    assert logs == [{"message": "tool calculator", "fields": {"result": 42}}]
    kinds = [s.kind for s in result.steps]
    assert kinds == ["start", "model_call", "log", "model_call", "answer", "verdict"]


@pytest.mark.parametrize(
    "tool_choice",
    ["required", "none", {"type": "function", "function": {"name": "calculator"}}],
)
def test_it_forwards_the_tool_choice_and_records_it(calculator_policy, tmp_path, tool_choice):
    harness = tool_agent(tmp_path, extra=f", tool_choice={tool_choice!r}")

    result = run(harness, calculator_policy.url)

    assert result.outcome == RolloutOutcome.PASSED, result.detail
    assert [r["tool_choice"] for r in calculator_policy.requests] == [tool_choice] * 2
    assert [call["tool_choice"] for call in model_calls(result)] == [tool_choice] * 2


def test_a_tool_choice_the_server_fails_on_ends_the_rollout_as_the_harnesss_error(
    calculator_policy, tmp_path
):
    """vLLM answered HTTP 500 to tool_choice "required" while it served everything else."""
    calculator_policy.fails_on = {"tool_choice": "required"}
    harness = tool_agent(tmp_path, extra=", tool_choice='required'")

    result = run(harness, calculator_policy.url)

    assert (result.outcome, result.error_kind) == (RolloutOutcome.HARNESS_ERROR, ErrorKind.POLICY)
    assert "HTTP 500" in result.detail and "/chat/completions" in result.detail
    assert result.score == 0.0
    assert len(calculator_policy.requests) == 2  # retried once, as any 5xx


def test_it_draws_n_samples_with_tools_as_n_recorded_calls(calculator_policy, tmp_path):
    harness = make_harness(
        tmp_path,
        f"""
        def run(task, ctx):
            reply = ctx.llm.chat([{{"role": "user", "content": task["question"]}}],
                                 tools={[CALCULATOR]!r}, n=2, seed=30)
            return {{"text": "42",
                    "samples": [[(c.id, c.name, c.parsed_arguments()) for c in s]
                                for s in reply.tool_calls_by_sample],
                    "reasons": reply.finish_reasons}}
        """,
    )

    result = run(harness, calculator_policy.url)

    assert result.outcome == RolloutOutcome.PASSED, result.detail
    assert result.answer["samples"] == [
        [["call_1_0", "calculator", {"expression": "6*7"}]],
        [["call_2_0", "calculator", {"expression": "6*7"}]],
    ]
    assert result.answer["reasons"] == ["tool_calls", "tool_calls"]
    assert [r["seed"] for r in calculator_policy.requests] == [30, 31]
    assert all("n" not in r for r in calculator_policy.requests)
    calls = model_calls(result)
    assert [(c["sample"], c["n"]) for c in calls] == [(0, 2), (1, 2)]
    assert [c["tool_calls"][0]["id"] for c in calls] == ["call_1_0", "call_2_0"]


def test_it_forwards_a_response_format_without_tools(scripted_policy, tmp_path):
    scripted_policy.rules.append(("json please", '{"answer": 42}'))
    harness = make_harness(
        tmp_path,
        """
        import json

        def run(task, ctx):
            reply = ctx.llm.chat([{"role": "user", "content": "json please"}],
                                 response_format={"type": "json_object"})
            return {"text": str(json.loads(reply.text)["answer"]), "calls": reply.tool_calls}
        """,
    )

    result = run(harness, scripted_policy.url)

    assert result.outcome == RolloutOutcome.PASSED, result.detail
    assert result.answer == {"text": "42", "calls": []}
    (request,) = scripted_policy.requests
    assert request["response_format"] == {"type": "json_object"}
    assert "tools" not in request
    (call,) = model_calls(result)
    assert call["response_format"] == {"type": "json_object"}
    assert "tools" not in call and "tool_calls" not in call


def test_it_sends_a_chat_without_tools_as_before(scripted_policy, tmp_path):
    scripted_policy.rules.append(("hello", "hi"))
    harness = make_harness(
        tmp_path,
        """
        def run(task, ctx):
            reply = ctx.llm.chat([{"role": "user", "content": "hello"}])
            return {"text": reply.text + " 42", "calls": reply.tool_calls,
                    "message": reply.message}
        """,
    )

    result = run(harness, scripted_policy.url)

    assert result.answer == {
        "text": "hi 42",
        "calls": [],
        "message": {"role": "assistant", "content": "hi"},
    }
    (request,) = scripted_policy.requests
    assert sorted(request) == sorted(
        [
            "path",
            "messages",
            "model",
            "stream",
            "max_tokens",
            "temperature",
            "top_p",
            "frequency_penalty",
            "presence_penalty",
            "seed",
        ]
    )
    (call,) = model_calls(result)
    assert not {"tools", "tool_choice", "response_format", "tool_calls"} & set(call)


TOOL_CALL = {
    "id": "call_9",
    "type": "function",
    "function": {"name": "calculator", "arguments": "{}"},
}


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        ("ctx.llm.chat(M, tools='calculator')", "tools must be a non-empty list"),
        ("ctx.llm.chat(M, tools=[])", "tools must be a non-empty list"),
        ("ctx.llm.chat(M, tools=[{'type': 'retrieval'}])", "tools[0] must be {'type': 'function'"),
        (
            "ctx.llm.chat(M, tools=[{'type': 'function', 'function': {'name': 'add up'}}])",
            "tools[0].function.name must be 1 to 64 letters, digits, _ or -, got 'add up'",
        ),
        (
            "ctx.llm.chat(M, tools=[{'type': 'function', 'function': {'description': 'x'}}])",
            "tools[0].function.name must be",
        ),
        ("ctx.llm.chat(M, tools=[TOOL] * 129)", "tools has 129 tools; at most 128"),
        ("ctx.llm.chat(M, tools=[TOOL, TOOL])", "tools[1].function.name 'calculator' names"),
        (
            "ctx.llm.chat(M, tools=[{'type': 'function', 'function': "
            "{'name': 'f', 'parameters': 'x'}}])",
            "tools[0].function.parameters must be a JSON Schema object",
        ),
        (
            "ctx.llm.chat(M, tools=[{'type': 'function', 'function': "
            "{'name': 'f', 'parameters': {'d': 'x' * 70000}}}])",
            "tools[0].function.parameters is larger than 64000 characters",
        ),
        (
            "ctx.llm.chat(M, tools=[{'type': 'function', 'function': {'name': 'f', 'run': 1}}])",
            "tools[0].function has unknown keys ['run']",
        ),
        ("ctx.llm.chat(M, tools=[TOOL], tool_choice='always')", "tool_choice must be one of"),
        (
            "ctx.llm.chat(M, tools=[TOOL], tool_choice="
            "{'type': 'function', 'function': {'name': 'search'}})",
            "tool_choice.function.name 'search' is not one of the tools offered (calculator)",
        ),
        ("ctx.llm.chat(M, tool_choice='auto')", "tool_choice needs tools"),
        ("ctx.llm.chat(M, response_format={'type': 'xml'})", "response_format must be"),
        (
            "ctx.llm.chat(M, response_format={'type': 'json_schema', 'json_schema': {}})",
            "response_format.json_schema.name must be",
        ),
        (
            "ctx.llm.chat(M + [{'role': 'tool', 'content': '1'}])",
            "messages[1].tool_call_id must be the id of the tool call it answers",
        ),
        (
            "ctx.llm.chat(M + [{'role': 'tool', 'tool_call_id': 'call_1', 'content': '1'}])",
            "messages[1].tool_call_id 'call_1' answers no tool call of an earlier",
        ),
        (
            "ctx.llm.chat(M + [{'role': 'assistant', 'content': None}])",
            "messages[1].content must be a string, got NoneType (null only beside tool_calls)",
        ),
        (
            "ctx.llm.chat(M + [{'role': 'assistant', 'content': None, 'tool_calls': "
            "[{'id': 'c', 'type': 'function', 'function': {'name': 'f', 'arguments': {}}}]}])",
            "messages[1].tool_calls[0].function.arguments must be a string",
        ),
        (
            "ctx.llm.chat(M + [{'role': 'assistant', 'content': '', 'tool_calls': "
            "[{'type': 'function', 'function': {'name': 'f', 'arguments': '{}'}}]}])",
            "messages[1].tool_calls[0].id must be a string",
        ),
        (
            "ctx.llm.chat(M + [{'role': 'user', 'content': 'x', 'tool_calls': [CALL]}])",
            "messages[1] has unknown keys ['tool_calls']",
        ),
    ],
)
def test_it_ends_a_malformed_tool_call_request_naming_the_field(
    scripted_policy, tmp_path, call, expected
):
    harness = make_harness(
        tmp_path,
        f"""
        M = [{{"role": "user", "content": "hi"}}]
        TOOL = {CALCULATOR!r}
        CALL = {TOOL_CALL!r}

        def run(task, ctx):
            return {call}
        """,
    )

    result = run(harness, scripted_policy.url)

    assert result.outcome == RolloutOutcome.HARNESS_ERROR
    assert result.error_kind == ErrorKind.OTHER
    assert result.detail.startswith("ctx.llm.chat: "), result.detail
    assert expected in result.detail
    assert scripted_policy.requests == []


def test_it_accepts_an_earlier_tool_exchange_in_the_messages(scripted_policy, tmp_path):
    exchange = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
        {"role": "tool", "tool_call_id": "call_9", "content": "42"},
    ]
    scripted_policy.rules.append(("42", "It is 42."))
    harness = make_harness(
        tmp_path,
        f"""
        def run(task, ctx):
            return {{"text": ctx.llm.chat({exchange!r}, tools=[{CALCULATOR!r}]).text}}
        """,
    )

    result = run(harness, scripted_policy.url)

    assert result.outcome == RolloutOutcome.PASSED, result.detail
    (request,) = scripted_policy.requests
    assert request["messages"] == exchange


def test_it_refuses_tools_sent_to_llm_complete_by_hand(scripted_policy, tmp_path):
    harness = make_harness(
        tmp_path,
        f"""
        def run(task, ctx):
            # Past the runtime, whose complete() takes no tools: the worker refuses them too.
            return ctx._channel.call("llm.complete", {{"prompt": "x", "tools": {[CALCULATOR]!r}}})
        """,
    )
    (harness / "harness.toml").write_text(
        (harness / "harness.toml").read_text().replace('"chat"', '"completions"')
    )

    result = run(harness, scripted_policy.url)

    assert result.outcome == RolloutOutcome.HARNESS_ERROR
    assert result.detail == (
        "ctx.llm.complete: unknown parameters ['tools'] (tools: ctx.llm.chat only)"
    )
    assert scripted_policy.requests == []
