"""A task that needs its container, on the real engine: its /app as the image leaves it, its
commands in its container as root, sealing that stops everything, the tests on an image of the
final state, and the solution check in containers."""

from __future__ import annotations

import os
import threading
import time

import docker.errors
import pytest

from tests.containers.conftest import TASK_BASE
from workers.containers.engine import engine_client
from workers.environments.base import InvalidHelperCall
from workers.environments.workspace import (
    Workspace,
    exec_command,
    solution_check,
    verify,
)
from workers.environments.workspace_files import tree_read_final
from workers.outcomes import LimitExceeded

DOCKERFILE = f"""\
FROM {TASK_BASE}
WORKDIR /app
RUN mkdir -p /app/repo && printf 'def add(a, b):\\n    return a - b\\n' > /app/repo/calc.py
RUN ln -s repo/calc.py /app/calc-link.py && echo built > /opt/made-by-run
COPY notes.txt /app/notes.txt
"""
CONTEXT = {"notes.txt": {"text": "fix add\n"}}
TEST_SH = """\
#!/bin/bash
mkdir -p /logs/verifier
if grep -q 'return a + b' /app/repo/calc.py && [ -f /opt/agent-was-here ]; then
  echo 1 > /logs/verifier/reward.txt; echo "1 passed"
else
  echo 0 > /logs/verifier/reward.txt; echo "1 failed"
fi
"""
FIX = "sed -i 's/a - b/a + b/' /app/repo/calc.py && touch /opt/agent-was-here"


def inputs(**environment) -> dict:
    return {
        "instruction": "Fix add in repo/calc.py.",
        "files": {"notes.txt": {"text": "fix add\n"}},
        "environment": {
            "dockerfile": DOCKERFILE,
            "context": CONTEXT,
            "docker_image": None,
            "build_timeout_s": 300,
            "allow_internet": False,
            **environment,
        },
    }


VERIFIER = {"tests": {"test.sh": {"text": TEST_SH, "executable": True}}, "timeout_s": 60}


@pytest.fixture
def workspace(base_image, image_map):
    workspace = Workspace.for_task(inputs())
    yield workspace
    workspace.close()


def shell(workspace: Workspace, command: str, timeout_s: float = 30) -> dict:
    return exec_command(workspace=workspace, params={"command": command}, timeout_s=timeout_s)


def test_app_is_what_the_images_run_steps_left(workspace):
    root = workspace.root
    assert (root / "repo" / "calc.py").read_text() == "def add(a, b):\n    return a - b\n"
    assert (root / "notes.txt").read_text() == "fix add\n"
    assert os.readlink(root / "calc-link.py") == "repo/calc.py"
    assert workspace.applied["backend"] == "container"
    assert workspace.applied["network"] == "none"
    if workspace.uid is not None:  # the harness's sandbox may edit what the image made
        assert (root / "repo" / "calc.py").stat().st_uid == workspace.uid


def test_commands_run_in_the_container_as_root_and_see_the_same_app(workspace):
    reply = shell(
        workspace, "id -u; cat /opt/made-by-run; cat /app/notes.txt; echo new > /app/made.txt"
    )
    assert reply["exit_code"] == 0, reply
    assert reply["stdout"] == "0\nbuilt\nfix add\n"
    assert (workspace.root / "made.txt").read_text() == "new\n"
    if workspace.uid is not None:
        assert (workspace.root / "made.txt").stat().st_uid == workspace.uid
    # The tests are not there during the agent phase, nor is the network.
    reply = shell(workspace, "ls /tests; getent hosts deb.debian.org")
    assert reply["exit_code"] != 0
    assert "No such file" in reply["stderr"]


def test_a_command_past_its_timeout_is_killed_with_what_it_started(workspace):
    started = time.monotonic()
    reply = exec_command(
        workspace=workspace,
        params={"command": "sleep 300 & echo $! > /app/child.pid; sleep 300", "timeout_s": 1},
        timeout_s=30,
    )
    assert reply["timed_out"] and reply["exit_code"] is None
    assert time.monotonic() - started < 10
    # The background child (its pid inside the container) is gone too.
    child = (workspace.root / "child.pid").read_text().strip()
    reply = shell(workspace, f"kill -0 {child} 2>&1 || echo gone")
    assert reply["stdout"].strip().endswith("gone"), reply


def test_sealing_stops_what_a_command_left_running(workspace):
    reply = shell(
        workspace,
        "setsid sh -c 'while :; do date +%s%N >> /app/ticks; sleep 0.05; done' "
        ">/dev/null 2>&1 < /dev/null & sleep 0.5",
    )
    assert reply["exit_code"] == 0
    ticks = workspace.root / "ticks"
    assert ticks.stat().st_size > 0
    workspace.seal()
    size = ticks.stat().st_size
    time.sleep(0.5)
    assert ticks.stat().st_size == size
    state = engine_client().api.inspect_container(workspace.container.id)["State"]
    assert not state["Running"]
    with pytest.raises(InvalidHelperCall, match="rollout is over"):
        shell(workspace, "true")


def test_sealing_kills_a_running_command(workspace):
    replies: list[dict] = []
    thread = threading.Thread(target=lambda: replies.append(shell(workspace, "sleep 60", 120)))
    thread.start()
    time.sleep(1)
    started = time.monotonic()
    workspace.seal()
    thread.join(10)
    assert not thread.is_alive() and time.monotonic() - started < 10
    assert replies[0]["killed"] == "the rollout ended while the command ran"


def test_the_tests_run_on_the_final_state_and_the_diff_is_against_the_image(workspace):
    assert shell(workspace, "true")["exit_code"] == 0
    verdict = verify(inputs={}, verifier=VERIFIER, answer=None, workspace=workspace)
    assert not verdict.passed  # the image as it was fails
    other = Workspace.for_task(inputs())
    try:
        assert shell(other, FIX)["exit_code"] == 0
        verdict = verify(inputs={}, verifier=VERIFIER, answer=None, workspace=other)
        # /opt/agent-was-here is outside /app: only the snapshot of the container carries it.
        assert verdict.passed, (verdict.detail, verdict.output)
        diff = other.diff(tree_read_final(other.root, max_files=100, max_bytes=10**6))
        assert [row["path"] for row in diff["files"]] == ["repo/calc.py"]
        assert diff["modified"] == 1 and "+    return a + b" in diff["files"][0]["diff"]
    finally:
        other.close()
    # The verifier's snapshot is gone with it.
    images = engine_client().api.images(filters={"label": "org.coevo.kind=snapshot"})
    assert not [i for i in images if other.container.id[:12] in str(i.get("Labels"))]


def test_tests_that_need_the_network_say_so(workspace):
    test_sh = "getent hosts pypi.org || echo 'Temporary failure in name resolution' >&2\nexit 1\n"
    verifier = {"tests": {"test.sh": {"text": test_sh}}, "timeout_s": 60}
    verdict = verify(inputs={}, verifier=verifier, answer=None, workspace=workspace)
    assert not verdict.passed
    assert "needed the network" in verdict.detail
    assert "COEVO_CONTAINER_ALLOW_INTERNET" in verdict.detail


def test_close_removes_the_container(base_image, image_map):
    workspace = Workspace.for_task(inputs())
    container = workspace.container.id
    workspace.close()
    with pytest.raises(docker.errors.NotFound):
        engine_client().api.inspect_container(container)
    assert not workspace.root.exists()


def test_the_solution_check_runs_in_containers(base_image, image_map):
    verifier = {
        **VERIFIER,
        "solution": {"solve.sh": {"text": f'#!/bin/bash\n[ "$FIXED_BY" = solve ] && {FIX}\n'}},
        "solution_env": {"FIXED_BY": "solve"},
    }
    check = solution_check(inputs=inputs(), verifier=verifier)
    assert not check.start.passed
    assert check.solution is not None and check.solution.passed, (
        check.solution.detail,
        check.solve_output,
    )


def test_a_tasks_storage_bound_limits_app(base_image, image_map):
    workspace = Workspace.for_task(inputs(storage_bytes=1024**2))
    try:
        with pytest.raises(LimitExceeded, match="more than 1 MiB"):
            shell(workspace, "head -c 3000000 /dev/zero > /app/big; sleep 5", timeout_s=30)
    finally:
        workspace.close()


def test_a_pid_that_is_not_the_containers_is_never_killed(workspace):
    """A worker in a PID namespace of its own sees other processes under the engine's pid
    numbers: the kill goes to the container's processes only (their cgroup names it)."""
    from workers.containers.session import _in_container

    assert not _in_container(os.getpid(), workspace.container.id)
    reply = shell(workspace, "echo $$")
    assert reply["exit_code"] == 0
    ps = engine_client().api.top(workspace.container.id)
    pids = [int(row[ps["Titles"].index("PID")]) for row in ps["Processes"]]
    assert pids and all(_in_container(pid, workspace.container.id) for pid in pids)
