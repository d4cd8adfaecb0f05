"""examples/aider: the Aider release, unmodified, built by the worker's uv from the local wheel
directory and run as a program on the small workspace task through the real runner, sandbox,
boundary and verifier. Aider asks for no tools: the scripted server plays the model with replies
in Aider's own edit formats (a SEARCH/REPLACE block, a whole file), and Aider applies them to the
workspace's files itself; the hidden tests decide."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from harness_store.manifest import load_manifest
from tests.evaluations.test_program_worker import shipped_task_solve, trace_payloads
from tests.examples.test_workspace_agents import FIXED, INPUTS, model_calls, rollout, steps
from tests.support.example_envs import WHEELHOUSE, wheel_example_env
from tests.support.openai_server import ScriptedOpenAIServer, ScriptedPolicy
from workers.outcomes import ErrorKind, RolloutOutcome

HARNESS = Path(__file__).resolve().parents[2] / "examples" / "aider"
# A reply in Aider's "diff" edit format (its SEARCH/REPLACE block), as its system prompt asks:
# the file's path alone on a line, then the fenced block.
FIX = (
    "The greeting is misspelled.\n\n"
    "greet.py\n```python\n<<<<<<< SEARCH\n"
    '    return f"Helo, {name}!"\n'
    "=======\n"
    '    return f"Hello, {name}!"\n'
    ">>>>>>> REPLACE\n```\n"
)
# A block whose SEARCH part is in no file: Aider sends the failure back (a reflection).
MISS = FIX.replace("Helo", "Hullo")


@pytest.fixture(scope="module")
def env_dir(tmp_path_factory) -> Path:
    """One cache of built environments for the module: the agent's is built once."""
    return tmp_path_factory.mktemp("harness-envs")


@pytest.fixture
def agent_env(settings, env_dir):
    """Aider and its 107 pinned dependencies, built from the wheel directory (no index is asked)
    and held while the rollout mounts them."""
    with wheel_example_env(settings, env_dir, HARNESS) as path:
        yield path


def run(policy: ScriptedPolicy, agent_env: Path, **knobs):
    with ScriptedOpenAIServer(policy) as server:
        return rollout(HARNESS, server.url, knobs=knobs, harness_env=agent_env)


def summary(result) -> dict:
    """What run.py printed last: one JSON line, after Aider's own output."""
    (output,) = steps(result, "program_output")
    assert output["exit_code"] == 0
    return json.loads(output["stdout"].splitlines()[-1])


def test_the_example_is_a_program_with_every_dependency_pinned():
    manifest = load_manifest(HARNESS)
    assert manifest.is_program and manifest.requirements == "requirements.txt"
    assert manifest.knobs["edit_format"].default == "diff"
    pins = [
        line
        for line in (HARNESS / "requirements.txt").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert "aider-chat==0.86.2" in pins and "litellm==1.81.10" in pins
    assert all("==" in line for line in pins) and len(pins) == 108


def test_aider_applies_its_search_replace_block_and_the_task_passes(agent_env):
    policy = ScriptedPolicy(rules=[("Fix the typo", FIX)], default="I am lost.")
    result = run(policy, agent_env)
    assert (result.outcome, result.score) == (RolloutOutcome.PASSED, 1.0), result.detail
    (call,) = model_calls(result)  # one message, one reply; the lint found nothing to send back
    assert "tools" not in call and "dropped" not in call
    assert call["sampling"]["max_tokens"] == 2048 and call["sampling"]["temperature"] == 0.0
    system, *_, files, ok, instruction = call["messages"]
    assert "*SEARCH/REPLACE block*" in system["content"]  # the "diff" format's own prompt
    # The workspace's files in the chat (Aider without git edits only those), then the
    # instruction as the message, with the edit format's rules after it.
    assert files["role"] == "user" and "I have *added these files to the chat*" in files["content"]
    assert all(name in files["content"] for name in ("greet.py", "test_greet.py", "README.md"))
    assert ok["role"] == "assistant"
    assert instruction["content"].startswith(INPUTS["instruction"])
    assert summary(result) == {
        "agent": "aider 0.86.2",
        "exit_status": "Replied",
        "files": 3,
        "edited": ["greet.py"],
        "reply": FIX.strip(),
        "error": "",
    }
    (output,) = steps(result, "program_output")
    assert "Applied edit to greet.py" in output["stdout"]
    # Nothing tried to reach outside: no update check, price list or browser in its output.
    assert "pypi" not in output["stdout"] and "githubusercontent" not in output["stdout"]
    (diff,) = steps(result, "workspace_diff")
    assert [row["path"] for row in diff["files"]] == ["greet.py"]  # no history files in /app


def test_the_whole_edit_format_writes_the_file_in_full(agent_env):
    whole = f"greet.py\n```python\n{FIXED}```\n"
    policy = ScriptedPolicy(rules=[("Fix the typo", whole)], default="I am lost.")
    result = run(policy, agent_env, edit_format="whole")
    assert (result.outcome, result.score) == (RolloutOutcome.PASSED, 1.0), result.detail
    (call,) = model_calls(result)
    assert "*SEARCH/REPLACE block*" not in call["messages"][0]["content"]
    assert summary(result)["edited"] == ["greet.py"]


def test_an_edit_that_never_applies_ends_at_aiders_own_reflection_limit(agent_env):
    """Aider sends a failed edit back to the model, three times at most (its max_reflections),
    then stops: that is the agent's end, and the hidden tests judge the workspace."""
    policy = ScriptedPolicy(default=MISS)
    result = run(policy, agent_env)
    assert (result.outcome, result.score) == (RolloutOutcome.TASK_FAILURE, 0.0), result.detail
    calls = model_calls(result)
    assert len(calls) == 4
    for call in calls[1:]:
        assert "## SearchReplaceNoExactMatch" in call["messages"][-1]["content"]
    # Aider sends the files again as they now stand after the conversation, so each call
    # shares only the start of the one before: it branches from it.
    assert [(c["relation"], c["parent"]) for c in calls[1:]] == [
        ("branches", 0),
        ("branches", 1),
        ("branches", 2),
    ]
    (output,) = steps(result, "program_output")
    assert "Only 3 reflections allowed, stopping." in output["stdout"]
    ended = summary(result)
    assert (ended["exit_status"], ended["reply"]) == ("ReflectionLimit", MISS.strip())
    assert ended["error"] == "The LLM did not conform to the edit format."
    # Aider's own list of the files its edits named, failed ones too; the workspace is unchanged.
    assert ended["edited"] == ["greet.py"]
    (diff,) = steps(result, "workspace_diff")
    assert diff["files"] == []


def test_a_call_the_policy_server_refuses_ends_aider_with_its_reason(agent_env):
    """A chat past the policy's context: the boundary passes the server's 400 on, LiteLLM raises
    it as a bad request (which Aider does not retry), Aider prints it and ends its message; the
    program exits 0 with the refusal as the reason, and the hidden tests judge the workspace."""
    policy = ScriptedPolicy(default=FIX, context_tokens=50)
    result = run(policy, agent_env)
    assert (result.outcome, result.score) == (RolloutOutcome.TASK_FAILURE, 0.0), result.detail
    assert len(model_calls(result)) == 1
    ended = summary(result)
    assert (ended["exit_status"], ended["edited"], ended["reply"]) == ("CallFailed", [], "")
    assert ended["error"].startswith("litellm.BadRequestError: OpenAIException - ")
    assert "The policy server refused the request (HTTP 400)" in ended["error"]
    assert '"code": "context_length_exceeded"' in ended["error"]


def test_a_call_past_max_model_calls_ends_the_rollout_as_the_limit(agent_env, tmp_path):
    """The example with max_model_calls 2 (the same pins, so the same environment): the third
    call of the reflections is answered 429, which Aider would retry with backoff, and the
    rollout ends at once as the limit."""
    harness = tmp_path / "aider"
    shutil.copytree(HARNESS, harness)
    manifest = harness / "harness.toml"
    manifest.write_text(manifest.read_text().replace("max_model_calls = 12", "max_model_calls = 2"))
    with ScriptedOpenAIServer(ScriptedPolicy(default=MISS)) as server:
        started = time.monotonic()
        result = rollout(harness, server.url, harness_env=agent_env)
        seconds = time.monotonic() - started
    assert result.outcome == RolloutOutcome.HARNESS_ERROR, result.detail
    assert result.error_kind == ErrorKind.LIMIT
    assert result.detail == "limit exceeded: max_model_calls = 2"
    assert len(model_calls(result)) == 2
    assert seconds < 60  # not Aider's minute of backoff


def test_aider_solves_the_shipped_task_on_a_real_worker(
    celery_worker_thread, project, policy_version, scripted_policy, settings, tmp_path, env_dir
):
    settings.COEVO_HARNESS_FIND_LINKS = str(WHEELHOUSE)
    settings.COEVO_HARNESS_ENV_DIR = env_dir
    scripted_policy.rules[:] = [("Fix the typo", FIX)]
    scripted_policy.default = "I am lost."
    rollout = shipped_task_solve(project, "aider", policy_version, tmp_path)
    assert (rollout.outcome, rollout.score) == (RolloutOutcome.PASSED, 1.0), rollout.detail
    assert len(trace_payloads(rollout, "model_call")) == 1
    (diff,) = trace_payloads(rollout, "workspace_diff")
    assert [row["path"] for row in diff["files"]] == ["greet.py"]
