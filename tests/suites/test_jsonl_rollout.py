"""A custom suite end to end on the worker side: imported tasks, a real sandboxed harness, the
scripted policy, and the suite's Python verifier in its own sandbox."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from coevo.policies.client import PolicyClient
from coevo.suites.jsonl import scorer_spec_build
from tests.support.factories import make_jsonl_suite
from workers.environments import environment_for
from workers.rollout import RolloutInputs, RolloutOutcome, TaskEnvironment, execute_rollout

pytestmark = pytest.mark.django_db

MANIFEST = """
[harness]
name = "qa"
entrypoint = "agent:run"
policy_api = "completions"

[limits]
max_model_calls = 2
wall_time_s = 30
"""

# Answers with the model's text, and logs exactly what it was shown of the task.
AGENT = """
import json

def run(task, ctx):
    ctx.log("task=" + json.dumps(task, sort_keys=True))
    return ctx.llm.complete(task["input"], max_tokens=8).texts[0].strip()
"""

VERIFIER = """
def score(answer, expected, metadata):
    if metadata.get("explode"):
        raise RuntimeError("verifier exploded")
    return float(answer) == float(expected)
"""


@pytest.fixture
def harness(tmp_path: Path) -> Path:
    directory = tmp_path / "harness"
    directory.mkdir()
    (directory / "harness.toml").write_text(MANIFEST)
    (directory / "agent.py").write_text(textwrap.dedent(AGENT))
    return directory


@pytest.fixture
def verified_suite(project):
    """Two tasks scored by VERIFIER, which raises on the one marked to explode."""
    rows = [
        {"id": "mul", "input": "6 * 7 =", "expected": "42", "metadata": {"topic": "arith"}},
        {"id": "boom", "input": "1 + 1 =", "expected": "2", "metadata": {"explode": True}},
    ]
    return make_jsonl_suite(
        project,
        rows,
        name="arith",
        scorer=scorer_spec_build(kind="python", verifier_name="v.py", verifier_source=VERIFIER),
    )


def roll(suite, key: str, harness: Path, url: str):
    task = suite.tasks.get(key=key)
    adapter = environment_for(suite.kind)
    inputs = RolloutInputs(
        harness_dir=harness,
        task_key=task.key,
        task_view=adapter.harness_view(task.inputs),
        knob_overrides={},
        seed=7,
        wall_time_s=60,
    )
    environment = TaskEnvironment(adapter=adapter, inputs=task.inputs, verifier=task.verifier)
    with PolicyClient(url, model="scripted", retries=1, backoff_s=0.01) as client:
        return execute_rollout(inputs, policy=client, environment=environment)


def test_it_scores_a_custom_task_with_its_python_verifier(verified_suite, harness, scripted_policy):
    scripted_policy.rules.append(("6 * 7 =", " 42"))

    result = roll(verified_suite, "mul", harness, scripted_policy.url)

    assert result.outcome == RolloutOutcome.PASSED, result.detail
    assert result.score == 1.0
    shown = next(s.payload for s in result.steps if s.kind == "log")
    assert json.loads(shown["message"].removeprefix("task=")) == {
        "input": "6 * 7 =",
        "metadata": {"topic": "arith"},
    }


def test_it_ends_a_crashing_verifier_as_a_task_failure_with_the_reason(
    verified_suite, harness, scripted_policy
):
    scripted_policy.rules.append(("1 + 1 =", " 2"))

    result = roll(verified_suite, "boom", harness, scripted_policy.url)

    assert result.outcome == RolloutOutcome.TASK_FAILURE
    assert result.score == 0.0
    assert "the verifier v.py failed: RuntimeError: verifier exploded" in result.detail
