"""Program harnesses: a command in the sandbox, its model at the worker's OpenAI-compatible
boundary, its answer in $COEVO_ANSWER_FILE. Real sandbox, real worker-side boundary, the
scripted OpenAI server behind it."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest

from coevo.policies.client import PolicyClient
from tests.support.openai_server import ScriptedOpenAIServer, ScriptedPolicy
from workers.environments.base import Verdict
from workers.outcomes import ErrorKind, RolloutOutcome
from workers.rollout import RolloutInputs, execute_rollout

# A program with no dependency but the standard library: one chat call, the reply as answer.
ASK = """
import json, os, urllib.request

task = json.load(open(os.environ["COEVO_TASK_FILE"]))
knobs = json.load(open(os.environ["COEVO_KNOBS_FILE"]))
def chat(messages, **extra):
    body = json.dumps({"model": "gpt-4o", "messages": messages, **extra}).encode()
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body,
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                 "Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(request))
reply = chat([{"role": "user", "content": knobs["style"] + " " + task["question"]}])
json.dump(reply["choices"][0]["message"]["content"], open(os.environ["COEVO_ANSWER_FILE"], "w"))
"""


def program(tmp_path: Path, files: dict[str, str], *, command: str, limits: str = "") -> Path:
    harness = tmp_path / "harness"
    harness.mkdir()
    knob = '[knobs.style]\ntype = "choice"\ndefault = "plain"\nchoices = ["plain", "terse"]\n'
    toml = f'[harness]\nname = "prog"\ncommand = {command}\n\n{knob}'
    if limits:
        toml += f"\n[limits]\n{limits}\n"
    (harness / "harness.toml").write_text(toml)
    for name, text in files.items():
        (harness / name).write_text(textwrap.dedent(text))
    return harness


def rollout(
    harness: Path,
    url: str,
    *,
    expected: str = "yes",
    knobs: dict | None = None,
    kind: str = "openai-compatible",
):
    inputs = RolloutInputs(
        harness_dir=harness,
        task_key="q1",
        task_view={"question": "is the sky blue?"},
        knob_overrides=knobs or {},
        seed=11,
        wall_time_s=60,
        policy_version="base",
    )

    def verify(answer):
        passed = answer == expected
        return Verdict(passed=passed, score=float(passed), detail=f"answer {answer!r}")

    with PolicyClient(url, model="scripted", retries=0, backoff_s=0.01, kind=kind) as client:
        return execute_rollout(inputs, policy=client, verify=verify)


@pytest.fixture
def server():
    policy = ScriptedPolicy(rules=[("sky", "yes")], default="no")
    with ScriptedOpenAIServer(policy) as running:
        yield running


def steps(result, kind):
    return [s.payload for s in result.steps if s.kind == kind]


def test_a_python_program_answers_through_the_boundary_and_is_scored(tmp_path, server):
    harness = program(tmp_path, {"main.py": ASK}, command='["python3", "main.py"]')
    result = rollout(harness, server.url, knobs={"style": "terse"})

    assert (result.outcome, result.score, result.answer) == (RolloutOutcome.PASSED, 1.0, "yes")
    (call,) = steps(result, "model_call")
    assert call["via"] == "boundary" and call["api"] == "chat" and "spoken" not in call
    assert call["messages"] == [{"role": "user", "content": "terse is the sky blue?"}]
    assert call["policy_version"] == "base" and call["completion"] == "yes"
    assert (call["session"], call["parent"], call["relation"]) == (0, None, "starts")
    # Whatever model the program named, the rollout's policy answered, with explicit sampling.
    (sent,) = server.policy.requests
    assert sent["model"] == "scripted" and sent["seed"] == 11 and sent["temperature"] == 1.0
    assert result.model_calls == 1 and result.prompt_tokens > 0
    assert steps(result, "start")[0]["command"] == ["python3", "main.py"]
    assert steps(result, "program_output")[0]["exit_code"] == 0


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js")
def test_a_node_program_answers_through_the_boundary(tmp_path, server):
    agent = """
    const fs = require("fs");
    const task = JSON.parse(fs.readFileSync(process.env.COEVO_TASK_FILE));
    fetch(process.env.OPENAI_BASE_URL + "/chat/completions", {
      method: "POST",
      headers: {"Authorization": "Bearer " + process.env.OPENAI_API_KEY,
                "Content-Type": "application/json"},
      body: JSON.stringify({model: "x", messages: [{role: "user", content: task.question}]}),
    }).then(r => r.json()).then(reply => {
      fs.writeFileSync(process.env.COEVO_ANSWER_FILE,
                       JSON.stringify(reply.choices[0].message.content));
    });
    """
    harness = program(tmp_path, {"agent.js": agent}, command='["node", "agent.js"]')
    result = rollout(harness, server.url)
    assert (result.outcome, result.answer) == (RolloutOutcome.PASSED, "yes"), result.detail


def test_a_shell_program_reads_its_knobs_from_the_environment(tmp_path, server):
    script = 'printf \'"%s"\' "$COEVO_KNOB_STYLE" > "$COEVO_ANSWER_FILE"\n'
    harness = program(tmp_path, {"run.sh": script}, command='["bash", "run.sh"]')
    result = rollout(harness, server.url, expected="terse", knobs={"style": "terse"})
    assert (result.outcome, result.answer) == (RolloutOutcome.PASSED, "terse"), result.detail


def test_a_call_past_max_model_calls_gets_an_openai_error_and_ends_the_rollout(tmp_path, server):
    agent = ASK + textwrap.dedent(
        """
        import urllib.error
        for _ in range(3):
            try:
                chat([{"role": "user", "content": "again"}])
            except urllib.error.HTTPError as exc:
                open("/tmp/refusal.json", "wb").write(exc.read())
                raise SystemExit(json.load(open("/tmp/refusal.json"))["error"]["code"])
        """
    )
    harness = program(
        tmp_path, {"main.py": agent}, command='["python3", "main.py"]', limits="max_model_calls = 2"
    )
    result = rollout(harness, server.url)

    assert (result.outcome, result.error_kind) == (RolloutOutcome.HARNESS_ERROR, ErrorKind.LIMIT)
    assert "max_model_calls = 2" in result.detail
    assert result.model_calls == 2 and len(server.policy.requests) == 2


def test_a_request_the_policy_server_fails_on_gets_an_error_the_program_recovers_from(
    tmp_path, server
):
    """vLLM answered HTTP 500 to a tool_choice it could not serve while it served the rest: the
    program is told (a 400, which clients do not retry) and goes on; the rollout is scored."""
    agent = ASK + textwrap.dedent(
        """
        import sys, urllib.error
        tool = {"type": "function", "function": {"name": "f", "parameters": {}}}
        try:
            chat([{"role": "user", "content": "sky?"}], tools=[tool], tool_choice="required")
        except urllib.error.HTTPError as exc:
            print(json.dumps({"status": exc.code, "error": json.load(exc)["error"]}))
        chat([{"role": "user", "content": "is the sky blue? sure?"}])  # served as before
        """
    )
    server.policy.fails_on = {"tool_choice": "required"}
    harness = program(tmp_path, {"main.py": agent}, command='["python3", "main.py"]')

    result = rollout(harness, server.url)

    assert (result.outcome, result.answer) == (RolloutOutcome.PASSED, "yes"), result.detail
    told = json.loads(steps(result, "program_output")[0]["stdout"])
    assert told["status"] == 400 and told["error"]["code"] == "policy_request_failed"
    assert "HTTP 500" in told["error"]["message"]
    assert "list index out of range" in told["error"]["message"]  # the server's own reply
    assert f":{server.port}" not in json.dumps(told)  # never the server's address
    calls = steps(result, "model_call")
    assert [("rejected" in call) for call in calls] == [False, True, False]
    assert "HTTP 500" in calls[1]["rejected"] and calls[1]["tool_choice"] == "required"
    assert [r.get("tool_choice") for r in server.policy.requests] == [None, "required", None]


def test_a_boundary_call_records_the_sampling_the_endpoints_kind_applied(tmp_path, server):
    """The program names no top_k; a vLLM endpoint gets it (and its other knobs) explicitly,
    never llama.cpp's repeat_penalty, and the step records what was sent, and what of the
    request the kind does not take."""
    harness = program(tmp_path, {"ask.py": ASK}, command='["python3", "ask.py"]')

    result = rollout(harness, server.url, kind="vllm")

    assert result.outcome == RolloutOutcome.PASSED, result.detail
    (request,) = server.policy.requests
    (call,) = steps(result, "model_call")
    assert (request["top_k"], request["min_p"], request["repetition_penalty"]) == (0, 0.0, 1.0)
    assert "repeat_penalty" not in request
    assert call["sampling"] == {
        k: v for k, v in request.items() if k not in ("path", "messages", "model", "stream")
    }


@pytest.mark.parametrize(
    ("script", "kind", "message"),
    [
        ("pass", ErrorKind.PROTOCOL, "without writing its answer"),
        (
            "open(__import__('os').environ['COEVO_ANSWER_FILE'], 'w').write('yes')",
            ErrorKind.PROTOCOL,
            "is not JSON",
        ),
        ("raise SystemExit(3)", ErrorKind.EXITED, "exited with code 3"),
    ],
)
def test_a_program_that_leaves_no_valid_answer_is_a_harness_error(
    tmp_path, server, script, kind, message
):
    harness = program(tmp_path, {"main.py": script}, command='["python3", "main.py"]')
    result = rollout(harness, server.url)
    assert (result.outcome, result.error_kind) == (RolloutOutcome.HARNESS_ERROR, kind)
    assert message in result.detail


def test_a_command_that_cannot_start_is_a_harness_error(tmp_path, server):
    harness = program(tmp_path, {}, command='["no-such-program"]')
    result = rollout(harness, server.url)
    assert (result.outcome, result.error_kind) == (RolloutOutcome.HARNESS_ERROR, ErrorKind.EXITED)
    assert "could not start" in result.detail


def test_requests_without_the_rollouts_key_are_refused(tmp_path, server):
    agent = """
    import json, os, urllib.request, urllib.error
    codes = []
    for key in ("", "sk-guess", os.environ["OPENAI_API_KEY"] + "x"):
        request = urllib.request.Request(
            os.environ["OPENAI_BASE_URL"] + "/models", headers={"Authorization": "Bearer " + key})
        try:
            urllib.request.urlopen(request)
            codes.append(200)
        except urllib.error.HTTPError as exc:
            codes.append(exc.code)
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/models",
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    models = json.load(urllib.request.urlopen(request))
    json.dump([codes, [m["id"] for m in models["data"]]], open(os.environ["COEVO_ANSWER_FILE"], "w"))
    """
    harness = program(tmp_path, {"main.py": agent}, command='["python3", "main.py"]')
    result = rollout(harness, server.url, expected="")
    assert result.answer == [[401, 401, 401], ["base"]], result.detail
    assert server.policy.requests == []


def test_a_conversation_that_extends_an_earlier_call_is_its_child(tmp_path, server):
    agent = ASK + textwrap.dedent(
        """
        first = [{"role": "user", "content": "is the sky blue?"}]
        answer = chat(first)["choices"][0]["message"]
        second = first + [answer, {"role": "user", "content": "sure?"}]
        chat(second)
        chat(first)  # the same request again: a branch beside the first
        """
    )
    harness = program(tmp_path, {"main.py": agent}, command='["python3", "main.py"]')
    result = rollout(harness, server.url)
    tree = [
        (c["call"], c["session"], c["parent"], c["relation"]) for c in steps(result, "model_call")
    ]
    assert sorted(tree) == [
        (0, 0, None, "starts"),
        (1, 1, None, "starts"),  # the same question prefixed by the knob: a new conversation
        (2, 1, 1, "continues"),
        (3, 1, 1, "repeats"),
    ]


# --- the unmodified openai SDK inside the sandbox ---------------------------------------------

SDK_AGENT = """
import json, os, threading
from openai import OpenAI

client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY come from the environment
tools = [{"type": "function", "function": {
    "name": "add", "parameters": {"type": "object", "properties": {
        "a": {"type": "number"}, "b": {"type": "number"}}}}}]
messages = [{"role": "user", "content": "add 2 and 3"}]
first = client.chat.completions.create(model="gpt-4o", messages=messages, tools=tools)
call = first.choices[0].message.tool_calls[0]
arguments = json.loads(call.function.arguments)
messages += [first.choices[0].message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": call.id, "content": str(arguments["a"] + arguments["b"])}]
second = client.chat.completions.create(model="gpt-4o", messages=messages, tools=tools)

# Streaming, and calls in parallel from threads.
chunks = client.chat.completions.create(
    model="anything", messages=[{"role": "user", "content": "is the sky blue?"}], stream=True,
    stream_options={"include_usage": True})
streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
parallel = []
threads = [threading.Thread(target=lambda: parallel.append(client.completions.create(
    model="x", prompt="sky?", max_tokens=5).choices[0].text)) for _ in range(4)]
for t in threads: t.start()
for t in threads: t.join()
models = [m.id for m in client.models.list()]
json.dump({"final": second.choices[0].message.content, "streamed": streamed,
           "parallel": parallel, "models": models, "tool": call.function.name},
          open(os.environ["COEVO_ANSWER_FILE"], "w"))
"""


def test_the_unmodified_openai_sdk_calls_tools_streams_and_runs_in_parallel(tmp_path):
    policy = ScriptedPolicy(
        rules=[("sky", "yes"), ("5", "the sum is 5")],
        tool_rules=[("add 2 and 3", [("add", {"a": 2, "b": 3})])],
    )
    harness = program(tmp_path, {"agent.py": SDK_AGENT}, command='["python3", "agent.py"]')
    with ScriptedOpenAIServer(policy) as server:
        result = rollout(harness, server.url, expected="")

    assert result.answer == {
        "final": "the sum is 5",
        "streamed": "yes",
        "parallel": ["yes"] * 4,
        "models": ["base"],
        "tool": "add",
    }, result.detail
    calls = sorted(steps(result, "model_call"), key=lambda c: c["call"])
    assert len(calls) == 7 and result.model_calls == 7
    assert calls[0]["tool_calls"] == [
        {
            "choice": 0,
            "id": calls[0]["tool_calls"][0]["id"],
            "name": "add",
            "arguments": '{"a": 2, "b": 3}',
        }
    ]
    assert calls[0]["tools"][0]["function"]["name"] == "add"
    # The tool result continues the conversation of the call that asked for the tool.
    assert (calls[1]["parent"], calls[1]["relation"], calls[1]["session"]) == (0, "continues", 0)
    assert calls[1]["messages"][-1]["role"] == "tool"
    assert {c["api"] for c in calls[3:]} == {"completions"}


def test_a_call_without_max_tokens_gets_what_the_policys_context_leaves(tmp_path):
    """The boundary's default fits the policy's context (vLLM's max_model_len here): the
    former 1,024 past a 600-token context was refused by the server."""
    policy = ScriptedPolicy(rules=[("sky", "yes")], flavor="vllm", context_tokens=600)
    harness = program(tmp_path, {"ask.py": ASK}, command='["python3", "ask.py"]')

    with ScriptedOpenAIServer(policy) as running:
        result = rollout(harness, running.url)

    assert result.outcome == RolloutOutcome.PASSED, result.detail
    (call,) = steps(result, "model_call")
    assert 500 < call["sampling"]["max_tokens"] < 600


def test_a_call_without_max_tokens_gets_its_share_of_the_token_budget(tmp_path, server):
    harness = program(
        tmp_path,
        {"ask.py": ASK},
        command='["python3", "ask.py"]',
        limits="max_model_calls = 8\nmax_tokens = 2000",
    )

    result = rollout(harness, server.url)

    assert result.outcome == RolloutOutcome.PASSED, result.detail
    (call,) = steps(result, "model_call")
    assert call["sampling"]["max_tokens"] == 250
