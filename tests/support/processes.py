"""Real worker and Redis processes for fault tests: started, killed and restarted by the test."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from django.db import connection

from tests.support.net import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_database_url() -> str:
    """The URL of the database this test process uses (pytest-django's test database)."""
    s = connection.settings_dict
    auth = s["USER"] + (f":{s['PASSWORD']}" if s.get("PASSWORD") else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


class CeleryProcess:
    """A ``celery`` command in a process of its own, on the test database and the given broker;
    ``env`` on top of this process's environment."""

    def __init__(
        self, *, args: list[str], log_name: str, broker_url: str, log_dir: Path, **env: str
    ) -> None:
        self.log_path = log_dir / f"{log_name}.log"
        child_env = {
            **os.environ,
            "DATABASE_URL": test_database_url(),
            "CELERY_BROKER_URL": broker_url,
            "COEVO_HEARTBEAT_S": "1",
            "COEVO_LOG_LEVEL": "INFO",
            **env,
        }
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "coevo", *args],
            cwd=REPO_ROOT,
            env=child_env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def kill(self) -> None:
        """SIGKILL, no warning, no cleanup: the machine died."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._log.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        if not self._log.closed:
            self._log.close()

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


class WorkerProcess(CeleryProcess):
    """``celery worker`` on ``queues``, named ``<name>@<host>``."""

    def __init__(
        self,
        *,
        name: str,
        broker_url: str,
        log_dir: Path,
        queues: str = "rollouts,default",
        **env: str,
    ) -> None:
        super().__init__(
            args=[
                "worker", "-Q", queues, "-n", f"{name}@%h", "--without-heartbeat",
                "--without-gossip", "--without-mingle", "--loglevel", "INFO",
            ],
            log_name=f"worker-{name}",
            broker_url=broker_url,
            log_dir=log_dir,
            **env,
        )  # fmt: skip
        self.hostname_prefix = f"{name}@"


class BeatProcess(CeleryProcess):
    """``celery beat`` with the settings' schedule (CELERY_BEAT_SCHEDULE), from a fresh
    schedule file: each job first runs one interval after it starts."""

    def __init__(self, *, broker_url: str, log_dir: Path, **env: str) -> None:
        super().__init__(
            args=[
                "beat", "--schedule", str(log_dir / "celerybeat-schedule"), "--loglevel", "INFO",
            ],
            log_name="beat",
            broker_url=broker_url,
            log_dir=log_dir,
            **env,
        )  # fmt: skip


class CeleryProcesses:
    """Workers and a beat a test starts (``worker``, ``beat``), all stopped by ``stop``."""

    def __init__(self, *, broker_url: str, log_dir: Path) -> None:
        self.broker_url = broker_url
        self.log_dir = log_dir
        self.started: list[CeleryProcess] = []

    def worker(self, name: str, *, queues: str = "rollouts,default", **env: str) -> WorkerProcess:
        worker = WorkerProcess(
            name=name, broker_url=self.broker_url, log_dir=self.log_dir, queues=queues, **env
        )
        self.started.append(worker)
        return worker

    def beat(self, **env: str) -> BeatProcess:
        beat = BeatProcess(broker_url=self.broker_url, log_dir=self.log_dir, **env)
        self.started.append(beat)
        return beat

    def stop(self) -> None:
        for process in self.started:
            process.stop()


class RedisProcess:
    """A private redis-server. By default it keeps nothing on disk: a restart loses every
    message. With ``appendonly`` it keeps an append-only file in ``log_dir`` (the config
    docker-compose.yml ships) and ``stop`` is a SIGTERM, as ``docker stop`` sends: a restart
    brings back what was written, leases and messages alike."""

    def __init__(self, log_dir: Path, *, appendonly: bool = False) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (Debian package redis-server)")
        self.binary = binary
        self.directory = log_dir
        self.appendonly = appendonly
        self.port = free_port()
        self.log_path = log_dir / "redis.log"
        self.proc: subprocess.Popen[Any] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        import redis

        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes" if self.appendonly else "no", "--dir", str(self.directory),
             "--logfile", str(self.log_path)],
            start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                redis.Redis(port=self.port, socket_connect_timeout=0.5).ping()
                return
            except (redis.ConnectionError, redis.exceptions.BusyLoadingError):
                time.sleep(0.1)
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            if self.appendonly:
                self.proc.terminate()
            else:
                self.proc.kill()
            self.proc.wait(timeout=20)
        self.proc = None


def run_trainer_python(
    code: str, *args: str, timeout_s: float = 120
) -> subprocess.CompletedProcess:
    """``python -c code args`` in a fresh Python with the environment a training worker gives a
    trainer: PATH and coevo's source tree on PYTHONPATH, nothing else of this process's."""
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT)},
    )
