"""The harness itself in its task's container, on the real engine: the worker's Python and
Node.js brought into an image that has neither (workers/containers/host_runtime.py), a program
and a run(task, ctx) harness whose own processes see the image's files and tools and change the
container's, and Codex CLI, unmodified, fixing a task with its own shell. Each task's tests pass
only where the agent worked in the container: its /opt, not the worker's."""

from __future__ import annotations

import json
import os
import shutil
import textwrap
from pathlib import Path

import pytest

from tests.containers.conftest import TASK_BASE
from tests.containers.test_task_workspace import VERIFIER, inputs
from tests.examples.test_claude_code import EXAMPLE as CLAUDE_CODE
from tests.examples.test_claude_code import claude_env  # noqa: F401  (a fixture)
from tests.examples.test_codex import EXAMPLE as CODEX
from tests.examples.test_codex import EXITED, codex_env, env_dir  # noqa: F401  (fixtures)
from tests.examples.test_workspace_agents import model_calls, rollout, steps
from tests.support.openai_server import ScriptedOpenAIServer, ScriptedPolicy
from workers.containers.host_runtime import MOUNT, host_runtime
from workers.containers.process import ContainerProcess
from workers.containers.session import TaskContainer
from workers.environments.workspace import Workspace
from workers.outcomes import RolloutOutcome

# The fix that test.sh accepts: calc.py's add repaired in /app, and a mark in the container's
# /opt (read-only to a sandbox on the worker, and not the file test.sh looks for there).
FIX = "sed -i 's/a - b/a + b/' /app/repo/calc.py && touch /opt/agent-was-here"


@pytest.fixture
def bare_container(base_image):
    """A container of the Debian base image (no Python, no Node.js) with the bundle bound."""
    runtime = host_runtime()
    container = TaskContainer.start(
        base_image,
        rollout=None,
        cpus=1.0,
        memory_bytes=1024**3,
        pids=256,
        network=False,
        binds=runtime.binds,
    )
    yield runtime, container
    container.remove()


def run_in(container: TaskContainer, argv: list[str]) -> tuple[int, str, str]:
    process = ContainerProcess(container, argv, env={"PATH": "/usr/bin:/bin"}, workdir="/")
    assert process.stdin is not None and process.stdout and process.stderr
    process.stdin.close()
    out, err = process.stdout.read().decode(), process.stderr.read().decode()
    return process.wait(60), out, err


def test_the_workers_interpreters_run_in_an_image_that_has_neither(bare_container):
    runtime, container = bare_container
    assert container.exec(["sh", "-c", "command -v python3 node"], timeout_s=30).returncode != 0
    code, out, err = run_in(
        container,
        [
            runtime.python,
            "-c",
            "import ssl, sqlite3, ctypes, json, subprocess, sys\n"
            "print(sys.prefix)\n"
            # What it starts is the image's: its sh, its Debian release file.
            "print(subprocess.run(['sh', '-c', 'cat /etc/debian_version'],"
            " capture_output=True, text=True).stdout.strip())\n"
            # Started again by its own path, as an agent may.
            "print(subprocess.run([sys.executable, '-c', 'print(6 * 7)'],"
            " capture_output=True, text=True).stdout.strip())\n",
        ],
    )
    assert code == 0, err
    prefix, release, again = out.split("\n")[:3]
    assert prefix == MOUNT and release[:2].isdigit() and again == "42"
    assert runtime.node is not None
    code, out, err = run_in(
        container,
        [
            runtime.node,
            "-e",
            "const cp = require('child_process');"
            "console.log(cp.execFileSync(process.execPath, ['-e', 'console.log(6 * 7)']).toString().trim())",
        ],
    )
    assert (code, out.strip()) == (0, "42"), err


def test_a_killed_harness_ends_with_its_process_tree(bare_container):
    runtime, container = bare_container
    process = ContainerProcess(
        container,
        [runtime.python, "-c", "import subprocess; subprocess.run(['sleep', '600'])"],
        env={"PATH": "/usr/bin:/bin"},
        workdir="/",
    )
    assert process.poll() is None
    process.kill()
    assert process.wait(10) != 0
    left = container.exec(["sh", "-c", "cat /proc/[0-9]*/comm"], timeout_s=30)
    assert left.returncode == 0 and b"sh\n" in left.stdout
    # What is left: the engine's init, the keep-alive `sleep infinity`, this `sh`.
    assert left.stdout.count(b"sleep") == 1 and b"python" not in left.stdout


def program(directory: Path) -> Path:
    """A program that asks the model once through the boundary, then does what it says itself
    (no exec helper): its shell is the container's only if the program runs there."""
    directory.mkdir()
    (directory / "harness.toml").write_text(
        '[harness]\nname = "inside"\ncommand = ["python", "inside.py"]\n'
        "[limits]\nwall_time_s = 60\n"
    )
    (directory / "inside.py").write_text(
        textwrap.dedent(
            """
            import json, os, subprocess, urllib.request
            task = json.load(open(os.environ["COEVO_TASK_FILE"]))
            request = urllib.request.Request(
                os.environ["OPENAI_BASE_URL"] + "/chat/completions",
                data=json.dumps({"model": "x", "max_tokens": 64, "messages": [
                    {"role": "user", "content": task["instruction"]}]}).encode(),
                headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                         "Content-Type": "application/json"})
            command = json.load(urllib.request.urlopen(request))["choices"][0]["message"]["content"]
            made = open("/opt/made-by-run").read().strip()
            done = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
            json.dump({"made": made, "code": done.returncode, "stderr": done.stderr},
                      open(os.environ["COEVO_ANSWER_FILE"], "w"))
            """
        )
    )
    return directory


def test_a_program_harness_works_in_the_tasks_container(tmp_path, base_image, image_map):
    policy = ScriptedPolicy(rules=[("Fix add", FIX)], default="true")
    with ScriptedOpenAIServer(policy) as server:
        result = rollout(program(tmp_path / "inside"), server.url, task=inputs(), verifier=VERIFIER)
    assert (result.outcome, result.score) == (RolloutOutcome.PASSED, 1.0), (
        result.detail,
        result.steps,
    )
    (answer,) = steps(result, "answer")
    assert answer["answer"] == {"made": "built", "code": 0, "stderr": ""}
    (environment,) = steps(result, "environment")
    assert environment["backend"] == "container" and environment["harness"] == "container"
    assert not steps(result, "helper_call")  # it ran its command itself
    (call,) = model_calls(result)
    assert call["messages"][-1]["content"].startswith("Fix add")
    (diff,) = steps(result, "workspace_diff")
    assert [row["path"] for row in diff["files"]] == ["repo/calc.py"]
    # Its own change outside /app is listed; the harness's mounts are not the agent's.
    assert "added /opt/agent-was-here" in diff["outside_app"]["paths"]
    assert not [p for p in diff["outside_app"]["paths"] if "coevo" in p or "harness" in p]


def test_a_run_harness_works_in_the_tasks_container(tmp_path, base_image, image_map):
    harness = tmp_path / "run-inside"
    harness.mkdir()
    (harness / "harness.toml").write_text(
        '[harness]\nname = "run-inside"\nentrypoint = "agent:run"\n[limits]\nwall_time_s = 60\n'
    )
    (harness / "agent.py").write_text(
        "import subprocess\n\n\ndef run(task, ctx):\n"
        f"    subprocess.run(['sh', '-c', {FIX!r}], check=True)\n"
        "    return open('/opt/made-by-run').read().strip()\n"
    )
    with ScriptedOpenAIServer(ScriptedPolicy(default="unused")) as server:
        result = rollout(harness, server.url, task=inputs(), verifier=VERIFIER)
    assert (result.outcome, result.score) == (RolloutOutcome.PASSED, 1.0), (
        result.detail,
        result.steps,
    )
    assert steps(result, "answer") == [{"answer": "built"}]


@pytest.mark.skipif(
    shutil.which("npm") is None and not os.environ.get("CI"), reason="needs Node.js and npm"
)
def test_codex_fixes_a_task_in_its_container_with_its_own_shell(
    codex_env,  # noqa: F811
    base_image,
    image_map,
):
    policy = ScriptedPolicy(
        rules=[(EXITED, "Fixed add.")],
        tool_rules=[("Fix add", [("exec_command", {"cmd": FIX, "workdir": "/app"})])],
        default="Nothing to do.",
    )
    with ScriptedOpenAIServer(policy) as server:
        result = rollout(
            CODEX, server.url, harness_env=codex_env.path, task=inputs(), verifier=VERIFIER
        )
    assert (result.outcome, result.score) == (RolloutOutcome.PASSED, 1.0), (
        result.detail,
        result.steps,
    )
    first, second = model_calls(result)
    assert first["spoken"] == "responses" and EXITED in second["messages"][-1]["content"]
    (environment,) = steps(result, "environment")
    assert environment["harness"] == "container"
    (diff,) = steps(result, "workspace_diff")
    assert "added /opt/agent-was-here" in diff["outside_app"]["paths"]
    assert json.dumps(steps(result, "answer")) == json.dumps([{"answer": "Fixed add."}])


@pytest.mark.skipif(
    shutil.which("npm") is None and not os.environ.get("CI"), reason="needs Node.js and npm"
)
def test_claude_code_fixes_a_task_in_its_container_with_its_own_bash(
    claude_env,  # noqa: F811
    base_image,
    image_map,
):
    policy = ScriptedPolicy(
        tool_rules=[("Fix add", [("Bash", {"command": FIX, "description": "Fix add"})])],
        default="Fixed add.",
    )
    with ScriptedOpenAIServer(policy) as server:
        result = rollout(
            CLAUDE_CODE, server.url, harness_env=claude_env.path, task=inputs(), verifier=VERIFIER
        )
    assert (result.outcome, result.score) == (RolloutOutcome.PASSED, 1.0), (
        result.detail,
        result.steps,
    )
    first, second = model_calls(result)
    assert first["spoken"] == "messages" and second["messages"][-1]["role"] == "tool"
    (environment,) = steps(result, "environment")
    assert environment["harness"] == "container"
    (diff,) = steps(result, "workspace_diff")
    assert "added /opt/agent-was-here" in diff["outside_app"]["paths"]


OWNED = f"""\
FROM {TASK_BASE}
WORKDIR /app
RUN echo x > /app/owned && chown 1234:1234 /app/owned && chmod 664 /app/owned
"""


def test_app_is_owned_as_the_image_has_it_and_what_root_makes_stays_roots(base_image, image_map):
    """Root in the container sees /app as the image left it (git refuses a repository that
    another user owns), and what the agent makes there is root's, as in any container."""
    workspace = Workspace.for_task(inputs(dockerfile=OWNED, context={}))
    try:
        done = workspace.run(
            ["sh", "-c", "stat -c '%u %g %a' owned && touch made && stat -c %u made"],
            timeout_s=30,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.decode().split("\n")[:2] == ["1234 1234 664", "0"]
        assert os.lstat(workspace.root / "made").st_uid == 0
    finally:
        workspace.close()
