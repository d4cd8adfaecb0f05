"""A daemon the install scripts start (the Docker engine) must not hold a script open.

CI once hung to its time limit after every test had passed: scripts/test started dockerd as a
background job of its own shell, then waited for its test lanes with a bare `wait`, which
waits for every child, the engine included."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

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


def test_a_second_test_run_against_the_same_servers_is_refused_at_once(tmp_path):
    """Two runs of scripts/test on one machine would drop each other's lane databases."""
    env = {
        **os.environ,
        "TMPDIR": str(tmp_path),
        "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/coevo",
        "CELERY_BROKER_URL": "redis://127.0.0.1:6379/15",
    }
    key = "postgres://postgres@127.0.0.1:5432 redis://127.0.0.1:6379"
    digest = subprocess.run(
        ["sha256sum"], input=key, capture_output=True, text=True, check=True
    ).stdout[:16]
    holder = subprocess.Popen(["flock", str(tmp_path / f"coevo-test-{digest}.lock"), "sleep", "60"])
    try:
        for _ in range(50):
            if (tmp_path / f"coevo-test-{digest}.lock").exists():
                break
            subprocess.run(["sleep", "0.1"])
        done = subprocess.run(
            ["bash", "scripts/test"], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
            timeout=20,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert "another test run is using postgres://postgres@127.0.0.1:5432" in done.stderr
        assert "==>" not in done.stdout  # refused before installing anything
    finally:
        holder.kill()
        holder.wait()


def test_a_checkout_under_tmp_gets_its_environment_outside_tmp(tmp_path):
    """A rollout's sandbox gets a /tmp of its own, which would cover a Python under /tmp: the
    warm-sandbox tests would skip (and CI checks out anywhere)."""
    checkout = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        script = f"source {REPO_ROOT}/scripts/lib.sh; echo $VENV"
        env = {**os.environ, "HOME": str(tmp_path), "XDG_CACHE_HOME": ""}
        env.pop("COEVO_VENV", None)
        done = subprocess.run(
            ["bash", "-c", script], cwd=checkout, env=env, capture_output=True, text=True
        )
        venv = done.stdout.strip()
        assert venv.startswith(f"{tmp_path}/.cache/coevo/venvs/"), venv
        away = subprocess.run(
            ["bash", "-c", script], cwd=REPO_ROOT, env=env, capture_output=True, text=True
        )
        if not str(REPO_ROOT).startswith("/tmp/"):
            assert away.stdout.strip() == f"{REPO_ROOT}/.venv"
    finally:
        shutil.rmtree(checkout)
