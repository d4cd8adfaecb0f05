"""The Docker engine coevo talks to: one client per process for COEVO_DOCKER_HOST, the labels
every object coevo creates carries, and the reaping of what a dead worker left behind.

Everything goes through the engine's HTTP API (the Docker SDK for Python), never through the
``docker`` command line. An engine that cannot be reached is an infrastructure failure
(``ContainerUnavailable``, a ``SandboxUnavailable``): a rollout that meets it is retried, never
scored.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import docker
import docker.errors
import requests.exceptions
from django.conf import settings

from coevo.errors import SandboxUnavailable

logger = logging.getLogger(__name__)

# Every container and image coevo creates carries LABEL_MANAGED; containers and snapshots also
# name their worker process (so a restarted worker can tell its dead predecessor's leftovers
# from a live neighbour's) and, where known, their rollout.
LABEL_MANAGED = "coevo.managed"
LABEL_KIND = "coevo.kind"
LABEL_WORKER = "coevo.worker"
# The worker process's start time (clock ticks since boot, /proc/PID/stat field 22): a pid is
# reused after its process dies, so "hostname:pid" alone could name a live stranger.
LABEL_WORKER_STARTED = "coevo.worker.started"
LABEL_ROLLOUT = "coevo.rollout"

# What LABEL_KIND says an object is: the reaper removes containers of any kind and images of
# kind "snapshot"; task images and their CA bases are a cache, kept.
KIND_RUN = "run"
KIND_SNAPSHOT = "snapshot"
KIND_TASK_IMAGE = "task-image"
KIND_CA_BASE = "ca-base"
# A container created (never started) to look at an image's files.
KIND_PROBE = "probe"

# The engine's API version coevo needs at least: Docker 20.10 (Debian bookworm's docker.io).
MIN_API_VERSION = (1, 41)
# How long one API call may wait for the engine's answer. Builds and a container's attached
# output are exempt (their ends are bounded by their own timeouts); a pull that reports no
# progress for this long has stalled.
API_TIMEOUT_S = 120

_clients: dict[tuple[int, str], docker.DockerClient] = {}
_clients_lock = threading.Lock()


class ContainerUnavailable(SandboxUnavailable):
    """The Docker engine cannot be reached or failed: an infrastructure error, not a score."""

    code = "container_unavailable"


@dataclass(frozen=True)
class EngineInfo:
    host: str
    version: str
    api_version: str
    storage_driver: str
    runtimes: tuple[str, ...]
    # The engine's security options as it reports them ("name=seccomp,profile=default",
    # "name=userns", "name=rootless", ...).
    security_options: tuple[str, ...]
    # Which process coevo labels its objects with: docs/deployment.md explains reaping.
    worker: str = field(default="")

    @property
    def userns_remap(self) -> bool:
        return any(option.startswith("name=userns") for option in self.security_options)

    @property
    def rootless(self) -> bool:
        return any(option.startswith("name=rootless") for option in self.security_options)


def engine_host() -> str:
    return settings.COEVO_DOCKER_HOST


def _unavailable(what: str, exc: BaseException | None = None) -> ContainerUnavailable:
    reason = f": {exc}" if exc is not None else ""
    return ContainerUnavailable(
        f"the Docker engine at COEVO_DOCKER_HOST={engine_host()} {what}{reason}. Start it "
        "(scripts/lib.sh's ensure_docker_engine starts coevo's own, as root), or point "
        "COEVO_DOCKER_HOST at an engine this worker may use (docs/deployment.md, "
        '"The container backend").'
    )


@contextlib.contextmanager
def engine_errors(what: str) -> Iterator[None]:
    """Turns a lost or refused connection to the engine into ContainerUnavailable; the
    engine's answers (APIError: 404, 409, 500 ...) pass through for the caller to judge."""
    try:
        yield
    except docker.errors.APIError:
        raise
    except (requests.exceptions.ConnectionError, requests.exceptions.Timeout, OSError) as exc:
        raise _unavailable(f"did not answer while {what}", exc) from exc
    except docker.errors.DockerException as exc:
        raise _unavailable(f"failed while {what}", exc) from exc


def engine_client() -> docker.DockerClient:
    """The process's client for COEVO_DOCKER_HOST (one per process and host: the SDK's
    connection pool is shared by threads; a forked child makes its own)."""
    host = engine_host()
    key = (os.getpid(), host)
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            with engine_errors("connecting"):
                # "auto": the SDK asks the engine's version once, so a newer engine is
                # spoken to in its own version and an older one than MIN_API_VERSION is seen.
                client = docker.DockerClient(base_url=host, version="auto", timeout=API_TIMEOUT_S)
            version = tuple(int(part) for part in client.api.api_version.split("."))
            if version < MIN_API_VERSION:
                client.close()
                raise _unavailable(
                    f"speaks API {client.api.api_version}, older than the "
                    f"{'.'.join(map(str, MIN_API_VERSION))} (Docker 20.10) coevo needs"
                )
            _clients[key] = client
        return client


def engine_ping() -> EngineInfo:
    """What the engine says about itself; raises ContainerUnavailable when it does not answer."""
    client = engine_client()
    with engine_errors("answering a ping"):
        client.ping()
        version = client.version()
        info = client.info()
    return EngineInfo(
        host=engine_host(),
        version=str(version.get("Version", "")),
        api_version=str(version.get("ApiVersion", "")),
        storage_driver=str(info.get("Driver", "")),
        runtimes=tuple(sorted((info.get("Runtimes") or {}).keys())),
        security_options=tuple(info.get("SecurityOptions") or ()),
        worker=worker_id(),
    )


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def proc_stat_fields(pid: int | str) -> list[bytes] | None:
    """The fields of /proc/PID/stat after the command name (its state first, field 3), or None
    when there is no such process. Counted after the name's closing paren, since the name
    itself may hold spaces and parens."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2 :].split()


def _process_started(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), or
    None when there is no such process."""
    fields = proc_stat_fields(pid)
    return fields[19].decode() if fields is not None and len(fields) > 19 else None


def coevo_labels(
    *, kind: str, rollout: str | None = None, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The labels of an object this worker process creates now."""
    labels = {
        LABEL_MANAGED: "1",
        LABEL_KIND: kind,
        LABEL_WORKER: worker_id(),
        LABEL_WORKER_STARTED: _process_started(os.getpid()) or "",
    }
    if rollout:
        labels[LABEL_ROLLOUT] = str(rollout)
    labels.update(extra or {})
    return labels


def _worker_alive(labels: Mapping[str, str]) -> bool | None:
    """Whether the worker process named by ``labels`` still runs: None when it is another
    machine's (a worker cannot see other hosts' processes, so it leaves their objects alone)."""
    host, _, pid = (labels.get(LABEL_WORKER) or "").rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return None
    started = _process_started(int(pid))
    if started is None:
        return False
    # A label without a start time (written by hand) is judged by its pid alone.
    return not labels.get(LABEL_WORKER_STARTED) or started == labels[LABEL_WORKER_STARTED]


@dataclass
class Reaped:
    containers: list[str] = field(default_factory=list)
    images: list[str] = field(default_factory=list)


def engine_reap(*, worker: str | None = None) -> Reaped:
    """Removes the containers and snapshot images coevo made for worker processes that are
    gone: on a worker's start, what its dead predecessor left (a rollout killed with its
    worker leaves its container running otherwise). ``worker`` ("hostname:pid") removes that
    worker's objects whether it runs or not (the worker itself, at shutdown). Objects of other
    machines, and of processes still alive, are left alone; task images are a cache, kept."""
    client = engine_client()
    reaped = Reaped()

    def doomed(labels: Mapping[str, str]) -> bool:
        if worker is not None:
            return labels.get(LABEL_WORKER) == worker
        return _worker_alive(labels) is False

    with engine_errors("listing coevo's containers"):
        containers = client.api.containers(all=True, filters={"label": f"{LABEL_MANAGED}=1"})
    for container in containers:
        if not doomed(container.get("Labels") or {}):
            continue
        with contextlib.suppress(docker.errors.NotFound), engine_errors("removing a container"):
            client.api.remove_container(container["Id"], force=True, v=True)
            reaped.containers.append(container["Id"])
    with engine_errors("listing coevo's snapshots"):
        images = client.api.images(
            filters={"label": [f"{LABEL_MANAGED}=1", f"{LABEL_KIND}={KIND_SNAPSHOT}"]}
        )
    for image in images:
        if not doomed(image.get("Labels") or {}):
            continue
        # A snapshot a container still uses is removed with the container, above; one another
        # snapshot's container holds is left for the next reap rather than forced.
        with (
            contextlib.suppress(docker.errors.NotFound, docker.errors.APIError),
            engine_errors("removing a snapshot"),
        ):
            client.api.remove_image(image["Id"], force=True, noprune=False)
            reaped.images.append(image["Id"])
    if reaped.containers or reaped.images:
        logger.info(
            "reaped %d container(s) and %d snapshot(s) of dead coevo workers",
            len(reaped.containers),
            len(reaped.images),
        )
    return reaped
