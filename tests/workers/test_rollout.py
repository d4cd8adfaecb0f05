"""The rollout runner against real sandboxed harness processes and a scripted policy server.

Every kind of bad harness must end as a clear ``harness_error`` (with the reason) and leave
the worker able to go on; a policy server that is down is an ``infra_error``, never a score.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from coevo.policies.client import PolicyClient
from tests.conftest import SEED_HARNESS
from tests.support.harnesses import CORRECT, PROBLEM
from tests.support.harnesses import humaneval_rollout as run
from workers.environments import humaneval
from workers.rollout import RolloutInputs, RolloutOutcome, TaskEnvironment, execute_rollout

MANIFEST = """
[harness]
name = "t"
entrypoint = "agent:run"
policy_api = "completions"

[limits]
max_model_calls = {calls}
wall_time_s = {wall}
"""


def make_harness(tmp_path: Path, agent: str, *, calls: int = 4, wall: int = 30) -> Path:
    harness = tmp_path / "harness"
    harness.mkdir()
    (harness / "harness.toml").write_text(MANIFEST.format(calls=calls, wall=wall))
    (harness / "agent.py").write_text(textwrap.dedent(agent))
    return harness


def step_kinds(result) -> list[str]:
    return [step.kind for step in result.steps]


def test_it_passes_the_seed_harness_when_the_model_writes_a_correct_body(scripted_policy):
    scripted_policy.rules.append(("def truncate_number", CORRECT))

    result = run(SEED_HARNESS, scripted_policy.url)

    assert result.outcome == RolloutOutcome.PASSED, result.detail
    assert result.score == 1.0
    assert result.model_calls == 1
    assert result.prompt_tokens > 0 and result.completion_tokens > 0
    assert step_kinds(result) == ["start", "model_call", "answer", "verdict"]
    call = result.steps[1]
    assert call.payload["prompt"] == PROBLEM.prompt
    assert call.payload["completion"] == CORRECT


def test_it_scores_a_wrong_body_as_a_task_failure(scripted_policy):
    scripted_policy.rules.append(("def truncate_number", "    return 0.5\n"))

    result = run(SEED_HARNESS, scripted_policy.url)

    assert result.outcome == RolloutOutcome.TASK_FAILURE
    assert result.score == 0.0
    assert "hidden tests failed" in result.detail


def test_it_sends_knob_values_as_explicit_sampling_parameters(scripted_policy):
    run(SEED_HARNESS, scripted_policy.url, knobs={"max_tokens": 64, "samples": 3})

    assert len(scripted_policy.requests) == 3
    for request in scripted_policy.requests:
        assert request["max_tokens"] == 64
        assert request["temperature"] == 0.6  # sample_temperature, since samples > 1
        assert request["frequency_penalty"] == 0.0
        assert "\ndef " in request["stop"]
    assert len({r["seed"] for r in scripted_policy.requests}) == 3


def test_it_keeps_the_sample_that_passes_the_prompts_own_examples(scripted_policy, tmp_path):
    # Three samples; only the last passes the docstring example (truncate_number(3.5) == 0.5).
    harness = tmp_path / "seed"
    import shutil

    shutil.copytree(SEED_HARNESS, harness)
    answers = iter(["    return 1.0\n", "    return number\n", CORRECT])
    scripted_policy.reply_for = lambda text: next(answers)

    result = run(harness, scripted_policy.url, knobs={"samples": 3})

    assert result.outcome == RolloutOutcome.PASSED, result.detail
    assert result.answer == CORRECT


def test_it_picks_samples_with_the_workers_check_helper_when_the_knob_asks(
    scripted_policy, tmp_path
):
    answers = iter(["    return 1.0\n", CORRECT, "    return number\n"])
    scripted_policy.reply_for = lambda text: next(answers)
    environment = TaskEnvironment(
        adapter=humaneval.HumanEvalEnvironment(),
        inputs={"prompt": PROBLEM.prompt, "entry_point": PROBLEM.entry_point},
        verifier={"test": PROBLEM.test, "entry_point": PROBLEM.entry_point},
    )
    inputs = RolloutInputs(
        harness_dir=SEED_HARNESS,
        task_key=PROBLEM.task_id,
        task_view=humaneval.harness_view(environment.inputs),
        knob_overrides={"samples": 3, "check_with_worker": True},
        seed=7,
        wall_time_s=60,
    )
    with PolicyClient(scripted_policy.url, model="scripted") as client:
        result = execute_rollout(inputs, policy=client, environment=environment)

    assert result.outcome == RolloutOutcome.PASSED, result.detail
    assert result.answer == CORRECT
    checks = [s for s in result.steps if s.kind == "helper_call"]
    assert [c.payload["result"]["passed"] for c in checks] == [False, True, False]


def test_it_ends_a_harness_without_a_manifest_as_a_harness_error(scripted_policy, tmp_path):
    harness = tmp_path / "h"
    harness.mkdir()
    (harness / "agent.py").write_text("def run(task, ctx):\n    return ''\n")

    result = run(harness, scripted_policy.url)

    assert result.outcome == RolloutOutcome.HARNESS_ERROR
    assert "harness.toml is missing" in result.detail
    assert result.score == 0.0
    assert scripted_policy.requests == []


def test_it_ends_a_harness_with_invalid_toml_as_a_harness_error(scripted_policy, tmp_path):
    harness = make_harness(tmp_path, "def run(task, ctx):\n    return ''\n")
    (harness / "harness.toml").write_text("[harness\nname=")

    result = run(harness, scripted_policy.url)

    assert result.outcome == RolloutOutcome.HARNESS_ERROR
    assert "not valid TOML" in result.detail


def test_it_ends_an_entrypoint_module_that_does_not_exist_as_a_harness_error(
    scripted_policy, tmp_path
):
    harness = make_harness(tmp_path, "def run(task, ctx):\n    return ''\n")
    (harness / "agent.py").rename(harness / "other.py")

    result = run(harness, scripted_policy.url)

    assert result.outcome == RolloutOutcome.HARNESS_ERROR
    assert "there is no agent.py" in result.detail


def test_it_ends_an_entrypoint_function_that_does_not_exist_as_a_harness_error(
    scripted_policy, tmp_path
):
    harness = make_harness(tmp_path, "def solve(task, ctx):\n    return ''\n")

    result = run(harness, scripted_policy.url)

    assert result.outcome == RolloutOutcome.HARNESS_ERROR
    assert "could not load entrypoint 'agent:run'" in result.detail
    assert "AttributeError" in result.detail


def test_it_ends_a_crashing_harness_as_a_harness_error_with_its_traceback(
    scripted_policy, tmp_path
):
    harness = make_harness(
        tmp_path,
        """
        def run(task, ctx):
            ctx.log("about to fail")
            raise ValueError("boom")
        """,
    )

    result = run(harness, scripted_policy.url)

    assert result.outcome == RolloutOutcome.HARNESS_ERROR
    assert result.detail == "the harness raised ValueError: boom"
    exception = next(s for s in result.steps if s.kind == "harness_exception")
    assert 'raise ValueError("boom")' in exception.payload["traceback"]
    assert any(s.kind == "log" and s.payload["message"] == "about to fail" for s in result.steps)


def test_it_ends_a_harness_that_prints_garbage_on_stdout_as_a_protocol_violation(
    scripted_policy, tmp_path
):
    harness = make_harness(
        tmp_path,
        """
        def run(task, ctx):
            print("hello from the harness")
            return ""
        """,
    )

    result = run(harness, scripted_policy.url)

    assert result.outcome == RolloutOutcome.HARNESS_ERROR
    assert "protocol violation" in result.detail
    assert "hello from the harness" in result.detail
    assert "ctx.log()" in result.detail


def test_it_ends_a_harness_that_loops_forever_at_its_wall_time(scripted_policy, tmp_path):
    harness = make_harness(
        tmp_path,
        """
        def run(task, ctx):
            while True:
                pass
        """,
        wall=2,
    )

    result = run(harness, scripted_policy.url)

    assert result.outcome == RolloutOutcome.HARNESS_ERROR
    assert result.detail == "limit exceeded: wall time of 2s"


def test_it_ends_a_harness_that_exits_without_answering(scripted_policy, tmp_path):
    harness = make_harness(
        tmp_path,
        """
        import os

        def run(task, ctx):
            os._exit(3)
        """,
    )

    result = run(harness, scripted_policy.url)

    assert result.outcome == RolloutOutcome.HARNESS_ERROR
    assert "exited with code 3 before answering" in result.detail


def test_it_stops_a_harness_at_its_model_call_limit(scripted_policy, tmp_path):
    harness = make_harness(
        tmp_path,
        """
        def run(task, ctx):
            for _ in range(10):
                ctx.llm.complete("hi", max_tokens=4)
            return ""
        """,
        calls=3,
    )

    result = run(harness, scripted_policy.url)

    assert result.outcome == RolloutOutcome.HARNESS_ERROR
    assert result.detail == "limit exceeded: max_model_calls = 3"
    assert len(scripted_policy.requests) == 3
    assert result.model_calls == 3


def test_it_reports_an_unreachable_policy_server_as_an_infra_error(tmp_path):
    result = run(SEED_HARNESS, "http://127.0.0.1:9/v1")

    assert result.outcome == RolloutOutcome.INFRA_ERROR
    assert result.score is None
    assert "did not answer" in result.detail


def test_it_runs_the_harness_without_network_credentials_or_the_worker_files(
    scripted_policy, tmp_path, monkeypatch
):
    monkeypatch.setenv("DATABASE_URL", "postgres://secret@db/coevo")
    harness = make_harness(
        tmp_path,
        f"""
        import os, socket

        def run(task, ctx):
            seen = {{"env": sorted(os.environ)}}
            try:
                socket.create_connection(("127.0.0.1", {scripted_policy.url.split(":")[2].split("/")[0]}), timeout=2)
                seen["network"] = "reachable"
            except OSError as exc:
                seen["network"] = type(exc).__name__
            seen["repo_visible"] = os.path.exists({str(Path(__file__).resolve())!r})
            try:
                open("/harness/new.txt", "w").write("x")
                seen["harness_writable"] = True
            except OSError:
                seen["harness_writable"] = False
            return seen
        """,
    )

    result = run(harness, scripted_policy.url)

    seen = result.answer
    assert "DATABASE_URL" not in seen["env"]
    assert seen["network"] != "reachable"
    assert seen["repo_visible"] is False
    assert seen["harness_writable"] is False


@pytest.mark.parametrize("answer", ["    while True:\n        pass\n"])
def test_it_times_out_hidden_tests_that_never_finish(settings, answer):
    settings.COEVO_VERIFIER_TIMEOUT_S = 2

    verdict = humaneval.verify(
        inputs={"prompt": PROBLEM.prompt},
        verifier={"test": PROBLEM.test, "entry_point": PROBLEM.entry_point},
        answer=answer,
    )

    assert verdict.passed is False
    assert "timed out after 2s" in verdict.detail


def test_it_refuses_to_run_harness_code_without_bwrap(monkeypatch, settings, scripted_policy):
    monkeypatch.setattr("workers.sandbox.shutil.which", lambda name: None)
    settings.COEVO_ALLOW_UNSANDBOXED = False

    result = run(SEED_HARNESS, scripted_policy.url)

    assert result.outcome == RolloutOutcome.INFRA_ERROR
    assert "bubblewrap (bwrap) is not installed" in result.detail
    assert "COEVO_ALLOW_UNSANDBOXED=1" in result.detail
    assert scripted_policy.requests == []


def test_it_runs_unsandboxed_only_when_the_operator_allows_it(
    monkeypatch, settings, scripted_policy
):
    monkeypatch.setattr("workers.sandbox.shutil.which", lambda name: None)
    settings.COEVO_ALLOW_UNSANDBOXED = True
    scripted_policy.rules.append(("def truncate_number", CORRECT))

    result = run(SEED_HARNESS, scripted_policy.url)

    assert result.outcome == RolloutOutcome.PASSED, result.detail


def test_it_ends_a_harness_that_never_reads_its_replies_at_its_wall_time(scripted_policy, tmp_path):
    # Floods the worker with calls and never reads a reply: the worker's writes to the
    # harness's stdin block once the pipe is full, and the wall time must still hold.
    scripted_policy.default = "x" * 60_000
    harness = make_harness(
        tmp_path,
        """
        import json, sys, time

        def run(task, ctx):
            for i in range(3):
                message = {"type": "call", "id": i, "method": "llm.complete",
                           "params": {"prompt": "p", "max_tokens": 8}}
                sys.stdout.write(json.dumps(message) + "\\n")
                sys.stdout.flush()
            time.sleep(60)
        """,
        wall=3,
    )

    result = run(harness, scripted_policy.url)

    assert result.outcome == RolloutOutcome.HARNESS_ERROR
    assert result.detail == "limit exceeded: wall time of 3s"
