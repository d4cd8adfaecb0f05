"""The engine itself: a clear infrastructure error when it does not answer, labels on what coevo
makes, and the reaping of what a dead worker left running."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import docker.errors
import pytest

from coevo.errors import SandboxUnavailable
from tests.conftest import REPO_ROOT
from tests.containers.conftest import containers_of
from workers.containers import ContainerUnavailable, engine_ping, engine_reap
from workers.containers.engine import (
    LABEL_MANAGED,
    LABEL_WORKER,
    LABEL_WORKER_STARTED,
    coevo_labels,
    engine_client,
    worker_id,
)


def test_an_engine_that_does_not_answer_is_an_infrastructure_error(settings, tmp_path):
    settings.COEVO_DOCKER_HOST = f"unix://{tmp_path}/no-engine.sock"

    with pytest.raises(ContainerUnavailable) as failed:
        engine_ping()

    assert isinstance(failed.value, SandboxUnavailable)  # retried as infra, never scored
    message = str(failed.value)
    assert f"COEVO_DOCKER_HOST=unix://{tmp_path}/no-engine.sock" in message
    assert "ensure_docker_engine" in message


def test_it_reports_what_the_engine_is(engine):
    assert engine.api_version >= "1.41" and engine.storage_driver
    assert any("seccomp" in option for option in engine.security_options)
    assert engine.worker == worker_id()


WORKER = """
import django, sys
django.setup()
from workers.containers import container_run
container_run("{image}", ["true"], timeout_s=60, rollout="{rollout}", commit=True)
container_run("{image}", ["sleep", "600"], timeout_s=600, rollout="{rollout}")
"""


def test_the_reaper_removes_the_containers_of_a_dead_worker_only(base_image, rollout):
    # A worker process that dies (SIGKILL: no finally runs) while its container runs.
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER.format(image=base_image, rollout=rollout)],
        cwd=REPO_ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "coevo.settings"},
    )
    client = engine_client()
    live = client.api.create_container(
        base_image, ["sleep", "600"], labels=coevo_labels(kind="run", rollout=rollout)
    )
    try:
        deadline = time.monotonic() + 60
        while len(_sleeping(rollout)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(_sleeping(rollout)) == 2, "the worker never started its container"
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        orphan = [c for c in containers_of(rollout) if c["Id"] != live["Id"]][0]
        assert orphan["Labels"][LABEL_WORKER] == f"{worker_id().rpartition(':')[0]}:{worker.pid}"
        assert orphan["Labels"][LABEL_MANAGED] == "1"

        snapshots = _snapshots_of(rollout)
        assert len(snapshots) == 1  # the dead worker's first run kept one

        reaped = engine_reap()

        assert orphan["Id"] in reaped.containers and live["Id"] not in reaped.containers
        assert snapshots[0]["Id"] in reaped.images and _snapshots_of(rollout) == []
        assert [c["Id"] for c in containers_of(rollout)] == [live["Id"]]  # this process lives
        # A worker reaps its own objects by name (at its shutdown).
        assert engine_reap(worker=worker_id()).containers == [live["Id"]]
        assert containers_of(rollout) == []
    finally:
        worker.kill()
        with contextlib.suppress(docker.errors.NotFound):
            client.api.remove_container(live["Id"], force=True)


def _snapshots_of(rollout: str) -> list[dict]:
    return engine_client().api.images(filters={"label": f"coevo.rollout={rollout}"})


def _sleeping(rollout: str) -> list[dict]:
    return [c for c in containers_of(rollout) if "sleep" in c.get("Command", "")]


def test_a_worker_reaps_a_dead_workers_containers_when_it_starts(
    base_image, rollout, celery_processes
):
    # A container made by a worker process that is gone (its pid is a finished child's).
    gone = subprocess.Popen(["true"])
    gone.wait()
    labels = coevo_labels(kind="run", rollout=rollout)
    labels[LABEL_WORKER] = f"{worker_id().rpartition(':')[0]}:{gone.pid}"
    labels.pop(LABEL_WORKER_STARTED)
    client = engine_client()
    orphan = client.api.create_container(base_image, ["sleep", "600"], labels=labels)
    client.api.start(orphan["Id"])
    worker = celery_processes.worker("reaper", COEVO_CONTAINER_BACKEND="1")
    deadline = time.monotonic() + 60
    # Gone, and the worker says so (its log line follows the removal).
    while (
        containers_of(rollout) or "reaped 1 container(s)" not in worker.log_path.read_text()
    ) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not containers_of(rollout), worker.log_tail()
    assert "reaped 1 container(s)" in worker.log_path.read_text(), worker.log_tail()
