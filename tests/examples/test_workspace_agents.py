"""The shipped workspace harnesses (examples/workspace-basic: run(task, ctx) on the completions
API; examples/workspace-agent: a program on the OpenAI SDK, its dependencies built with uv from
the local wheel directory) on a small workspace task, through the real runner, sandbox and
verifier. The scripted server plays the model, so each edit is exact: the hidden tests decide,
and the visible tests the harness runs through the exec helper are in the trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coevo.policies.client import PolicyClient
from harness_store.manifest import load_manifest
from tests.support.example_envs import wheel_example_env
from tests.support.openai_server import ScriptedOpenAIServer, ScriptedPolicy
from workers.environments import workspace as ws_env
from workers.outcomes import RolloutOutcome
from workers.rollout import RolloutInputs, TaskEnvironment, execute_rollout

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BASIC = EXAMPLES / "workspace-basic"
AGENT = EXAMPLES / "workspace-agent"
TEST_COMMAND = "python -m pytest -q -x -p no:cacheprovider"

GREET = '"""Greetings."""\n\n\ndef greet(name):\n    return f"Helo, {name}!"\n'
FIXED = '"""Greetings."""\n\n\ndef greet(name):\n    return f"Hello, {name}!"\n'
WRONG = '"""Greetings."""\n\n\ndef greet(name):\n    return f"Hullo, {name}!"\n'
VISIBLE = (
    'from greet import greet\n\n\ndef test_greet():\n    assert greet("Ada") == "Hello, Ada!"\n'
)
HIDDEN = 'from greet import greet\n\n\ndef test_hidden():\n    assert greet("Bo") == "Hello, Bo!"\n'
TEST_SH = """#!/bin/bash
cd /app
if python -m pytest -q -p no:cacheprovider /tests/test_hidden.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""
INPUTS = {
    "instruction": (
        "# Fix the greeting\n\n`greet()` in `/app/greet.py` returns a misspelled greeting, so "
        'the test in `/app/test_greet.py` fails. Fix the typo so that `greet("Ada")` returns '
        '`"Hello, Ada!"`.\n'
    ),
    "files": {
        "README.md": {"text": "A greeter.\n"},
        "greet.py": {"text": GREET},
        "test_greet.py": {"text": VISIBLE},
    },
    "metadata": {"category": "bugfix"},
    "agent_timeout_s": 120,
}
VERIFIER = {
    "tests": {"test.sh": {"text": TEST_SH, "executable": True}, "test_hidden.py": {"text": HIDDEN}},
    "solution": {},
    "timeout_s": 60,
}


@pytest.fixture(scope="module")
def env_dir(tmp_path_factory) -> Path:
    """One cache of built environments for the module: the agent's is built once."""
    return tmp_path_factory.mktemp("harness-envs")


@pytest.fixture
def agent_env(settings, env_dir):
    """examples/workspace-agent's declared dependencies, built from the wheel directory (no
    index is asked) and held while the rollout mounts them."""
    with wheel_example_env(settings, env_dir, AGENT) as path:
        yield path


def rollout(
    harness: Path,
    url: str,
    *,
    knobs: dict | None = None,
    harness_env: Path | None = None,
    task: dict | None = None,
    verifier: dict | None = None,
):
    task = task or INPUTS
    inputs = RolloutInputs(
        harness_dir=harness,
        task_key="fix-greeting",
        task_view=ws_env.harness_view(task),
        knob_overrides=knobs or {},
        seed=1,
        wall_time_s=120,
        policy_version="base",
        harness_env=harness_env,
    )
    environment = TaskEnvironment(
        adapter=ws_env.WorkspaceEnvironment(), inputs=task, verifier=verifier or VERIFIER
    )
    with PolicyClient(url, model="scripted", retries=0) as client:
        return execute_rollout(inputs, policy=client, environment=environment)


def steps(result, kind: str) -> list[dict]:
    return [s.payload for s in result.steps if s.kind == kind]


def commands(result) -> list[str]:
    return [s["params"]["command"] for s in steps(result, "helper_call") if s["name"] == "exec"]


def model_calls(result) -> list[dict]:
    # A program's calls are numbered ("call"); run(task, ctx)'s are recorded in order.
    return sorted(steps(result, "model_call"), key=lambda c: c.get("call", 0))


def prompt_of(call: dict) -> str:
    """What the model was shown: the completion prompt, or the chat's last message."""
    return call["prompt"] if "prompt" in call else call["messages"][-1]["content"]


def run_example(name: str, policy: ScriptedPolicy, request, **knobs):
    harness_env = request.getfixturevalue("agent_env") if name == "workspace-agent" else None
    with ScriptedOpenAIServer(policy) as server:
        return rollout(EXAMPLES / name, server.url, knobs=knobs, harness_env=harness_env)


def test_the_examples_are_workspace_harnesses_of_both_kinds():
    basic, agent = load_manifest(BASIC), load_manifest(AGENT)
    assert not basic.is_program and agent.is_program
    assert agent.knobs["mode"].default == "rewrite"
    # The same pins as examples/openai-agent: one set of wheels serves both.
    assert (AGENT / "requirements.txt").read_bytes() == (
        EXAMPLES / "openai-agent/requirements.txt"
    ).read_bytes()


# How each example's model answers with the fixed file: workspace-basic's prompt opens the code
# fence, so its model writes the file and closes the fence (chatter after it is ignored);
# workspace-agent's chat model answers a fenced block inside prose.
RIGHT = {
    "workspace-basic": FIXED + "```\n\nThat fixes the typo.",
    "workspace-agent": f"Here is the fixed file:\n```python\n{FIXED}```\nDone.",
}
BAD = {
    "workspace-basic": WRONG + "```\n",
    "workspace-agent": f"```python\n{WRONG}```",
}


@pytest.mark.parametrize("name", ["workspace-basic", "workspace-agent"])
def test_the_example_writes_the_models_file_and_runs_the_visible_tests(name, request):
    policy = ScriptedPolicy(rules=[("Fix the typo", RIGHT[name])], default="no idea")
    result = run_example(name, policy, request, show_tests=True)
    assert (result.outcome, result.score) == (RolloutOutcome.PASSED, 1.0), result.detail
    assert commands(result) == [TEST_COMMAND]
    (run,) = [s for s in steps(result, "helper_call") if s["name"] == "exec"]
    assert run["result"]["exit_code"] == 0 and "1 passed" in run["result"]["stdout"]
    (call,) = model_calls(result)
    shown = prompt_of(call)
    assert GREET in shown and VISIBLE in shown  # the file and the visible test
    (diff,) = steps(result, "workspace_diff")
    assert [row["path"] for row in diff["files"]] == ["greet.py"]


@pytest.mark.parametrize("name", ["workspace-basic", "workspace-agent"])
def test_a_failing_rewrite_is_retried_with_the_test_failure_in_the_prompt(name, request):
    policy = ScriptedPolicy(
        rules=[("1 failed", RIGHT[name]), ("Fix the typo", BAD[name])], default="no idea"
    )
    result = run_example(name, policy, request)
    assert (result.outcome, result.score) == (RolloutOutcome.PASSED, 1.0), result.detail
    assert commands(result) == [TEST_COMMAND, TEST_COMMAND]
    first, second = model_calls(result)
    assert "failed" not in prompt_of(first) and VISIBLE not in prompt_of(first)  # show_tests
    retry = prompt_of(second)
    assert "Hullo, Ada!" in retry and "1 failed" in retry  # pytest's own words
    assert WRONG in retry  # the version that failed, as the file now is
    temperatures = [c["sampling"]["temperature"] for c in (first, second)]
    assert temperatures == [0.0, 0.7]  # temperature, then retry_temperature


def test_a_reply_that_is_not_python_is_not_written_and_is_retried():
    broken = 'def greet(name)\n    return "Hello, " + name\n```\n'
    policy = ScriptedPolicy(
        rules=[("SyntaxError", RIGHT["workspace-basic"]), ("Fix the typo", broken)],
        default="no idea",
    )
    with ScriptedOpenAIServer(policy) as server:
        result = rollout(BASIC, server.url)
    assert (result.outcome, result.score) == (RolloutOutcome.PASSED, 1.0), result.detail
    # The broken version never reached the workspace, so the tests ran once.
    assert commands(result) == [TEST_COMMAND]
    first, second = model_calls(result)
    assert "SyntaxError in greet.py line 1" in prompt_of(second)
    assert GREET in prompt_of(second)


def test_a_version_that_already_failed_is_not_tested_again():
    policy = ScriptedPolicy(rules=[("Fix the typo", BAD["workspace-basic"])], default="no idea")
    with ScriptedOpenAIServer(policy) as server:
        result = rollout(BASIC, server.url, knobs={"max_attempts": 3})
    # Every attempt failing is the task's failure, not the harness's.
    assert (result.outcome, result.score) == (RolloutOutcome.TASK_FAILURE, 0.0), result.detail
    assert commands(result) == [TEST_COMMAND]
    _, second, third = model_calls(result)
    assert "1 failed" in prompt_of(second)
    assert "That is greet.py unchanged" in prompt_of(third)


def test_only_the_head_of_a_long_file_is_shown_and_rewritten_the_rest_is_kept():
    long = GREET + "".join(f"\n\ndef helper_{i}():\n    return {i}\n" for i in range(60))
    head = long[: long.rfind("\n", 0, 500) + 1]
    task = {**INPUTS, "files": {**INPUTS["files"], "greet.py": {"text": long}}}
    policy = ScriptedPolicy(
        rules=[("Fix the typo", head.replace("Helo", "Hello") + "```\n")], default="no idea"
    )
    with ScriptedOpenAIServer(policy) as server:
        result = rollout(BASIC, server.url, knobs={"max_file_chars": 500}, task=task)
    assert (result.outcome, result.score) == (RolloutOutcome.PASSED, 1.0), result.detail
    assert head in prompt_of(model_calls(result)[0]) and "helper_59" not in head
    (row,) = steps(result, "workspace_diff")[0]["files"]
    changed = [line for line in row["diff"].splitlines() if line[:1] in "+-"]
    assert changed[2:] == ['-    return f"Helo, {name}!"', '+    return f"Hello, {name}!"']


def test_the_agent_with_tools_reads_writes_and_runs_the_tests(agent_env):
    policy = ScriptedPolicy(
        tool_rules=[
            # The first message holds the instruction, each later one the last tool's result.
            ("Fix the typo", [("read_file", {"path": "greet.py"})]),
            ("Helo, {name}", [("write_file", {"path": "/app/greet.py", "content": FIXED})]),
            ("wrote greet.py", [("run_command", {"command": "python -m pytest -q"})]),
        ],
        default="Fixed the typo; the tests pass.",
    )
    with ScriptedOpenAIServer(policy) as server:
        result = rollout(AGENT, server.url, knobs={"mode": "tools"}, harness_env=agent_env)
    assert (result.outcome, result.score) == (RolloutOutcome.PASSED, 1.0), result.detail
    calls = model_calls(result)
    assert [c["tool_calls"][0]["name"] if c["tool_calls"] else None for c in calls] == [
        "read_file",
        "write_file",
        "run_command",
        None,
    ]
    assert [c["relation"] for c in calls[1:]] == ["continues"] * 3
    assert commands(result) == ["python -m pytest -q"]
    tool_result = calls[-1]["messages"][-1]
    assert tool_result["role"] == "tool" and tool_result["content"].startswith("exit code 0")
    assert "1 passed" in tool_result["content"]
    assert json.dumps(calls[0]["tools"]).count('"name"') == 4


def test_the_agent_with_tools_cannot_leave_the_workspace(agent_env):
    policy = ScriptedPolicy(
        tool_rules=[
            ("Fix the typo", [("write_file", {"path": "../etc/x", "content": "x"})]),
            ("outside", [("read_file", {"path": "nothing.py"})]),
        ],
        default="I give up.",
    )
    with ScriptedOpenAIServer(policy) as server:
        result = rollout(AGENT, server.url, knobs={"mode": "tools"}, harness_env=agent_env)
    assert (result.outcome, result.score) == (RolloutOutcome.TASK_FAILURE, 0.0), result.detail
    calls = model_calls(result)
    assert "is outside /app" in calls[1]["messages"][-1]["content"]
    assert calls[2]["messages"][-1]["content"] == "error: no such text file"
