"""The shipped agentic proposer (examples/proposers/agentic: a program on the OpenAI SDK, its
dependencies built with uv from the local wheel directory) on a tiny parent harness, through
the real runner, sandbox and exec helper of the proposing environment: /app is a writable copy
of the parent's tree, /history the campaign's record, read-only. The scripted server plays the
proposer's model, so each edit is exact; what the program leaves in /app is the proposal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coevo.policies.client import PolicyClient
from harness_store.manifest import load_manifest
from tests.support.example_envs import wheel_example_env
from tests.support.openai_server import ScriptedOpenAIServer, ScriptedPolicy
from workers.environments import proposing
from workers.environments.workspace import Workspace
from workers.environments.workspace_files import tree_changes
from workers.outcomes import RolloutOutcome
from workers.rollout import RolloutInputs, TaskEnvironment, execute_rollout

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PROPOSER = EXAMPLES / "proposers/agentic"

MANIFEST = """[harness]
name = "tiny"
entrypoint = "agent:run"
policy_api = "chat"
components = ["agent.py", "harness.toml"]
"""
AGENT = 'PROMPT = "Answer with a command."\n\n\ndef run(task, ctx):\n    return PROMPT\n'
OLD_LINE = 'PROMPT = "Answer with a command."\n'
NEW_LINE = 'PROMPT = "Answer with one of the listed commands, exactly as written."\n'
NEW_AGENT = AGENT.replace(OLD_LINE, NEW_LINE)
README = "A tiny harness.\n"
PARENT = {
    "harness.toml": {"text": MANIFEST},
    "agent.py": {"text": AGENT},
    "README.md": {"text": README},
}
COMPONENTS = ["agent.py", "harness.toml"]
# The failing trace the model must have read: it is only in /history/record.md.
TRACE = "the policy answered 'walk to the kitchen', which is not a listed command: 0 points"
RECORD = f"""# Campaign record

## The parent's editable files
agent.py (see /app)

## Failed search tasks
### tw-cooking-3 (score 0.0)
step 1: {TRACE}
"""
INSTRUCTION = "Propose one improvement to the parent harness 1a2b3c4 (components: agent.py)."
HYPOTHESIS = "The policy invents commands: ask it to answer with a listed command verbatim."
CHECK = 'python -c "import agent; print(agent.PROMPT)"'


@pytest.fixture(scope="module")
def env_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("harness-envs")


@pytest.fixture
def proposer_env(settings, env_dir):
    """The proposer's declared dependencies, built from the wheel directory (no index)."""
    with wheel_example_env(settings, env_dir, PROPOSER) as path:
        yield path


@pytest.fixture
def history(tmp_path) -> Path:
    root = tmp_path / "history"
    (root / "candidates/1a2b3c4").mkdir(parents=True)
    (root / "record.md").write_text(RECORD)
    (root / "shown.json").write_text(json.dumps({"proposals": []}))
    (root / "candidates/1a2b3c4/agent.py").write_text(AGENT)
    return root


def propose(policy: ScriptedPolicy, history: Path, harness_env: Path, **knobs):
    """(the rollout's result, the proposal: what /app holds that the parent did not)."""
    workspace = Workspace.create(PARENT, ro_binds={history: proposing.HISTORY_MOUNT})
    inputs = {"instruction": INSTRUCTION, "files": PARENT, "components": COMPONENTS}
    environment = TaskEnvironment(
        adapter=proposing.ENVIRONMENT, inputs=inputs, verifier={}, workspace=workspace
    )
    rollout = RolloutInputs(
        harness_dir=PROPOSER,
        task_key="propose",
        task_view=proposing.harness_view(inputs),
        knob_overrides=knobs,
        seed=0,
        wall_time_s=120,
        policy_version="proposer",
        harness_env=harness_env,
    )
    try:
        with (
            ScriptedOpenAIServer(policy) as server,
            PolicyClient(server.url, model="scripted", retries=0) as client,
        ):
            result = execute_rollout(rollout, policy=client, environment=environment)
        changes = tree_changes(PARENT, workspace.root, max_files=100, max_bytes=10**6)
    finally:
        workspace.close()
    return result, changes


def model_calls(result) -> list[dict]:
    return sorted(
        (s.payload for s in result.steps if s.kind == "model_call"), key=lambda c: c["call"]
    )


def tool_names(calls: list[dict]) -> list[str | None]:
    return [c["tool_calls"][0]["name"] if c["tool_calls"] else None for c in calls]


def shown(call: dict) -> str:
    """What the model was shown last: the tool result (or message) its call answers."""
    return call["messages"][-1]["content"]


def commands(result) -> list[str]:
    return [
        s.payload["params"]["command"]
        for s in result.steps
        if s.kind == "helper_call" and s.payload["name"] == "exec"
    ]


def test_it_is_a_program_with_the_workspace_agents_pins():
    manifest = load_manifest(PROPOSER)
    assert manifest.is_program and manifest.knobs["mode"].default == "tools"
    # One set of wheels serves the example agents and this proposer.
    assert (PROPOSER / "requirements.txt").read_bytes() == (
        EXAMPLES / "workspace-agent/requirements.txt"
    ).read_bytes()


def test_it_reads_the_record_edits_a_component_checks_it_and_finishes(history, proposer_env):
    policy = ScriptedPolicy(
        tool_rules=[
            # The first message holds the instruction, each later one the last tool's result.
            (INSTRUCTION, [("read_file", {"path": "/history/record.md"})]),
            (
                "record.md: lines 1-",
                [
                    (
                        "replace_in_file",
                        {"path": "agent.py", "search": OLD_LINE, "replace": NEW_LINE},
                    )
                ],
            ),
            ("replaced 1 occurrence in agent.py", [("run_command", {"command": CHECK})]),
            ("exit code 0", [("finish", {"hypothesis": HYPOTHESIS})]),
        ],
        default="I am not sure.",
    )
    # record_chars = 0: the record reaches the model only through read_file on /history.
    result, changes = propose(policy, history, proposer_env, record_chars=0)
    assert result.outcome == RolloutOutcome.PASSED, result.detail
    assert changes == {"agent.py": NEW_AGENT.encode()}
    assert result.answer == HYPOTHESIS
    calls = model_calls(result)
    assert tool_names(calls) == ["read_file", "replace_in_file", "run_command", "finish"]
    assert [c["relation"] for c in calls[1:]] == ["continues"] * 3
    first = calls[0]["messages"]
    assert "1. Read /history/record.md" in first[0]["content"]  # the system prompt
    assert INSTRUCTION in shown(calls[0]) and TRACE not in shown(calls[0])
    assert TRACE in shown(calls[1])  # read from /history inside the sandbox
    # The command ran in /app on the edited file, through the exec helper (traced).
    assert commands(result) == [CHECK]
    assert "listed commands, exactly as written" in shown(calls[3])
    assert {t["function"]["name"] for t in calls[0]["tools"]} == {
        "list_dir",
        "read_file",
        "grep",
        "write_file",
        "replace_in_file",
        "run_command",
        "finish",
    }
    assert (history / "record.md").read_text() == RECORD


def test_edits_outside_the_components_are_refused_to_the_model(history, proposer_env):
    outside = "outside the declared components (agent.py, harness.toml)"
    policy = ScriptedPolicy(
        tool_rules=[
            (INSTRUCTION, [("write_file", {"path": "README.md", "content": "Rewritten.\n"})]),
            (outside, [("write_file", {"path": "/history/record.md", "content": "gone\n"})]),
            (
                "is not in the workspace /app",
                [
                    (
                        "replace_in_file",
                        {
                            "path": "harness.toml",
                            "search": '"tiny"',
                            "replace": '"tiny"\ncommand = ["sh"]',
                        },
                    )
                ],
            ),
            ("may not change", [("finish", {"hypothesis": HYPOTHESIS})]),
            (
                "no file in /app differs from the parent",
                [("write_file", {"path": "/app/agent.py", "content": NEW_AGENT})],
            ),
            ("wrote agent.py", [("finish", {"hypothesis": HYPOTHESIS})]),
        ],
        default="I am not sure.",
    )
    result, changes = propose(policy, history, proposer_env)
    assert result.outcome == RolloutOutcome.PASSED, result.detail
    calls = model_calls(result)
    assert tool_names(calls) == [
        "write_file",
        "write_file",
        "replace_in_file",
        "finish",
        "write_file",
        "finish",
    ]
    assert shown(calls[1]).startswith("error: README.md is " + outside)
    assert shown(calls[2]).startswith("error: /history/record.md is not in the workspace /app")
    assert shown(calls[3]).startswith(
        "error: harness.toml's [harness] command may not change (it is the contract)"
    )
    assert shown(calls[4]).startswith("error: no file in /app differs from the parent yet")
    # Only the one edit in a component is proposed; the refused ones reached no disk.
    assert changes == {"agent.py": NEW_AGENT.encode()}
    assert (history / "record.md").read_text() == RECORD
    assert result.answer == HYPOTHESIS


ONESHOT_BLOCKS = f"""<<<<<<< SEARCH agent.py
{OLD_LINE}=======
{NEW_LINE}>>>>>>> REPLACE
<<<<<<< SEARCH README.md
{README}=======
Rewritten.
>>>>>>> REPLACE
<<<<<<< SEARCH agent.py
def missing():
=======
def other():
>>>>>>> REPLACE
"""


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_oneshot_applies_the_blocks_that_match_once_inside_the_components(
    api, history, proposer_env
):
    # A completions prompt ends with "HYPOTHESIS:", so the base model continues from there.
    if api == "chat":
        answer = f"HYPOTHESIS: {HYPOTHESIS}\n```\n{ONESHOT_BLOCKS}```\n"
    else:
        answer = f" {HYPOTHESIS}\n{ONESHOT_BLOCKS}"
    policy = ScriptedPolicy(rules=[("CAMPAIGN RECORD", answer)], default="no idea")
    result, changes = propose(policy, history, proposer_env, mode="oneshot", api=api)
    assert result.outcome == RolloutOutcome.PASSED, result.detail
    assert changes == {"agent.py": NEW_AGENT.encode()}
    assert result.answer == HYPOTHESIS
    (call,) = model_calls(result)
    prompt = call["prompt"] if api == "completions" else shown(call)
    assert TRACE in prompt and AGENT in prompt and INSTRUCTION in prompt
    assert "tools" not in call
    output = next(s.payload for s in result.steps if s.kind == "program_output")
    assert "applied 1 of 3 blocks" in json.dumps(output)


def test_it_browses_the_history_and_stops_at_max_turns_without_a_proposal(history, proposer_env):
    policy = ScriptedPolicy(
        tool_rules=[
            ("1a2b3c4/agent.py:1:", []),  # grep's result: the model answers in prose
            (INSTRUCTION, [("list_dir", {"path": "/history"})]),
            ("shown.json (", [("grep", {"pattern": "PROMPT =", "path": "/history/candidates"})]),
        ],
        default="The earlier candidate had the same prompt.",
    )
    result, changes = propose(policy, history, proposer_env, max_turns=3)
    assert result.outcome == RolloutOutcome.PASSED, result.detail
    assert changes == {} and result.answer is None
    calls = model_calls(result)
    assert tool_names(calls) == ["list_dir", "grep", None]
    assert TRACE in shown(calls[0])  # record_chars: the record's head comes first
    assert shown(calls[1]).splitlines() == [
        "candidates/",
        f"record.md ({len(RECORD.encode())} bytes)",
        "shown.json (17 bytes)",
    ]
    assert shown(calls[2]) == f"/history/candidates/1a2b3c4/agent.py:1:{OLD_LINE}"
    output = next(s.payload for s in result.steps if s.kind == "program_output")
    assert "stopped after max_turns = 3; changed: nothing" in output["stdout"]
