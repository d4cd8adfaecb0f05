"""The README's first command, minus installation: `coevo demo --once` on the embedded default
(SQLite, the filesystem broker, a real prefork Celery worker, gunicorn and llama.cpp with
Gemma 3 270M), in a fresh COEVO_HOME, as a separate process."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.net import free_port

pytestmark = pytest.mark.llm

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_it_runs_the_demo_once_on_the_embedded_default(tmp_path):
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("DATABASE_URL", "CELERY_", "COEVO_", "DJANGO_"))
    }
    env["COEVO_HOME"] = str(tmp_path / "home")
    coevo = Path(sys.executable).parent / "coevo"

    done = subprocess.run(
        # The TextWorld campaign is left out here (CI time): tests/integration/
        # test_campaign_gemma.py runs one against the same Gemma server setup.
        [str(coevo), "demo", "--once", "--tasks", "2", "--no-campaign",
         "--port", str(free_port()), "--policy-port", str(free_port())],
        env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = re.search(r"^Summary: score .* · (\d+)/2 tasks passed .* tokens · \d+m\d\ds$",
                        done.stdout, re.MULTILINE)  # fmt: skip
    assert summary, done.stdout
    assert re.search(r"^Dashboard: http://127\.0\.0\.1:\d+/p/demo/e/[0-9a-f-]{36}/  \(login demo / \S+\)$",
                     done.stdout, re.MULTILINE)  # fmt: skip
    assert "Campaign" not in done.stdout, "--no-campaign runs no campaign"
    with sqlite3.connect(tmp_path / "home" / "coevo.sqlite3") as db:
        rows = db.execute("select state, outcome from evaluations_rollout").fetchall()
        assert db.execute("select count(*) from campaigns_campaign").fetchone() == (0,)
    assert len(rows) == 2
    assert all(state == "done" and outcome in ("passed", "task_failure") for state, outcome in rows)
