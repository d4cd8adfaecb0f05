"""examples/workspace-agent (a program on the OpenAI SDK, in its bubblewrap sandbox) on a task
that needs its container, through the real runner: its commands run in the task's container,
the files it edits are the container's /app, and the tests judge an image of the final state.
The scripted server plays the model, so each step is exact."""

from __future__ import annotations

from pathlib import Path

from coevo.policies.client import PolicyClient
from tests.containers.test_task_workspace import VERIFIER, inputs
from tests.examples import test_workspace_agents as agents
from tests.examples.test_workspace_agents import AGENT, commands, model_calls, steps
from tests.support.openai_server import ScriptedOpenAIServer, ScriptedPolicy
from workers.environments import workspace as ws_env
from workers.outcomes import RolloutOutcome
from workers.rollout import RolloutInputs, TaskEnvironment, execute_rollout

# The agent's declared dependencies, built once from the wheel directory (no index is asked).
env_dir = agents.env_dir
agent_env = agents.agent_env
FIXED = "def add(a, b):\n    return a + b\n"


def rollout(url: str, *, harness_env: Path, task: dict):
    rollout_inputs = RolloutInputs(
        harness_dir=AGENT,
        task_key="fix-add",
        task_view=ws_env.harness_view(task),
        knob_overrides={"mode": "tools"},
        seed=1,
        wall_time_s=120,
        policy_version="base",
        harness_env=harness_env,
    )
    environment = TaskEnvironment(
        adapter=ws_env.WorkspaceEnvironment(), inputs=task, verifier=VERIFIER
    )
    with PolicyClient(url, model="scripted", retries=0) as client:
        return execute_rollout(rollout_inputs, policy=client, environment=environment)


def test_the_workspace_agent_works_in_the_tasks_container(agent_env, base_image, image_map):
    policy = ScriptedPolicy(
        tool_rules=[
            # The first message holds the instruction, each later one the last tool's result.
            (
                "Fix add",
                [("run_command", {"command": "cat /opt/made-by-run; touch /opt/agent-was-here"})],
            ),
            ("built", [("read_file", {"path": "repo/calc.py"})]),
            ("return a - b", [("write_file", {"path": "/app/repo/calc.py", "content": FIXED})]),
        ],
        default="Fixed add.",
    )
    task = inputs()
    with ScriptedOpenAIServer(policy) as server:
        result = rollout(server.url, harness_env=agent_env, task=task)
    # test.sh needs the fix in /app and the file the command made in /opt, outside /app (only
    # the container's snapshot carries it).
    assert (result.outcome, result.score) == (RolloutOutcome.PASSED, 1.0), result.detail
    calls = model_calls(result)
    assert [c["tool_calls"][0]["name"] if c["tool_calls"] else None for c in calls] == [
        "run_command",
        "read_file",
        "write_file",
        None,
    ]
    # The command ran in the container (the file a RUN step made is there) as root.
    assert calls[1]["messages"][-1]["content"].startswith("exit code 0\nbuilt")
    assert commands(result) == ["cat /opt/made-by-run; touch /opt/agent-was-here"]
    (environment,) = steps(result, "environment")
    assert environment["backend"] == "container" and environment["network"] == "none"
    assert environment["image"].startswith("coevo-task:")
    (diff,) = steps(result, "workspace_diff")
    assert [row["path"] for row in diff["files"]] == ["repo/calc.py"]
    assert steps(result, "verdict")[0]["passed"] is True
