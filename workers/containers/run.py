"""Running a command in a container of a task image, to completion or its timeout, with the
same result shape as the bubblewrap sandbox's ``sandbox.run`` (workers/sandbox.py).

Every container is made like this (docs/threat-model.md, "Containers"):

- **Capabilities**: all dropped but CONTAINER_CAPABILITIES, what a root process inside needs
  for the work tasks do as root (package installs, builds, test servers), each with its reason
  below. Not kept from the engine's default set: MKNOD (device nodes), NET_RAW (raw and packet
  sockets: forged traffic, ping), SETFCAP and SETPCAP (granting file and process
  capabilities), SYS_CHROOT, AUDIT_WRITE, FSETID.
- ``no-new-privileges``: a setuid binary cannot give a process more than its parent had.
- The engine's default seccomp profile (never ``unconfined``), which with these capabilities
  also refuses mount, kernel modules, namespaces' admin calls, keyrings, ptrace of others...
- **No network** (``none``: only a loopback of its own) unless ``network=True``: then the
  egress-only network (``egress_network``), never the engine's default bridge.
- **No host path** but the ``binds`` (read-only) and ``rw_binds`` the caller names.
- **Limits**: memory (no swap beyond it), CPUs, processes; output read from the attached
  streams and bounded, the engine's own log driver off (a flood fills neither the worker's
  memory nor the engine's disk).
- An init (the engine's ``docker-init``) as PID 1 reaps orphans and forwards signals; the
  timeout, a cancel or too much output kills the container (SIGKILL to its PID 1, after
  which the kernel ends every process of its PID namespace), and it is removed whatever
  happens, exceptions included. A worker killed outright leaves it to ``engine_reap``.
- COEVO_CONTAINER_RUNTIME picks the engine's runtime (e.g. gVisor's ``runsc``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker.errors
from django.conf import settings
from docker.types import Mount
from docker.utils.socket import STDERR, STDOUT, frames_iter

from workers.containers.engine import (
    KIND_RUN,
    KIND_SNAPSHOT,
    ContainerUnavailable,
    coevo_labels,
    engine_client,
    engine_errors,
)
from workers.containers.images import ImageUnavailable

logger = logging.getLogger(__name__)

# The capabilities a container keeps. The process inside runs as root (as Harbor's tasks and
# their Dockerfiles expect), but root with only these:
CONTAINER_CAPABILITIES = (
    # chown(2) to any owner: dpkg, pip and tar give unpacked files their owners.
    "CHOWN",
    # Read and write files whatever their mode: root's ordinary access to files of other
    # users (apt's lists, a task's files made by another uid).
    "DAC_OVERRIDE",
    # chmod(2), utime(2) and the like on files root does not own (dpkg, cp -p, git checkout).
    "FOWNER",
    # Switch to another user: apt drops to _apt for downloads; su, runuser, servers that
    # start as root and drop to a user; tests that run code as nobody.
    "SETUID",
    "SETGID",
    # Signal processes of other uids in the container (a test stopping a server it started
    # as another user).
    "KILL",
    # Listen on ports below 1024 in the container's own network namespace (a task's web
    # server on :80 that its tests call over the container's loopback).
    "NET_BIND_SERVICE",
)

DEFAULT_MEMORY_BYTES = 4 * 1024**3
DEFAULT_PIDS = 1024
# How often the watcher looks at the cancel event (sealing waits that long at most).
CANCEL_INTERVAL_S = 0.05
# A container asked to stop is given this long to report its end before it counts as lost.
WAIT_AFTER_KILL_S = 30


@dataclass(frozen=True)
class ContainerRun:
    """As workers/sandbox.py's ``SandboxRun``: the exit status (None when it never ended of
    itself), the tails of stdout and stderr, and why it was stopped, if it was."""

    returncode: int | None
    stdout: bytes
    stderr: bytes
    timed_out: bool
    output_exceeded: bool = False
    cancelled: bool = False
    # The kernel killed it for memory (the container's limit).
    oom_killed: bool = False
    # With commit=True: the id of an image of the container's final state.
    snapshot: str | None = None
    seconds: float = 0.0


def bind_mounts(
    binds: Mapping[Path, str] | None, rw_binds: Mapping[Path, str] | None
) -> list[Mount]:
    """Host paths bound into a container: ``binds`` read-only, ``rw_binds`` writable. Mounts,
    not "host:target:mode" strings: a path may hold a colon. A source that does not exist is
    an error, where a bind string would have the engine create it."""
    return [
        Mount(target, str(Path(host)), type="bind", read_only=read_only)
        for given, read_only in ((binds, True), (rw_binds, False))
        for host, target in (given or {}).items()
    ]


def contained_host_config(
    client: docker.DockerClient,
    *,
    mounts: list[Mount],
    network: bool,
    cpus: float,
    memory_bytes: int,
    pids: int,
) -> dict:
    """The host configuration of every container coevo runs (see the module doc)."""
    return client.api.create_host_config(
        mounts=mounts,
        network_mode=egress_network(client) if network else "none",
        cap_drop=["ALL"],
        cap_add=list(CONTAINER_CAPABILITIES),
        security_opt=["no-new-privileges"],
        mem_limit=memory_bytes,
        memswap_limit=memory_bytes,
        nano_cpus=int(cpus * 1e9),
        pids_limit=pids,
        init=True,
        log_config={"type": "none", "config": {}},
        runtime=settings.COEVO_CONTAINER_RUNTIME or None,
    )


def egress_network(client: docker.DockerClient) -> str:
    """The network of containers that may reach the internet: COEVO_CONTAINER_EGRESS_NETWORK,
    which must exist (scripts/lib.sh's ``ensure_egress_network`` makes coevo's: public
    addresses only). Raises ContainerUnavailable when it does not: never the engine's default
    bridge in its place, which reaches the host and private networks."""
    name = settings.COEVO_CONTAINER_EGRESS_NETWORK
    try:
        with engine_errors("looking up the egress network"):
            client.api.inspect_network(name)
    except docker.errors.NotFound:
        raise ContainerUnavailable(
            f"the egress network {name} does not exist on the Docker engine: create it "
            "(scripts/lib.sh, ensure_egress_network), or keep COEVO_CONTAINER_ALLOW_INTERNET off"
        ) from None
    return name


def container_run(
    image: str,
    argv: list[str],
    *,
    timeout_s: float,
    cpus: float = 1.0,
    memory_bytes: int = DEFAULT_MEMORY_BYTES,
    pids: int = DEFAULT_PIDS,
    network: bool = False,
    binds: Mapping[Path, str] | None = None,
    rw_binds: Mapping[Path, str] | None = None,
    env: Mapping[str, str] | None = None,
    workdir: str | None = None,
    user: str | None = None,
    stdin: bytes = b"",
    max_output_bytes: int = 1024 * 1024,
    output_limit_bytes: int = 64 * 1024 * 1024,
    labels: Mapping[str, str] | None = None,
    rollout: str | None = None,
    commit: bool = False,
    cancel: threading.Event | None = None,
) -> ContainerRun:
    """Run ``argv`` (the whole command: the image's ENTRYPOINT does not apply) in a new
    container of ``image``, to its end or ``timeout_s``, and remove the container.

    At most ``max_output_bytes`` of stdout and of stderr are kept (their ends); past
    ``output_limit_bytes`` written in all, the container is killed (``output_exceeded``).
    ``cancel``, set by another thread, kills it as soon as it is seen (``cancelled``).
    ``commit`` keeps an image of its final state (``snapshot``; remove it with
    ``snapshot_remove``), whatever ended it. Raises ImageUnavailable for an image the engine
    lacks and ContainerUnavailable when the engine fails."""
    if not argv:
        raise ValueError("container_run needs a command")
    client = engine_client()
    started = time.monotonic()
    mounts = bind_mounts(binds, rw_binds)
    host_config = contained_host_config(
        client, mounts=mounts, network=network, cpus=cpus, memory_bytes=memory_bytes, pids=pids
    )
    all_labels = coevo_labels(kind=KIND_RUN, rollout=rollout, extra=labels)
    try:
        with engine_errors("creating a container"):
            created = client.api.create_container(
                image,
                entrypoint=argv[:1],
                command=argv[1:],
                environment=dict(env or {}),
                working_dir=workdir,
                user=user,
                labels=all_labels,
                host_config=host_config,
                stdin_open=bool(stdin),
                # Else the SDK adds the proxy settings of ~/.docker/config.json to env.
                use_config_proxy=False,
            )
    except docker.errors.ImageNotFound as exc:
        raise ImageUnavailable(
            f"the image {image} is not on the Docker engine at {settings.COEVO_DOCKER_HOST} "
            "(workers/containers/images.py's image_for_task makes task images)"
        ) from exc
    container = created["Id"]
    try:
        result = _run(
            client,
            container,
            stdin=stdin,
            timeout_s=timeout_s,
            max_output_bytes=max_output_bytes,
            output_limit_bytes=output_limit_bytes,
            cancel=cancel,
            commit=commit,
            rollout=rollout,
            started=started,
        )
    except BaseException:
        # Any failure, an interrupt included: the container goes, and the failure is the
        # one raised (a second failure to remove it is logged, and left to the reaper).
        with contextlib.suppress(Exception):
            container_remove(client, container)
        raise
    container_remove(client, container)
    return result


def _run(
    client: docker.DockerClient,
    container: str,
    *,
    stdin: bytes,
    timeout_s: float,
    max_output_bytes: int,
    output_limit_bytes: int,
    cancel: threading.Event | None,
    commit: bool,
    rollout: str | None,
    started: float,
) -> ContainerRun:
    params = {"stdin": 1 if stdin else 0, "stdout": 1, "stderr": 1, "stream": 1}
    with engine_errors("attaching to a container"):
        # Attached before it starts, so nothing it writes is missed.
        stream = client.api.attach_socket(container, params=params)
    raw: socket.socket = getattr(stream, "_sock", stream)
    stop = threading.Event()  # the reader is done: the container's streams closed
    wake = threading.Event()  # the watcher has something to look at
    why: dict[str, bool] = {"timed_out": False, "cancelled": False, "output_exceeded": False}
    flooded = [False]  # the reader saw more than output_limit_bytes

    def watch() -> None:
        # Every kill comes from this thread, never from the reader: the engine answers a kill
        # only once the container's output is drained, so a reader waiting on its own kill
        # would wait for ever.
        deadline = started + timeout_s
        while not stop.is_set():
            if flooded[0]:
                reason = "output_exceeded"
            elif cancel is not None and cancel.is_set():
                reason = "cancelled"
            elif time.monotonic() >= deadline:
                reason = "timed_out"
            else:
                left = deadline - time.monotonic()
                wake.wait(min(left, CANCEL_INTERVAL_S) if cancel is not None else left)
                wake.clear()
                continue
            why[reason] = True
            with contextlib.suppress(docker.errors.DockerException, OSError):
                client.api.kill(container)
            return

    def feed() -> None:
        with contextlib.suppress(OSError):
            raw.sendall(stdin)
        # Half-closed: the container's stdin sees its end (StdinOnce), its output still comes.
        with contextlib.suppress(OSError):
            raw.shutdown(socket.SHUT_WR)

    try:
        with engine_errors("starting a container"):
            client.api.start(container)
        watcher = threading.Thread(target=watch, name="coevo-container-timeout", daemon=True)
        watcher.start()
        if stdin:
            threading.Thread(target=feed, name="coevo-container-stdin", daemon=True).start()

        def flood() -> None:
            flooded[0] = True
            wake.set()

        try:
            stdout, stderr = stream_tails(
                stream,
                max_output_bytes=max_output_bytes,
                output_limit_bytes=output_limit_bytes,
                flooded=flood,
            )
        finally:
            stop.set()
            wake.set()  # the watcher sees ``stop`` and ends
            # The attach connection was taken over from the client's pool: closing the
            # file object alone would leave its socket open (a descriptor per run).
            with contextlib.suppress(OSError):
                stream.close()
            with contextlib.suppress(OSError):
                raw.close()
            watcher.join()
        with engine_errors("waiting for a container"):
            status = client.api.wait(container, timeout=WAIT_AFTER_KILL_S)
            state = client.api.inspect_container(container)["State"]
        snapshot = container_commit(container, rollout=rollout) if commit else None
        return ContainerRun(
            returncode=None if why["timed_out"] else status.get("StatusCode"),
            stdout=stdout,
            stderr=stderr,
            timed_out=why["timed_out"],
            output_exceeded=why["output_exceeded"],
            cancelled=why["cancelled"],
            oom_killed=bool(state.get("OOMKilled")),
            snapshot=snapshot,
            seconds=time.monotonic() - started,
        )
    finally:
        stop.set()


def stream_tails(
    stream: Any,
    *,
    max_output_bytes: int,
    output_limit_bytes: int,
    flooded: Callable[[], None],
) -> tuple[bytes, bytes]:
    """Read a container's (or a command's) multiplexed stdout and stderr until they close or
    the stream is cut, keeping the last ``max_output_bytes`` of each. Past
    ``output_limit_bytes`` written in all, ``flooded()`` is called once and the rest drained
    unread (until whoever kills the writer closes its streams)."""
    tails = {STDOUT: bytearray(), STDERR: bytearray()}
    written = 0
    over = False
    with contextlib.suppress(OSError):  # the stream cut by the writer's end
        for kind, data in frames_iter(stream, tty=False):
            if over or kind not in tails:
                continue
            tail = tails[kind]
            tail += data
            del tail[:-max_output_bytes]
            written += len(data)
            if written > output_limit_bytes:
                over = True
                flooded()
    return bytes(tails[STDOUT]), bytes(tails[STDERR])


def container_commit(
    container: str, *, rollout: str | None = None, labels: Mapping[str, str] | None = None
) -> str:
    """The id of a new image of ``container``'s files as they are now (the verifier phase runs
    the tests in a container made from the agent's final state). It is labelled a snapshot of
    this worker, so ``engine_reap`` removes it if the worker dies before its owner does.
    Mounts (binds) are not part of it."""
    client = engine_client()
    changes = coevo_labels(kind=KIND_SNAPSHOT, rollout=rollout, extra=labels)
    label = "LABEL " + " ".join(f"{json.dumps(k)}={json.dumps(v)}" for k, v in changes.items())
    with engine_errors("committing a container"):
        # Paused while committed, so a running container's files are read at one moment.
        return client.api.commit(container, changes=label, pause=True)["Id"]


def snapshot_remove(image_id: str) -> None:
    """Removes a snapshot made by ``container_commit`` (gone already is fine)."""
    client = engine_client()
    with contextlib.suppress(docker.errors.NotFound), engine_errors("removing a snapshot"):
        client.api.remove_image(image_id, force=True)


def container_remove(client: docker.DockerClient, container: str) -> None:
    try:
        with contextlib.suppress(docker.errors.NotFound), engine_errors("removing a container"):
            # force: killed first if it still runs; v: its anonymous volumes (VOLUME in the
            # Dockerfile) go with it.
            client.api.remove_container(container, force=True, v=True)
    except Exception:
        # The engine failed now; the container keeps its labels, so the next reap of this
        # worker's leftovers (engine_reap at worker start) removes it.
        logger.exception("could not remove container %s; engine_reap will", container[:12])
        raise
