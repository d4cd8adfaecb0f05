"""COEVO_HOME is private to coevo's user: another local user who read its SQLite database would
log in with the sessions in it (a superuser's too), and read token hashes, held-out data and
queued tasks. Each test starts the embedded default through manage.py, as every process does,
with the usual 022 umask."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO_ROOT

# Write to the database and queue a task (the broker writes a message and an exchange table),
# then print the database files' modes while the connection is open: SQLite removes its WAL
# and shared-memory files when the last connection closes.
START = """
import json, pathlib
from django.conf import settings
from django.db import connection
from coevo.celery import app
with connection.cursor() as cursor:
    cursor.execute("CREATE TABLE probe (x int)")
app.send_task("coevo.probe", queue="default")
files = pathlib.Path(settings.COEVO_HOME).glob("coevo.sqlite3*")
print(json.dumps({path.name: path.stat().st_mode & 0o777 for path in files}))
"""


def start_embedded(home: Path) -> dict[str, int]:
    """The modes of the SQLite files while the process is connected."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    env.update(COEVO_HOME=str(home), DJANGO_SETTINGS_MODULE="coevo.settings")
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", START],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        umask=0o022,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def assert_private(home: Path, databases: dict[str, int]) -> None:
    assert mode(home) == 0o700
    assert databases == {
        name: 0o600 for name in ("coevo.sqlite3", "coevo.sqlite3-wal", "coevo.sqlite3-shm")
    }
    broker = home / "broker"
    folders = [broker, *(broker / sub for sub in ("queue", "processed", "control"))]
    assert {str(f): mode(f) & 0o077 for f in folders} == {str(f): 0 for f in folders}
    messages = [p for f in folders[1:] for p in f.iterdir()]
    assert messages, "the probe task was not queued"
    assert {p.name: mode(p) & 0o077 for p in messages} == {p.name: 0 for p in messages}


def test_a_new_home_is_private_to_its_owner(tmp_path):
    home = tmp_path / "home"

    databases = start_embedded(home)

    assert_private(home, databases)


def test_a_home_an_earlier_version_left_open_is_tightened_at_start_up(tmp_path):
    home = tmp_path / "home"
    for folder in (home, home / "broker", home / "broker" / "queue"):
        folder.mkdir()
        folder.chmod(0o755)
    database = home / "coevo.sqlite3"
    database.touch()
    database.chmod(0o644)
    secret = home / "secret_key"
    secret.write_text("an earlier version's key")
    secret.chmod(0o600)

    databases = start_embedded(home)

    assert_private(home, databases)
    assert mode(secret) == 0o600 and secret.read_text() == "an earlier version's key"
