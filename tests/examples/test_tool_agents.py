"""The shipped tool-using agents (examples/openai-agent: the unmodified OpenAI SDK;
examples/node-agent: Node's fetch) on the shipped suite (examples/suites/tool-arithmetic.jsonl),
in the real sandbox behind the real boundary; the scripted server plays a model that calls the
tools, so the answers are exact."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from coevo.policies.client import PolicyClient
from harness_store.manifest import load_manifest
from tests.support.openai_server import ScriptedOpenAIServer, ScriptedPolicy
from workers.environments import jsonl
from workers.outcomes import RolloutOutcome
from workers.rollout import RolloutInputs, execute_rollout

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SUITE = [
    json.loads(line)
    for line in (EXAMPLES / "suites/tool-arithmetic.jsonl").read_text().splitlines()
]


def scripted_model() -> ScriptedPolicy:
    """Calls calculate for t01 and convert for t02, then answers with the tool's result."""
    return ScriptedPolicy(
        tool_rules=[
            ("17 * 23 + 4", [("calculate", {"expression": "17 * 23 + 4"})]),
            ("3.5 feet", [("convert", {"value": 3.5, "from_unit": "ft", "to_unit": "cm"})]),
        ],
        rules=[("395", "The answer is 395."), ("106.6", "That is about 106.68 cm.")],
        default="I do not know",
    )


def rollout(harness: Path, url: str, task: dict):
    inputs = RolloutInputs(
        harness_dir=harness,
        task_key=task["id"],
        task_view=jsonl.harness_view({"input": task["input"]}),
        knob_overrides={},
        seed=3,
        wall_time_s=120,
        policy_version="base",
    )
    verifier = {
        "scorer": {"kind": "numeric", "abs_tol": 1e-6, "rel_tol": 1e-9},
        "expected": task["expected"],
    }
    with PolicyClient(url, model="scripted", retries=0) as client:
        return execute_rollout(
            inputs,
            policy=client,
            verify=lambda answer: jsonl.verify(
                inputs={"input": task["input"]}, verifier=verifier, answer=answer
            ),
        )


def harnesses() -> list:
    found = [pytest.param(EXAMPLES / "openai-agent", id="openai-sdk")]
    found.append(
        pytest.param(
            EXAMPLES / "node-agent",
            id="node",
            marks=pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js"),
        )
    )
    return found


def test_the_examples_are_program_harnesses_on_the_shipped_suite():
    assert load_manifest(EXAMPLES / "openai-agent").requirements  # declares its dependencies
    for name in ("openai-agent", "node-agent"):
        assert load_manifest(EXAMPLES / name).is_program
    assert {row["split"] for row in SUITE} == {"search", "validation", "heldout"}
    assert all(isinstance(row["expected"], int | float) for row in SUITE)


@pytest.mark.parametrize("harness", harnesses())
def test_the_agent_calls_a_tool_and_answers_with_its_result(harness):
    with ScriptedOpenAIServer(scripted_model()) as server:
        result = rollout(harness, server.url, SUITE[0])
    assert (result.outcome, result.answer) == (RolloutOutcome.PASSED, 395), result.detail
    calls = sorted(
        (s.payload for s in result.steps if s.kind == "model_call"), key=lambda c: c["call"]
    )
    assert [c["tool_calls"][0]["name"] if c["tool_calls"] else None for c in calls] == [
        "calculate",
        None,
    ]
    assert calls[1]["messages"][-1] == {
        "role": "tool",
        "tool_call_id": calls[0]["tool_calls"][0]["id"],
        "content": "395",
    }
    assert (calls[1]["parent"], calls[1]["relation"]) == (0, "continues")


def test_the_openai_agent_converts_units_with_its_second_tool():
    with ScriptedOpenAIServer(scripted_model()) as server:
        result = rollout(EXAMPLES / "openai-agent", server.url, SUITE[1])
    assert (result.outcome, result.score) == (RolloutOutcome.PASSED, 1.0), result.detail


@pytest.mark.parametrize("harness", harnesses())
def test_an_agent_whose_model_never_calls_a_tool_fails_the_task_not_the_run(harness):
    with ScriptedOpenAIServer(scripted_model()) as server:
        result = rollout(harness, server.url, SUITE[2])  # the model answers "I do not know"
    assert (result.outcome, result.answer) == (RolloutOutcome.TASK_FAILURE, None), result.detail
