"""examples/mini-swe-agent: the mini-swe-agent release, unmodified, built by the worker's uv from
the local wheel directory and run as a program on a small workspace task through the real
runner, sandbox, boundary and verifier. The scripted server plays the model with the exact
replies mini-swe-agent's protocols expect (a bash tool call, or one fenced command in the text),
so the agent's own loop edits the file, runs the tests and submits; the hidden tests decide."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from harness_store.manifest import load_manifest
from tests.evaluations.test_program_worker import shipped_task_solve, trace_payloads
from tests.examples.test_workspace_agents import commands, model_calls, rollout, steps
from tests.support.example_envs import WHEELHOUSE, wheel_example_env
from tests.support.openai_server import ScriptedOpenAIServer, ScriptedPolicy
from workers.outcomes import ErrorKind, RolloutOutcome

HARNESS = Path(__file__).resolve().parents[2] / "examples" / "mini-swe-agent"
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
EDIT = "sed -i 's/Helo/Hello/' greet.py && cat greet.py"
TEST = "python -m pytest -q -p no:cacheprovider"


@pytest.fixture(scope="module")
def env_dir(tmp_path_factory) -> Path:
    """One cache of built environments for the module: the agent's is built once."""
    return tmp_path_factory.mktemp("harness-envs")


@pytest.fixture
def agent_env(settings, env_dir):
    """mini-swe-agent and its 82 pinned dependencies, built from the wheel directory (no index
    is asked) and held while the rollout mounts them."""
    with wheel_example_env(settings, env_dir, HARNESS) as path:
        yield path


def run(policy: ScriptedPolicy, agent_env: Path, **knobs):
    with ScriptedOpenAIServer(policy) as server:
        return rollout(HARNESS, server.url, knobs=knobs, harness_env=agent_env)


def text_reply(command: str) -> str:
    """A reply in mini_textbased.yaml's format: a thought, then one fenced command."""
    return f"THOUGHT: the next step.\n\n```mswea_bash_command\n{command}\n```"


def summary(result) -> dict:
    """What run.py printed: one JSON line (LiteLLM's banners are kept out of it)."""
    (output,) = steps(result, "program_output")
    (line,) = output["stdout"].splitlines()
    return json.loads(line)


def test_the_example_is_a_program_with_every_dependency_pinned():
    manifest = load_manifest(HARNESS)
    assert manifest.is_program and manifest.knobs["protocol"].default == "tool_calls"
    pins = [
        line
        for line in (HARNESS / "requirements.txt").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert "mini-swe-agent==2.4.6" in pins and "litellm==1.110.2" in pins
    assert all("==" in line for line in pins) and len(pins) == 82


def test_the_shipped_configs_are_the_releases_own(agent_env):
    """config/ holds copies of the package's default configs: a new pin must bring its own."""
    package = agent_env / "minisweagent" / "config"
    for name in ("mini.yaml", "mini_textbased.yaml"):
        assert (HARNESS / "config" / name).read_bytes() == (package / name).read_bytes(), name


def test_the_agent_fixes_the_file_with_tool_calls_and_submits(agent_env):
    policy = ScriptedPolicy(
        tool_rules=[
            # Each rule matches the last message: the task, then each command's output.
            ("1 passed", [("bash", {"command": SUBMIT})]),
            ("Hello, {name}!", [("bash", {"command": TEST})]),
            ("Fix the typo", [("bash", {"command": EDIT})]),
        ],
        default="I am lost.",
    )
    result = run(policy, agent_env)
    assert (result.outcome, result.score) == (RolloutOutcome.PASSED, 1.0), result.detail
    assert commands(result) == [EDIT, TEST, SUBMIT]
    calls = model_calls(result)
    assert [c["tool_calls"][0]["arguments"] for c in calls] == [
        json.dumps({"command": command}) for command in (EDIT, TEST, SUBMIT)
    ]
    assert [c["relation"] for c in calls[1:]] == ["continues"] * 2
    assert [t["function"]["name"] for t in calls[0]["tools"]] == ["bash"]
    system, instance = calls[0]["messages"]
    config = yaml.safe_load((HARNESS / "config/mini.yaml").read_text())
    assert system["content"] == config["agent"]["system_template"].strip()  # as Jinja renders it
    assert "Please solve this issue: # Fix the greeting" in instance["content"]
    # The tests' output reached the agent as its tool result, in mini.yaml's template.
    observation = calls[2]["messages"][-1]
    assert observation["role"] == "tool" and '"returncode": 0' in observation["content"]
    assert summary(result)["exit_status"] == "Submitted"
    (diff,) = steps(result, "workspace_diff")
    assert [row["path"] for row in diff["files"]] == ["greet.py"]


def test_the_agent_fixes_the_file_with_fenced_commands_on_the_text_protocol(agent_env):
    policy = ScriptedPolicy(
        rules=[
            ("1 passed", text_reply(SUBMIT)),
            ('Hello, {name}!"', text_reply(TEST)),
            ("Fix the typo", text_reply(EDIT)),
        ],
        default="I am lost.",
    )
    result = run(policy, agent_env, protocol="text")
    assert (result.outcome, result.score) == (RolloutOutcome.PASSED, 1.0), result.detail
    assert commands(result) == [EDIT, TEST, SUBMIT]
    calls = model_calls(result)
    assert all("tools" not in c for c in calls)
    assert "<returncode>0</returncode>" in calls[2]["messages"][-1]["content"]
    assert summary(result) == {
        "agent": "mini-swe-agent 2.4.6",
        "exit_status": "Submitted",
        "model_calls": 3,
        "submission": "",
    }


def test_a_command_past_its_timeout_is_reported_to_the_agent_as_mini_swe_agent_does(agent_env):
    policy = ScriptedPolicy(
        rules=[("timed out", text_reply(SUBMIT)), ("Fix the typo", text_reply("sleep 30"))],
        default="I am lost.",
    )
    result = run(policy, agent_env, protocol="text", command_timeout_s=5)
    assert (result.outcome, result.score) == (RolloutOutcome.TASK_FAILURE, 0.0), result.detail
    (sleep, _) = [s for s in steps(result, "helper_call") if s["name"] == "exec"]
    assert sleep["params"] == {"command": "sleep 30", "timeout_s": 5}
    assert sleep["result"]["timed_out"]
    observation = model_calls(result)[1]["messages"][-1]["content"]
    assert observation.startswith(
        "<exception>An error occurred while executing the command: "
        "Command 'sleep 30' timed out after 5 seconds</exception>"
    )
    assert "<returncode>-1</returncode>" in observation


def test_its_own_local_environment_runs_the_commands_untraced(agent_env):
    """environment = "local": mini-swe-agent's LocalEnvironment, subprocesses of the program's
    own sandbox in /app; the workspace is the same, the trace has no commands."""
    policy = ScriptedPolicy(
        rules=[
            ("1 passed", text_reply(SUBMIT)),
            ('Hello, {name}!"', text_reply(TEST)),
            ("Fix the typo", text_reply(EDIT)),
        ],
        default="I am lost.",
    )
    result = run(policy, agent_env, protocol="text", environment="local")
    assert (result.outcome, result.score) == (RolloutOutcome.PASSED, 1.0), result.detail
    assert commands(result) == [] and len(model_calls(result)) == 3


def test_replies_without_a_command_end_the_agent_not_the_run(agent_env):
    """A model that never calls the bash tool (a server that drops tools looks the same):
    mini-swe-agent stops after max_format_errors replies in a row; the task failed."""
    policy = ScriptedPolicy(default="I would rather talk about it.")
    result = run(policy, agent_env, max_format_errors=2)
    assert (result.outcome, result.score) == (RolloutOutcome.TASK_FAILURE, 0.0), result.detail
    assert commands(result) == []
    _, second = model_calls(result)
    assert "No tool calls found" in second["messages"][-1]["content"]
    assert summary(result)["exit_status"] == "RepeatedFormatError"


def test_a_call_the_policy_server_refuses_ends_the_agent_and_the_workspace_is_judged(agent_env):
    """A conversation past the context: the boundary passes the server's 400 on, mini-swe-agent
    stops on it (as its batch runner records an exception), and the program exits 0."""
    policy = ScriptedPolicy(default=text_reply("ls"), context_tokens=50)
    result = run(policy, agent_env, protocol="text")
    assert (result.outcome, result.score) == (RolloutOutcome.TASK_FAILURE, 0.0), result.detail
    assert summary(result)["exit_status"] == "ContextWindowExceededError"
    assert commands(result) == []


def test_an_agent_that_never_submits_runs_into_max_model_calls(agent_env):
    policy = ScriptedPolicy(default=text_reply("ls"))
    result = run(policy, agent_env, protocol="text", step_limit=0)
    assert result.outcome == RolloutOutcome.HARNESS_ERROR, result.detail
    assert result.error_kind == ErrorKind.LIMIT
    assert result.detail == "limit exceeded: max_model_calls = 50"
    assert len(model_calls(result)) == 50
    assert commands(result) == ["ls"] * 50


def test_its_own_step_limit_ends_the_agent_first(agent_env):
    policy = ScriptedPolicy(default=text_reply("ls"))
    result = run(policy, agent_env, protocol="text", step_limit=3)
    assert (result.outcome, result.score) == (RolloutOutcome.TASK_FAILURE, 0.0), result.detail
    assert commands(result) == ["ls"] * 3
    assert summary(result)["exit_status"] == "LimitsExceeded"


def test_the_agent_solves_the_shipped_task_on_a_real_worker(
    celery_worker_thread, project, policy_version, scripted_policy, settings, tmp_path, env_dir
):
    settings.COEVO_HARNESS_FIND_LINKS = str(WHEELHOUSE)
    settings.COEVO_HARNESS_ENV_DIR = env_dir
    scripted_policy.tool_rules[:] = [
        ("1 passed", [("bash", {"command": SUBMIT})]),
        ("Hello, {name}!", [("bash", {"command": TEST})]),
        ("Fix the typo", [("bash", {"command": EDIT})]),
    ]
    scripted_policy.default = "I am lost."
    rollout = shipped_task_solve(project, "mini-swe-agent", policy_version, tmp_path)
    assert (rollout.outcome, rollout.score) == (RolloutOutcome.PASSED, 1.0), rollout.detail
    executed = [
        s["params"]["command"]
        for s in trace_payloads(rollout, "helper_call")
        if s["name"] == "exec"
    ]
    assert executed == [EDIT, TEST, SUBMIT]
    calls = trace_payloads(rollout, "model_call")
    assert [c["tool_calls"][0]["name"] for c in calls] == ["bash"] * 3
