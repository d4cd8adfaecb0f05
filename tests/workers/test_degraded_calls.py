"""A model call the policy server could not wholly honour (the llama.cpp host's tools that its
model's chat template never showed it) is recorded as ``degraded`` on its step, for program
harnesses at the boundary and ``run(task, ctx)`` harnesses alike. Real sandboxed rollouts, the
scripted server answering with the host's ``coevo_degraded``."""

from __future__ import annotations

import pytest

from tests.support.openai_server import ScriptedOpenAIServer, ScriptedPolicy
from tests.workers.test_program_harness import program, rollout, steps
from tests.workers.test_tool_calls import model_calls, run, tool_agent
from workers.openai_requests import MAX_DEGRADED, MAX_DEGRADED_CHARS, degraded_of
from workers.rollout import RolloutOutcome

DEGRADED = [
    {
        "field": "tools",
        "why": "tools were not passed to the model: its chat template has no place for tools",
    }
]

# A program that offers a tool, and answers with the reply's text and whether the reply still
# carried the host's coevo_degraded (the boundary passes it on: the SDKs ignore it).
OFFERS_TOOLS = """
import json, os, urllib.request

body = json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "is the sky blue?"}],
                   "tools": [{"type": "function", "function": {"name": "look", "parameters": {}}}],
                   "max_tokens": 16}).encode()
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body,
    headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
             "Content-Type": "application/json"})
reply = json.load(urllib.request.urlopen(request))
answer = [reply["choices"][0]["message"]["content"], reply.get("coevo_degraded")]
json.dump(answer, open(os.environ["COEVO_ANSWER_FILE"], "w"))
"""


@pytest.fixture
def degrading_server():
    policy = ScriptedPolicy(rules=[("sky", "yes")], reply_extra={"coevo_degraded": DEGRADED})
    with ScriptedOpenAIServer(policy) as running:
        yield running


def test_it_records_a_program_call_the_server_degraded(tmp_path, degrading_server):
    harness = program(tmp_path, {"ask.py": OFFERS_TOOLS}, command='["python3", "ask.py"]')

    result = rollout(harness, degrading_server.url, expected=["yes", DEGRADED])

    assert result.outcome == RolloutOutcome.PASSED, result.detail
    (call,) = steps(result, "model_call")
    assert call["degraded"] == DEGRADED
    assert call["tools"][0]["function"]["name"] == "look"


def test_a_program_call_the_server_honoured_has_no_degraded_entry(tmp_path):
    policy = ScriptedPolicy(rules=[("sky", "yes")])
    harness = program(tmp_path, {"ask.py": OFFERS_TOOLS}, command='["python3", "ask.py"]')

    with ScriptedOpenAIServer(policy) as running:
        result = rollout(harness, running.url, expected=["yes", None])

    assert result.outcome == RolloutOutcome.PASSED, result.detail
    (call,) = steps(result, "model_call")
    assert "degraded" not in call


def test_it_records_a_ctx_harness_call_the_server_degraded(tmp_path, degrading_server):
    degrading_server.policy.rules.append(("6*7", "The answer is 42."))

    result = run(tool_agent(tmp_path), degrading_server.url)

    assert result.outcome == RolloutOutcome.PASSED, result.detail
    (call,) = model_calls(result)
    assert call["degraded"] == DEGRADED


def test_it_keeps_a_bounded_list_of_what_a_server_says_it_degraded():
    said = [{"field": "tools", "why": "x" * 5000}] * 40 + ["junk", {"why": "no field"}]

    kept = degraded_of({"coevo_degraded": said})

    assert len(kept) == MAX_DEGRADED
    assert {len(entry["why"]) for entry in kept} == {MAX_DEGRADED_CHARS}
    assert degraded_of({"coevo_degraded": "tools"}) == degraded_of({}) == []
