"""Every way this project starts a Celery worker (Compose, the demo, the commands the docs and
the system page give) turns gossip and mingle off.

coevo uses neither, and with gossip on a broker reconnect logs ``Error on restarting Gossip:
AttributeError("'NoneType' object has no attribute 'connection_errors'")`` with a traceback
(seen with a private redis-server killed for 3 s under a worker started with docs/deployment.md's
command): noise an operator reads as a crash in the middle of an outage."""

from __future__ import annotations

import re

import yaml

from coevo.demo import processes
from tests.support.factories import REPO_ROOT

FLAGS = {"--without-gossip", "--without-mingle"}


def test_every_compose_worker_runs_without_gossip_and_mingle():
    services = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())["services"]
    workers = {
        name: service["command"]
        for name, service in services.items()
        if (service.get("command") or [])[:4] == ["celery", "-A", "coevo", "worker"]
    }
    assert {"worker", "trainer"} <= set(workers)
    for name, command in workers.items():
        assert set(command) >= FLAGS, f"{name}: {command}"


def test_the_demo_starts_its_worker_without_gossip_and_mingle(monkeypatch, settings):
    started: dict[str, list[str]] = {}

    class Services:
        def start(self, name: str, command: list[str], env: dict[str, str]) -> None:
            started[name] = command

    monkeypatch.setattr(processes, "start_policy", lambda **_: "http://127.0.0.1:9/v1")
    processes.start_policy_and_worker(
        services=Services(), settings=settings, policy_port=9, env={}, worker_name="demo"
    )
    assert set(started["worker"]) >= FLAGS, started["worker"]


def test_every_documented_worker_command_runs_without_gossip_and_mingle():
    files = [*(REPO_ROOT / "docs").glob("*.md"), *(REPO_ROOT / "templates").rglob("*.html")]
    commands = [
        (path.name, match)
        for path in files
        for match in re.findall(r"celery -A coevo worker[^`<\n]*", path.read_text())
    ]
    assert len(commands) >= 4  # the scan itself finds them
    for name, command in commands:
        assert set(command.split()) >= FLAGS, f"{name}: {command}"
