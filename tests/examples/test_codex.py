"""examples/codex: Codex CLI, unmodified (the npm release its lock pins, installed by the
worker's npm build from the test npm cache, no install script), on the shipped workspace task
through the real runner, sandbox, Responses boundary and verifier. The scripted server plays the
model; its tool call is Codex's own exec_command tool with the arguments its schema asks for."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

# playwright's sync API runs an event loop in this thread (the page test below); the ORM calls
# made while it runs are still plain synchronous calls.
os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

from playwright.sync_api import expect  # noqa: E402

from harness_store.manifest import load_manifest  # noqa: E402
from tests.conftest import PASSWORD  # noqa: E402
from tests.evaluations.test_program_worker import shipped_task_solve, trace_payloads  # noqa: E402
from tests.examples.test_workspace_agents import INPUTS, model_calls, rollout, steps  # noqa: E402
from tests.support.browser import log_in  # noqa: E402
from tests.support.example_envs import npm_example_env  # noqa: E402
from tests.support.openai_server import ScriptedOpenAIServer, ScriptedPolicy  # noqa: E402
from tests.web.test_trace_program import url  # noqa: E402
from workers import sandbox  # noqa: E402
from workers.harness_env import (  # noqa: E402
    harness_env_binds,
    harness_env_prepare,
    harness_env_vars,
)
from workers.outcomes import ErrorKind, RolloutOutcome  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "codex"
VERSION = "0.171.0"
PLATFORMS = ("darwin-arm64", "darwin-x64", "linux-arm64", "linux-x64", "win32-arm64", "win32-x64")

# Under CI (which installs Node.js and npm) they always run.
pytestmark = pytest.mark.skipif(
    shutil.which("npm") is None and not os.environ.get("CI"), reason="needs Node.js and npm"
)


@pytest.fixture(scope="module")
def env_dir(tmp_path_factory) -> Path:
    """One cache of built environments for the module: Codex is installed once."""
    return tmp_path_factory.mktemp("harness-envs")


@pytest.fixture
def codex_env(settings, env_dir):
    with npm_example_env(settings, env_dir, EXAMPLE) as env:
        yield env


def test_the_example_pins_codex_and_needs_no_install_script():
    manifest = load_manifest(EXAMPLE)
    assert manifest.is_program and manifest.node_lock == "package-lock.json"
    assert not manifest.node_scripts
    assert set(manifest.knobs) == {"reasoning_effort", "context_window", "skills"}
    assert json.loads((EXAMPLE / "package.json").read_text())["dependencies"] == {
        "@openai/codex": VERSION
    }
    packages = json.loads((EXAMPLE / "package-lock.json").read_text())["packages"]
    assert packages["node_modules/@openai/codex"]["version"] == VERSION
    # Each platform's binary is the same package under another version, installed by an alias.
    for platform in PLATFORMS:
        entry = packages[f"node_modules/@openai/codex-{platform}"]
        assert (entry["name"], entry["version"]) == ("@openai/codex", f"{VERSION}-{platform}")
        assert entry["optional"] is True
    assert not any(entry.get("hasInstallScript") for entry in packages.values())


def test_codex_starts_in_the_sandbox_from_its_platform_package(codex_env):
    meta = json.loads((codex_env.path.parent / "env.json").read_text())
    assert meta["node"]["install_scripts"] == []
    run = sandbox.run(
        [shutil.which("node") or "node", "/opt/harness-env/bin/codex", "--version"],
        timeout_s=60,
        ro_binds=harness_env_binds(codex_env.path),
        env=harness_env_vars(codex_env.path, pythonpath="/opt/coevo"),
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.decode().strip() == f"codex-cli {VERSION}"


def test_the_cached_environment_is_used_again_at_once(codex_env):
    with harness_env_prepare(harness_dir=EXAMPLE) as again:
        assert not again.built and again.key == codex_env.key
        assert again.seconds < 0.5


# Codex's command tool (unified exec; its schema in the first request: cmd, workdir, tty, …),
# then its final message once the tool result says the command exited with code 0.
SED = {"cmd": "sed -i 's/Helo/Hello/' greet.py", "workdir": "/app"}
EXITED = "Process exited with code 0"


def test_codex_fixes_the_workspace_task_with_a_shell_command(codex_env):
    policy = ScriptedPolicy(
        rules=[(EXITED, "Fixed the typo in greet.py.")],
        tool_rules=[("Fix the typo", [("exec_command", SED)])],
        default="Nothing to do.",
    )
    with ScriptedOpenAIServer(policy) as server:
        result = rollout(EXAMPLE, server.url, harness_env=codex_env.path)
    assert (result.outcome, result.score) == (RolloutOutcome.PASSED, 1.0), (
        result.detail,
        result.steps,
    )
    first, second = model_calls(result)
    assert first["spoken"] == second["spoken"] == "responses"
    assert (second["session"], second["parent"], second["relation"]) == (0, 0, "continues")
    # Function tools only: no web_search, no sub-agent namespace, no freeform apply_patch.
    offered = {tool["function"]["name"]: tool["function"] for tool in first["tools"]}
    assert {"exec_command", "write_stdin"} <= set(offered)
    assert all(tool["type"] == "function" for tool in first["tools"])
    assert {"cmd", "workdir"} <= set(offered["exec_command"]["parameters"]["properties"])
    # Codex's developer messages become system messages; its prompt is the instruction as it is.
    assert first["messages"][0]["role"] == "system"
    assert "Codex CLI" in first["messages"][0]["content"]
    assert first["messages"][-1] == {"role": "user", "content": INPUTS["instruction"]}
    assert not any("<skills_instructions>" in str(m["content"]) for m in first["messages"])
    # Keys with no chat counterpart are listed as dropped, none refused.
    assert {"reasoning", "include", "prompt_cache_key"} <= set(first["dropped"])
    (call,) = second["messages"][-2]["tool_calls"]
    assert call["function"]["name"] == "exec_command"
    assert EXITED in second["messages"][-1]["content"]
    assert steps(result, "answer") == [{"answer": "Fixed the typo in greet.py."}]
    (diff,) = steps(result, "workspace_diff")
    assert [row["path"] for row in diff["files"]] == ["greet.py"]
    (output,) = steps(result, "program_output")
    assert '"type":"command_execution"' in output["stdout"]  # its own JSONL events


# Codex's own way to edit a file: its apply_patch format through the command tool, which Codex
# intercepts and applies itself (no helper binary on PATH is needed for it).
PATCH = """apply_patch <<'EOF'
*** Begin Patch
*** Update File: greet.py
@@
-    return f"Helo, {name}!"
+    return f"Hello, {name}!"
*** End Patch
EOF
"""


def test_codex_applies_its_own_patch_format_through_the_command_tool(codex_env):
    policy = ScriptedPolicy(
        rules=[("Success. Updated the following files", "Patched greet.py.")],
        tool_rules=[("Fix the typo", [("exec_command", {"cmd": PATCH, "workdir": "/app"})])],
        default="Nothing to do.",
    )
    with ScriptedOpenAIServer(policy) as server:
        result = rollout(EXAMPLE, server.url, harness_env=codex_env.path)
    assert (result.outcome, result.score) == (RolloutOutcome.PASSED, 1.0), (
        result.detail,
        result.steps,
    )
    assert steps(result, "answer") == [{"answer": "Patched greet.py."}]
    (output,) = steps(result, "program_output")
    assert '"type":"file_change"' in output["stdout"]


def test_a_codex_that_never_stops_runs_into_max_model_calls(codex_env):
    """Every reply another command: the boundary answers the 41st call 429 and the rollout ends
    as the limit, whatever Codex does with the refusal."""
    ls = [("exec_command", {"cmd": "ls", "workdir": "/app"})]
    policy = ScriptedPolicy(tool_rules=[("Fix the typo", ls), (EXITED, ls)])
    with ScriptedOpenAIServer(policy) as server:
        result = rollout(EXAMPLE, server.url, harness_env=codex_env.path)
    assert result.outcome == RolloutOutcome.HARNESS_ERROR, result.detail
    assert result.error_kind == ErrorKind.LIMIT
    assert result.detail == "limit exceeded: max_model_calls = 40"
    assert len(model_calls(result)) == 40


def test_a_call_the_policy_server_refuses_ends_codex_and_the_workspace_is_judged(codex_env):
    """A conversation past the context: the boundary passes the server's 400 on, Codex ends its
    turn as failed (its own record, in its JSONL), and the hidden tests judge the workspace."""
    policy = ScriptedPolicy(default="Done.", context_tokens=50)
    with ScriptedOpenAIServer(policy) as server:
        result = rollout(EXAMPLE, server.url, harness_env=codex_env.path)
    assert (result.outcome, result.score) == (RolloutOutcome.TASK_FAILURE, 0.0), result.detail
    (output,) = steps(result, "program_output")
    assert output["exit_code"] == 0 and '"type":"turn.failed"' in output["stdout"]
    assert "context_length_exceeded" in output["stdout"]
    assert steps(result, "answer") == [{"answer": ""}]


def test_a_reply_cut_at_the_token_limit_ends_codex_and_the_workspace_is_judged(codex_env):
    """A policy whose context Codex's own prompt nearly fills (Gemma 3 270M's 4,096 tokens)
    cuts its reply at the limit: the Responses reply is incomplete, Codex fails its turn, and
    the hidden tests judge the workspace instead of the run counting as the harness's error."""
    policy = ScriptedPolicy(default="Do", finish_reason="length")
    with ScriptedOpenAIServer(policy) as server:
        result = rollout(EXAMPLE, server.url, harness_env=codex_env.path)
    assert (result.outcome, result.score) == (RolloutOutcome.TASK_FAILURE, 0.0), result.detail
    (output,) = steps(result, "program_output")
    assert output["exit_code"] == 0
    assert "Incomplete response returned" in output["stdout"]


@pytest.mark.browser
def test_codex_solves_the_shipped_task_on_a_real_worker_and_its_page_shows_the_trace(
    celery_worker_thread,
    live_server,
    page,
    owner,
    project,
    policy_version,
    scripted_policy,
    codex_env,
    tmp_path,
):
    """The shipped task evaluated by a real worker, then its rollout page in headless Chromium:
    the calls Codex made, the tool call the model answered with and its result as Codex sent it
    back, and the one session they form."""
    scripted_policy.rules[:] = [(EXITED, "Fixed the typo in greet.py.")]
    scripted_policy.tool_rules[:] = [("Fix the typo", [("exec_command", SED)])]
    scripted_policy.default = "Nothing to do."
    rollout = shipped_task_solve(project, "codex", policy_version, tmp_path)
    assert (rollout.outcome, rollout.score) == (RolloutOutcome.PASSED, 1.0), rollout.detail
    calls = trace_payloads(rollout, "model_call")
    assert [[c["name"] for c in call["tool_calls"]] for call in calls] == [["exec_command"], []]
    assert trace_payloads(rollout, "answer") == [{"answer": "Fixed the typo in greet.py."}]

    log_in(page, live_server.url, "owner", PASSWORD)
    page.goto(live_server.url + url(project, rollout))
    overview = page.locator("#call-overview")
    expect(overview.locator("summary")).to_have_text(re.compile(r"2 model calls in 1 session"))
    expect(overview.locator(".session")).to_have_count(1)
    expect(overview.locator(".call-link")).to_have_count(2)
    first, second = page.locator("li.step-model_call").all()
    expect(first).to_contain_text("(the harness spoke responses)")
    expect(second.locator(".call-place")).to_have_text("call #1 · session 1 · continues #0")
    first.locator("details.model-call > summary").click()
    tool_call = first.locator(".tool-call")
    expect(tool_call).to_contain_text("calls exec_command")
    expect(tool_call.locator(".arguments")).to_contain_text("sed -i 's/Helo/Hello/' greet.py")
    second.locator("details.model-call > summary").click()
    expect(second).to_contain_text(re.compile(r"tool result for exec_command \(\S+\)"))
    expect(second).to_contain_text(EXITED)
    expect(page.locator("li.step-answer")).to_contain_text("Fixed the typo in greet.py.")
