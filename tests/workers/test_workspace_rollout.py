"""Workspace tasks through the real runner, sandbox and verifier: the harness works in /app,
hidden tests from the suite judge a copy of what it leaves, the diff and the test output are
kept in the trace, and tampering with tests or rewards gains nothing."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from coevo.policies.client import PolicyClient
from workers.environments import workspace as ws_env
from workers.outcomes import ErrorKind, RolloutOutcome
from workers.rollout import RolloutInputs, TaskEnvironment, execute_rollout

TEST_SH = """#!/bin/bash
cd /app
python -m pytest -q -p no:cacheprovider /tests/test_hidden.py
if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""
HIDDEN = "from greet import greet\n\ndef test_it():\n    assert greet('ada') == 'hello ada'\n"
START = {
    "greet.py": {"text": "def greet(name):\n    return 'helo ' + name\n"},
    "README.md": {"text": "Fix greet.\n"},
}
INPUTS = {
    "instruction": "Fix greet() in greet.py so that it says hello.",
    "files": START,
    "metadata": {"category": "bugfix"},
    "agent_timeout_s": 60,
}
VERIFIER = {
    "tests": {"test.sh": {"text": TEST_SH, "executable": True}, "test_hidden.py": {"text": HIDDEN}},
    "solution": {
        "solve.sh": {"text": "sed -i 's/helo/hello/' /app/greet.py\n", "executable": True}
    },
    "timeout_s": 60,
}
FIXED = "def greet(name):\n    return 'hello ' + name\n"


def harness(tmp_path: Path, body: str, *, program: bool = False, max_steps: int = 20) -> Path:
    directory = tmp_path / "harness"
    directory.mkdir()
    if program:
        head = '[harness]\nname = "ws"\ncommand = ["python", "agent.py"]\n'
        (directory / "agent.py").write_text(textwrap.dedent(body))
    else:
        head = '[harness]\nname = "ws"\nentrypoint = "agent:run"\n'
        source = "import os, json, subprocess\n\ndef run(task, ctx):\n"
        (directory / "agent.py").write_text(source + textwrap.indent(textwrap.dedent(body), "    "))
    (directory / "harness.toml").write_text(
        head + f"[limits]\nmax_steps = {max_steps}\nwall_time_s = 60\n"
    )
    return directory


def rollout(directory: Path, *, inputs=None, verifier=None):
    inputs = inputs or INPUTS
    environment = TaskEnvironment(
        adapter=ws_env.WorkspaceEnvironment(), inputs=inputs, verifier=verifier or VERIFIER
    )
    rollout_inputs = RolloutInputs(
        harness_dir=directory,
        task_key="fix-greet",
        task_view=ws_env.harness_view(inputs),
        knob_overrides={},
        seed=1,
        wall_time_s=60,
    )
    # No model is asked in these tests: the address is never reached.
    with PolicyClient("http://127.0.0.1:9/v1", model="none", retries=0) as client:
        return execute_rollout(rollout_inputs, policy=client, environment=environment)


def steps(result, kind: str) -> list[dict]:
    return [s.payload for s in result.steps if s.kind == kind]


def test_a_harness_that_fixes_the_workspace_passes_with_its_diff_and_test_output(tmp_path):
    result = rollout(
        harness(
            tmp_path,
            f"""
            assert sorted(task) == ["files", "instruction", "workspace"]
            assert task["files"] == ["README.md", "greet.py"] and task["workspace"] == "/app"
            assert ctx.workspace == "/app"
            open("/app/greet.py", "w").write({FIXED!r})
            return "done"
            """,
        )
    )
    assert (result.outcome, result.score) == (RolloutOutcome.PASSED, 1.0), result.detail
    assert result.detail.startswith("the hidden tests passed (1 passed")
    (diff,) = steps(result, "workspace_diff")
    assert (diff["modified"], diff["added"], diff["deleted"]) == (1, 0, 0)
    (row,) = diff["files"]
    assert row["path"] == "greet.py" and "-    return 'helo ' + name" in row["diff"]
    assert "+    return 'hello ' + name" in row["diff"]
    (verdict,) = steps(result, "verdict")
    assert "1 passed" in verdict["output"]


def test_an_untouched_workspace_fails(tmp_path):
    result = rollout(harness(tmp_path, 'return "nothing"\n'))
    assert (result.outcome, result.score) == (RolloutOutcome.TASK_FAILURE, 0.0)
    assert "1 failed" in result.detail
    assert steps(result, "workspace_diff")[0]["files"] == []


def test_the_harness_never_sees_the_tests_or_the_solution(tmp_path):
    result = rollout(
        harness(
            tmp_path,
            """
            import sys
            seen = [p for p in ("/tests", "/solution", "/logs") if os.path.exists(p)]
            # Everywhere but the system, Python's and the worker's packages (read-only code,
            # wherever the checkout is: a clone under /tmp has its venv there).
            places = ["/" + d for d in os.listdir("/") if d not in
                      ("usr", "proc", "sys", "dev", "lib", "lib64", "bin", "sbin", "root", "work")]
            code = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix)}
            hits = []
            for place in places:
                for top, dirs, files in os.walk(place):
                    dirs[:] = [d for d in dirs if os.path.realpath(os.path.join(top, d)) not in code]
                    for name in files:
                        try:
                            with open(os.path.join(top, name), "rb") as f:
                                if b"hello " + b"ada" in f.read(1 << 20):
                                    hits.append(os.path.join(top, name))
                        except OSError:
                            pass
            hits = "".join(hits)
            open("/app/seen.json", "w").write(json.dumps([seen, hits]))
            return json.dumps(task)
            """,
        )
    )
    assert "test_hidden" not in json.dumps(result.answer) and "solve.sh" not in str(result.answer)
    added = steps(result, "workspace_diff")[0]["files"]
    (row,) = [r for r in added if r["path"] == "seen.json"]
    assert '+[[], ""]' in row["diff"]


@pytest.mark.parametrize(
    "tamper",
    [
        # Edits the tests it can see: its own copy is not what is run.
        "os.makedirs('/app/tests', exist_ok=True)\n"
        "open('/app/test_hidden.py', 'w').write('def test_it():\\n    pass\\n')\n"
        "open('/app/tests/test.sh', 'w').write('echo 1 > /logs/verifier/reward.txt\\n')\n",
        # Deletes everything it was given.
        "import shutil\nfor name in os.listdir('/app'):\n    os.remove('/app/' + name)\n",
        # Writes the reward file itself, where it can and where it cannot.
        "os.makedirs('/app/logs/verifier', exist_ok=True)\n"
        "open('/app/logs/verifier/reward.txt', 'w').write('1')\n"
        "open('/app/reward.txt', 'w').write('1')\n"
        "try:\n    os.makedirs('/logs/verifier', exist_ok=True)\n"
        "    open('/logs/verifier/reward.txt', 'w').write('1')\n"
        "except OSError:\n    pass\n",
    ],
    ids=["edits-tests", "deletes-files", "writes-reward"],
)
def test_tampering_scores_nothing(tmp_path, tamper):
    result = rollout(harness(tmp_path, tamper + "return 'ok'\n"))
    assert (result.outcome, result.score) == (RolloutOutcome.TASK_FAILURE, 0.0), result.detail


def test_links_fifos_and_odd_files_are_recorded_not_followed(tmp_path):
    result = rollout(
        harness(
            tmp_path,
            f"""
            os.symlink("/etc/passwd", "/app/passwd")
            os.mkfifo("/app/pipe")
            os.remove("/app/README.md")
            open("/app/blob.bin", "wb").write(bytes(range(256)))
            open("/app/greet.py", "w").write({FIXED!r})
            return "ok"
            """,
        )
    )
    assert result.outcome == RolloutOutcome.PASSED, result.detail
    rows = {r["path"]: r for r in steps(result, "workspace_diff")[0]["files"]}
    assert rows["passwd"]["note"] == "a symbolic link to /etc/passwd"
    assert "FIFO" in rows["pipe"]["note"]
    assert rows["README.md"]["status"] == "deleted"
    assert rows["blob.bin"]["note"] == "binary"
    assert "root:" not in json.dumps(rows)


def test_commands_through_the_exec_helper_are_in_the_trace_and_count_as_steps(tmp_path):
    result = rollout(
        harness(
            tmp_path,
            """
            first = ctx.shell("python -c 'import greet; print(greet.greet(\\"x\\"))'")
            assert first["exit_code"] == 0 and first["stdout"] == "helo x\\n", first
            ctx.shell(["sed", "-i", "s/helo/hello/", "greet.py"])
            slow = ctx.shell("sleep 5", timeout_s=0.5)
            assert slow["timed_out"] and slow["exit_code"] is None
            for _ in range(5):
                ctx.shell("true")
            """,
            max_steps=6,
        )
    )
    assert result.outcome == RolloutOutcome.HARNESS_ERROR and result.error_kind == ErrorKind.LIMIT
    assert "max_steps = 6" in result.detail
    commands = [s for s in steps(result, "helper_call") if s["name"] == "exec"]
    assert len(commands) == 6
    assert commands[1]["params"]["command"] == ["sed", "-i", "s/helo/hello/", "greet.py"]
    assert commands[0]["result"]["stdout"] == "helo x\n"
    # Reviewers still see what the harness left, though it failed.
    (diff,) = steps(result, "workspace_diff")
    assert diff["files"][0]["path"] == "greet.py"


def test_a_workspace_filled_past_its_limit_ends_the_rollout(tmp_path, settings):
    settings.COEVO_WORKSPACE_MAX_BYTES = 2 * 1024**2
    result = rollout(
        harness(
            tmp_path,
            """
            import time
            for i in range(40):
                open(f"/app/fill{i}", "wb").write(b"x" * 512 * 1024)
            time.sleep(5)
            """,
        )
    )
    assert result.outcome == RolloutOutcome.HARNESS_ERROR and result.error_kind == ErrorKind.LIMIT
    assert "MiB of files" in result.detail


def test_a_command_that_fills_the_workspace_ends_the_rollout(tmp_path, settings):
    settings.COEVO_WORKSPACE_MAX_BYTES = 2 * 1024**2
    result = rollout(
        harness(
            tmp_path,
            """
            ctx.shell("for i in $(seq 40); do head -c 524288 /dev/zero > f$i; done; sleep 5")
            return "unreachable"
            """,
        )
    )
    assert result.outcome == RolloutOutcome.HARNESS_ERROR and result.error_kind == ErrorKind.LIMIT


def test_a_program_harness_works_in_the_workspace_without_an_answer_file(tmp_path):
    result = rollout(
        harness(
            tmp_path,
            """
            import json, os, urllib.request
            task = json.load(open(os.environ["COEVO_TASK_FILE"]))
            assert os.environ["COEVO_WORKSPACE"] == task["workspace"] == "/app"
            request = urllib.request.Request(
                os.environ["COEVO_HELPERS_URL"] + "/exec",
                data=json.dumps({"command": "sed -i s/helo/hello/ greet.py"}).encode(),
                headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
            assert json.load(urllib.request.urlopen(request))["exit_code"] == 0
            """,
            program=True,
        )
    )
    assert (result.outcome, result.score) == (RolloutOutcome.PASSED, 1.0), result.detail
    assert [s["name"] for s in steps(result, "helper_call")] == ["exec"]


def test_graded_rewards_and_broken_reward_files(tmp_path):
    directory = harness(tmp_path, 'return "ok"\n')

    def with_test_sh(script: str):
        verifier = {**VERIFIER, "tests": {"test.sh": {"text": script}}}
        return rollout(directory, verifier=verifier)

    graded = with_test_sh("echo 0.25 > /logs/verifier/reward.txt\n")
    assert (graded.outcome, graded.score) == (RolloutOutcome.TASK_FAILURE, 0.25)
    as_json = with_test_sh('echo \'{"reward": 1, "tests": 3}\' > /logs/verifier/reward.json\n')
    assert (as_json.outcome, as_json.score) == (RolloutOutcome.PASSED, 1.0)
    for script, why in [
        ("true\n", "wrote neither"),
        ("echo 7 > /logs/verifier/reward.txt\n", "outside [0, 1]"),
        ("echo nan > /logs/verifier/reward.txt\n", "outside [0, 1]"),
        ("ln -s /etc/hostname /logs/verifier/reward.txt\n", "not a regular file"),
        ("mkfifo /logs/verifier/reward.txt\n", "not a regular file"),
        ("sleep 30\n", "timed out"),
    ]:
        verifier = {**VERIFIER, "timeout_s": 2, "tests": {"test.sh": {"text": script}}}
        result = rollout(directory, verifier=verifier)
        assert (result.outcome, result.score) == (RolloutOutcome.TASK_FAILURE, 0.0)
        assert why in result.detail, (script, result.detail)


def test_solution_check_runs_the_start_state_and_the_reference_solution():
    check = ws_env.solution_check(inputs=INPUTS, verifier=VERIFIER)
    assert check.start.passed is False and check.start.score == 0.0
    assert check.solution is not None and check.solution.passed, check.solution
    broken = {**VERIFIER, "solution": {"solve.sh": {"text": "exit 3\n"}}}
    failed = ws_env.solution_check(inputs=INPUTS, verifier=broken).solution
    assert failed is not None and failed.detail == "solve.sh exited with 3"


def test_commands_the_harness_starts_itself_are_logged_where_the_runtime_sees_them(tmp_path):
    result = rollout(
        harness(
            tmp_path,
            """
            subprocess.run(["sed", "-i", "s/helo/hello/", "/app/greet.py"], check=True)
            os.system("true")
            return "ok"
            """,
        )
    )
    assert result.outcome == RolloutOutcome.PASSED, result.detail
    logged = [s["message"] for s in steps(result, "log")]
    assert "$ sed -i s/helo/hello/ /app/greet.py" in logged and "$ true" in logged
