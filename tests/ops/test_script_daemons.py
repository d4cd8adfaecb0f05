"""A daemon the install scripts start (the Docker engine) must not hold a script open.

CI once hung to its time limit after every test had passed: scripts/test started dockerd as a
background job of its own shell, then waited for its test lanes with a bare `wait`, which
waits for every child, the engine included."""

from __future__ import annotations

import os
import signal
import subprocess

from tests.conftest import REPO_ROOT


def _run(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", f"set -euo pipefail; source scripts/lib.sh; {script}"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=20,
    )


def test_a_detached_daemon_is_not_waited_for_by_the_script_that_started_it(tmp_path):
    log = tmp_path / "daemon.log"
    # A bare `wait` after the start returns at once; were the daemon a child of this shell, the
    # run would last the daemon's 60 s and time out at 20.
    done = _run(
        f'pid="$(start_detached {log} sh -c "echo started; exec sleep 60")"; wait; echo "$pid"'
    )
    assert done.returncode == 0, done.stderr
    pid = int(done.stdout.strip())
    try:
        os.kill(pid, 0)  # it outlives the script
        # In a session of its own: no signal to the script's group reaches it.
        assert os.getsid(pid) == pid
        for _ in range(50):
            if log.read_text() == "started\n":
                break
            subprocess.run(["sleep", "0.1"])
        assert log.read_text() == "started\n"
    finally:
        os.kill(pid, signal.SIGKILL)
