"""Program harnesses evaluated end to end: the shipped examples imported as candidates, the
shipped suite, a real Celery worker over the real broker, the model behind the boundary (the
scripted server, for exact tool calls). The OpenAI-SDK agent's declared dependencies are built
with uv from a local wheel directory (scripts/test downloads it; no index is asked)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from coevo.evaluations.models import (
    EvaluationState,
    Rollout,
    TraceStep,
)
from coevo.evaluations.services import evaluation_create
from coevo.suites.harbor import WORKSPACE_DATA_DIR, suite_import_harbor
from coevo.suites.jsonl import scorer_spec_build
from coevo.suites.models import Split
from coevo.suites.services import suite_import_jsonl
from harness_store.services import candidate_import_directory
from tests.conftest import wait_until_final
from tests.examples.test_tool_agents import scripted_model
from tests.support.example_envs import WHEELHOUSE, wheelhouse_use
from workers.outcomes import RolloutOutcome

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def tool_arithmetic_suite(project):
    """examples/suites/tool-arithmetic.jsonl, the tool-using agents' suite."""
    data = (EXAMPLES / "suites/tool-arithmetic.jsonl").read_bytes()
    scorer = scorer_spec_build(kind="numeric", abs_tol=1e-6, rel_tol=1e-9)
    suite, _ = suite_import_jsonl(project=project, name="tool-arithmetic", data=data, scorer=scorer)
    return suite


@pytest.fixture
def suite(project):
    return tool_arithmetic_suite(project)


@pytest.fixture
def model(scripted_policy):
    scripted = scripted_model()
    scripted_policy.rules[:] = scripted.rules
    scripted_policy.tool_rules[:] = scripted.tool_rules
    scripted_policy.default = scripted.default
    return scripted_policy


def import_example(project, name: str):
    candidate, _ = candidate_import_directory(
        project=project, directory=EXAMPLES / name, message=f"{name} example", author_name="t"
    )
    return candidate


def evaluate(
    candidate,
    suite,
    policy_version,
    *,
    task_limit: int | None = 3,
    knobs: dict | None = None,
    timeout_s: float = 240,
):
    """An evaluation of ``candidate`` on the search split, uncached, waited for to its end (a
    real worker runs it: the test's ``celery_worker_thread``)."""
    evaluation = evaluation_create(
        candidate=candidate,
        suite=suite,
        split=Split.SEARCH,
        policy_version=policy_version,
        task_limit=task_limit,
        knobs=knobs,
        use_cache=False,
    )
    return wait_until_final(evaluation, timeout_s=timeout_s)


def shipped_task_solve(project, example: str, policy_version, directory: Path) -> Rollout:
    """``example`` evaluated by a real worker on the shipped fix-greeting-typo task (copied under
    four keys into ``directory``, so that the search split holds one): its one rollout, for
    the caller to judge. The worker prepares the agent's environment as it does for every
    candidate (a module's cache of environments spares it a second build)."""
    for i in range(4):
        shutil.copytree(WORKSPACE_DATA_DIR / "fix-greeting-typo", directory / f"tasks/greet-{i}")
    suite, _, report = suite_import_harbor(
        project=project, name="greeting", directory=directory / "tasks"
    )
    assert not report.refused, report.refused
    evaluation = evaluate(
        import_example(project, example), suite, policy_version, task_limit=1, timeout_s=300
    )
    assert evaluation.state == EvaluationState.FINISHED, evaluation.state_detail
    return Rollout.objects.get(evaluation=evaluation)


def trace_payloads(rollout: Rollout, kind: str) -> list[dict]:
    """The recorded steps of ``kind``, in order: what the rollout page shows."""
    steps = TraceStep.objects.filter(rollout=rollout, kind=kind).order_by("index")
    return [step.payload for step in steps]


def check(evaluation) -> None:
    assert evaluation.state == EvaluationState.FINISHED, evaluation.state_detail
    rollouts = {
        r.task.key: r for r in Rollout.objects.filter(evaluation=evaluation).select_related("task")
    }
    assert set(rollouts) == {"t01", "t02", "t03"}
    outcomes = {key: r.outcome for key, r in rollouts.items()}
    assert outcomes["t01"] == RolloutOutcome.PASSED, rollouts["t01"].detail
    assert outcomes["t03"] == RolloutOutcome.TASK_FAILURE, rollouts["t03"].detail  # no tool called
    calls = [
        s.payload
        for s in TraceStep.objects.filter(rollout=rollouts["t01"], kind="model_call").order_by(
            "index"
        )
    ]
    assert [c["tool_calls"][0]["name"] if c["tool_calls"] else None for c in calls] == [
        "calculate",
        None,
    ]
    assert (calls[1]["session"], calls[1]["parent"], calls[1]["relation"]) == (0, 0, "continues")
    kinds = set(TraceStep.objects.filter(rollout=rollouts["t01"]).values_list("kind", flat=True))
    assert {"start", "model_call", "program_output", "answer", "verdict"} <= kinds


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js")
def test_a_node_program_is_evaluated_on_a_real_worker(
    celery_worker_thread, project, suite, policy_version, model
):
    check(evaluate(import_example(project, "node-agent"), suite, policy_version))


def test_the_openai_sdk_agent_with_its_declared_dependencies_on_a_real_worker(
    celery_worker_thread, project, suite, policy_version, model, settings, tmp_path
):
    wheelhouse_use(settings)
    settings.COEVO_HARNESS_ENV_DIR = tmp_path / "envs"
    evaluation = evaluate(import_example(project, "openai-agent"), suite, policy_version)
    check(evaluation)
    assert any((tmp_path / "envs").rglob("openai/__init__.py"))  # its own openai, built by uv


def test_a_programs_python_imports_its_declared_dependencies_not_the_workers(
    celery_worker_thread, project, policy_version, settings, tmp_path
):
    """The worker's environment has openai too: the answer, openai's path, says which one the
    program imported."""
    settings.COEVO_HARNESS_FIND_LINKS = str(WHEELHOUSE)
    settings.COEVO_HARNESS_ENV_DIR = tmp_path / "envs"
    harness = tmp_path / "which"
    harness.mkdir()
    (harness / "harness.toml").write_text(
        '[harness]\nname = "which"\ncommand = ["python", "which.py"]\n'
        'requirements = "requirements.txt"\n'
    )
    shutil.copy(EXAMPLES / "openai-agent/requirements.txt", harness / "requirements.txt")
    (harness / "which.py").write_text(
        "import json, os, openai\n"
        "json.dump(openai.__file__, open(os.environ['COEVO_ANSWER_FILE'], 'w'))\n"
    )
    candidate, _ = candidate_import_directory(
        project=project, directory=harness, message="which openai", author_name="t"
    )
    rows = b'{"id": "w", "input": "which?", "expected": "/opt/harness-env/openai/.*", "split": "search"}'
    suite, _ = suite_import_jsonl(
        project=project, name="which", data=rows, scorer=scorer_spec_build(kind="regex")
    )
    evaluation = evaluate(candidate, suite, policy_version)
    rollout = Rollout.objects.get(evaluation=evaluation)
    assert rollout.outcome == RolloutOutcome.PASSED, (rollout.answer, rollout.detail)
