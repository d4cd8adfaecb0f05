"""examples/claude-code: Claude Code, unmodified (the npm release its lock pins, installed by
the worker's npm build from the test npm cache without its install script), on the shipped
workspace task through the real runner, sandbox, Messages boundary and verifier. The scripted
server plays the model; its tool call is Claude Code's own Edit tool with the arguments Claude
Code's tool schema asks for."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from harness_store.manifest import load_manifest
from tests.evaluations.test_program_worker import shipped_task_solve, trace_payloads
from tests.examples.test_workspace_agents import INPUTS, model_calls, rollout, steps
from tests.support.example_envs import npm_example_env
from tests.support.openai_server import ScriptedOpenAIServer, ScriptedPolicy
from workers import sandbox
from workers.harness_env import harness_env_binds, harness_env_prepare, harness_env_vars
from workers.outcomes import ErrorKind, RolloutOutcome

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "claude-code"
VERSION = "2.1.332"

# Under CI (which installs Node.js and npm) they always run.
pytestmark = pytest.mark.skipif(
    shutil.which("npm") is None and not os.environ.get("CI"), reason="needs Node.js and npm"
)


@pytest.fixture(scope="module")
def env_dir(tmp_path_factory) -> Path:
    """One cache of built environments for the module: Claude Code is installed once."""
    return tmp_path_factory.mktemp("harness-envs")


@pytest.fixture
def claude_env(settings, env_dir):
    with npm_example_env(settings, env_dir, EXAMPLE) as env:
        yield env


def text_of(content) -> str:
    """A chat message's text: the string, or its text parts joined."""
    if isinstance(content, str):
        return content
    return "".join(part["text"] for part in content if part.get("type") == "text")


def test_the_example_pins_claude_code_and_runs_no_install_script():
    manifest = load_manifest(EXAMPLE)
    assert manifest.is_program and manifest.node_lock == "package-lock.json"
    assert not manifest.node_scripts
    assert {"max_turns", "model", "max_output_tokens", "bare"} <= set(manifest.knobs)
    lock = json.loads((EXAMPLE / "package-lock.json").read_text())
    entry = lock["packages"]["node_modules/@anthropic-ai/claude-code"]
    assert entry["version"] == VERSION and entry["hasInstallScript"] is True
    assert json.loads((EXAMPLE / "package.json").read_text())["dependencies"] == {
        "@anthropic-ai/claude-code": VERSION
    }


def test_claude_code_starts_in_the_sandbox_without_its_postinstall(claude_env):
    meta = json.loads((claude_env.path.parent / "env.json").read_text())
    assert meta["node"]["install_scripts"] == [f"@anthropic-ai/claude-code@{VERSION}"]
    launcher = "/opt/harness-env/node_modules/@anthropic-ai/claude-code/cli-wrapper.cjs"
    run = sandbox.run(
        [shutil.which("node") or "node", launcher, "--version"],
        timeout_s=60,
        ro_binds=harness_env_binds(claude_env.path),
        env=harness_env_vars(claude_env.path, pythonpath="/opt/coevo"),
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.decode().strip() == f"{VERSION} (Claude Code)"


def test_the_cached_environment_is_used_again_at_once(claude_env):
    with harness_env_prepare(harness_dir=EXAMPLE) as again:
        assert not again.built and again.key == claude_env.key
        assert again.seconds < 0.5


# Claude Code's Edit tool (its schema in the first request: file_path, old_string, new_string,
# replace_all), then its final answer once the tool result says the file was updated.
EDIT = {"file_path": "/app/greet.py", "old_string": "Helo", "new_string": "Hello"}


def test_claude_code_fixes_the_workspace_task_with_its_edit_tool(claude_env):
    policy = ScriptedPolicy(
        rules=[("has been updated", "Fixed the typo in greet.py.")],
        tool_rules=[("Fix the typo", [("Edit", EDIT)])],
        default="Nothing to do.",
    )
    with ScriptedOpenAIServer(policy) as server:
        result = rollout(EXAMPLE, server.url, harness_env=claude_env.path)
    assert (result.outcome, result.score) == (RolloutOutcome.PASSED, 1.0), (
        result.detail,
        result.steps,
    )
    first, second = sorted(steps(result, "model_call"), key=lambda c: c.get("call", 0))
    offered = {tool["function"]["name"]: tool["function"] for tool in first["tools"]}
    assert {"Bash", "Edit", "Read"} <= set(offered)
    assert {"file_path", "old_string", "new_string"} <= set(
        offered["Edit"]["parameters"]["properties"]
    )
    # The max_output_tokens knob, not Claude Code's 128000; its extended-thinking and context
    # management keys have no chat counterpart and are listed as dropped.
    assert first["sampling"]["max_tokens"] == 4096
    assert {"thinking", "context_management"} <= set(first["dropped"])
    said = [text_of(m["content"]) for m in first["messages"] if m["role"] == "user"]
    assert said == [INPUTS["instruction"]]  # the instruction as the prompt, nothing added
    # Claude Code marks its prompt for Anthropic's prompt cache: the marker rides with the
    # message (for an anthropic endpoint), and this endpoint's kind was sent it without.
    (user,) = [m for m in first["messages"] if m["role"] == "user"]
    assert [part.get("cache_control") for part in user["content"]] == [{"type": "ephemeral"}]
    assert "cache_control" in first["dropped"]
    (call,) = second["messages"][-2]["tool_calls"]
    assert call["function"]["name"] == "Edit"
    assert steps(result, "answer") == [{"answer": "Fixed the typo in greet.py."}]
    (diff,) = steps(result, "workspace_diff")
    assert [row["path"] for row in diff["files"]] == ["greet.py"]


def test_a_call_the_policy_server_refuses_ends_claude_code_and_the_workspace_is_judged(
    claude_env,
):
    """A conversation past the policy's context (Gemma 3 270M's 4,096 tokens hold little more
    than Claude Code's system prompt): the boundary passes the server's 400 on, Claude Code
    ends its run with that error, and the hidden tests judge the workspace as it stands."""
    policy = ScriptedPolicy(default="Done.", context_tokens=50)
    with ScriptedOpenAIServer(policy) as server:
        result = rollout(EXAMPLE, server.url, harness_env=claude_env.path)
    assert (result.outcome, result.score) == (RolloutOutcome.TASK_FAILURE, 0.0), result.detail
    (output,) = steps(result, "program_output")
    assert output["exit_code"] == 0
    assert '"api_error_status":400' in output["stdout"]


def test_a_claude_code_that_never_stops_runs_into_max_model_calls(claude_env):
    """Every reply another command, and Claude Code's own --max-turns above the manifest's
    max_model_calls: the boundary answers the 41st call 429 and the rollout ends as the limit,
    whatever Claude Code does with the refusal (its SDK retries a 429)."""
    ls = [("Bash", {"command": "ls", "description": "List the workspace"})]
    policy = ScriptedPolicy(tool_rules=[("", ls)])
    with ScriptedOpenAIServer(policy) as server:
        result = rollout(EXAMPLE, server.url, harness_env=claude_env.path, knobs={"max_turns": 200})
    assert result.outcome == RolloutOutcome.HARNESS_ERROR, result.detail
    assert result.error_kind == ErrorKind.LIMIT
    assert result.detail == "limit exceeded: max_model_calls = 40"
    calls = model_calls(result)
    assert len(calls) == 40
    assert all([c["name"] for c in call["tool_calls"]] == ["Bash"] for call in calls)


def test_its_own_max_turns_ends_claude_code_first_and_the_workspace_is_judged(claude_env):
    """Every reply another command, and the knob max_turns below max_model_calls: Claude Code
    stops on its own turn limit (it exits 1 with a result of subtype error_max_turns), as
    mini-swe-agent on its step_limit; that is the agent's end, not a harness error, and the
    hidden tests judge the workspace as it stands."""
    ls = [("Bash", {"command": "ls", "description": "List the workspace"})]
    policy = ScriptedPolicy(tool_rules=[("", ls)])
    with ScriptedOpenAIServer(policy) as server:
        result = rollout(EXAMPLE, server.url, harness_env=claude_env.path, knobs={"max_turns": 3})
    assert (result.outcome, result.score) == (RolloutOutcome.TASK_FAILURE, 0.0), result.detail
    (output,) = steps(result, "program_output")
    assert output["exit_code"] == 0
    claude = json.loads(output["stdout"].strip().splitlines()[-1])
    assert (claude["subtype"], claude["terminal_reason"]) == ("error_max_turns", "max_turns")
    assert claude["errors"] == ["Reached maximum number of turns (3)"]
    calls = model_calls(result)
    assert len(calls) == 3
    assert all([c["name"] for c in call["tool_calls"]] == ["Bash"] for call in calls)
    assert steps(result, "answer") == [{"answer": ""}]


def test_claude_code_solves_the_shipped_task_on_a_real_worker(
    celery_worker_thread, project, policy_version, scripted_policy, claude_env, tmp_path
):
    scripted_policy.rules[:] = [("has been updated", "Fixed the typo in greet.py.")]
    scripted_policy.tool_rules[:] = [("Fix the typo", [("Edit", EDIT)])]
    scripted_policy.default = "Nothing to do."
    rollout = shipped_task_solve(project, "claude-code", policy_version, tmp_path)
    assert (rollout.outcome, rollout.score) == (RolloutOutcome.PASSED, 1.0), rollout.detail
    calls = trace_payloads(rollout, "model_call")
    assert [[c["name"] for c in call["tool_calls"]] for call in calls] == [["Edit"], []]
    assert trace_payloads(rollout, "answer") == [{"answer": "Fixed the typo in greet.py."}]
    (diff,) = trace_payloads(rollout, "workspace_diff")
    assert [row["path"] for row in diff["files"]] == ["greet.py"]
