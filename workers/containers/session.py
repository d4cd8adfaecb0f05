"""A rollout's task container: the container a workspace task's commands run in, alive for the
whole agent phase (workers/environments/workspace.py, ``Workspace.for_task``).

- **/app** is a volume of the container's own, which the engine fills from the task image's
  ``/app`` when the container starts (its files as the image's Dockerfile left them: owners,
  modes, links), and removes with the container. The worker watches its size and reads it
  back without following links in the volume's directory on this machine's disk
  (``app_path``), as for a bubblewrap workspace. An image whose /app is a link or a file is
  refused first (``image_app_check``). The rest of the container's files are the image's,
  and what commands change there (``apt-get install``) stays in the container until the
  verifier's snapshot of it.
- **Commands** (``TaskContainer.exec``) run as the image's root, with the capabilities and
  limits of every coevo container (workers/containers/run.py), to their end, their timeout,
  a cancel or too much output; a command stopped early is killed with every process it
  started that is still its descendant (the kill comes from the worker's side, which sees the
  container's processes: the engine is local, as reading /app's volume requires). What escaped its
  command's process tree dies with the container (``stop``).
- **Stopping** kills the container's PID 1, after which the kernel ends every process of its
  PID namespace: sealing the workspace stops it before anything is read back. It is kept,
  stopped, for ``commit`` (the verifier's image of the final state) and removed by ``remove``;
  a worker killed outright leaves it to ``engine_reap`` (its labels name the worker).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import signal
import socket
import tarfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker.errors
from django.conf import settings
from docker.types import Mount

from workers.containers.engine import (
    KIND_PROBE,
    KIND_RUN,
    ContainerUnavailable,
    coevo_labels,
    engine_client,
    engine_errors,
    proc_stat_fields,
)
from workers.containers.images import ImageUnavailable
from workers.containers.run import (
    WAIT_AFTER_KILL_S,
    bind_mounts,
    contained_host_config,
    container_commit,
    container_remove,
    stream_tails,
)
from workers.environments.workspace_files import (
    WorkspaceUnreadable,
    spec_bytes,
    tree_validate,
)

logger = logging.getLogger(__name__)

APP = "/app"
# What keeps the container alive between commands (its PID 1 is the engine's init).
KEEPALIVE = ["sleep", "infinity"]
# How often a running command's timeout, cancel and watch are looked at.
POLL_S = 0.05
WATCH_EVERY_S = 0.5
# After its command's processes are killed, how long the output stream may stay open (held by
# a process that left the command's tree) before the worker stops reading it.
DRAIN_AFTER_KILL_S = 2.0
# How long a kill waits for the engine to know a command's pid.
PID_WAIT_S = 2.0
# A container's PATH where its image sets none (the engine's own default).
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The most changes outside /app a rollout keeps (the engine lists every file apt installed).
MAX_CHANGES = 5000


@dataclass(frozen=True)
class ContainerExec:
    """A command's end, shaped as workers/sandbox.py's ``SandboxRun``."""

    returncode: int | None
    stdout: bytes
    stderr: bytes
    timed_out: bool
    output_exceeded: bool = False
    watch_stopped: bool = False
    cancelled: bool = False


# The engine's file modes (Go's fs.FileMode) in an archive's stat: a directory, a link.
_MODE_DIR = 1 << 31
_MODE_SYMLINK = 1 << 27
# Images whose /app was found a directory (or absent): an image's files never change.
_APP_CHECKED: set[str] = set()


def image_app_check(image: str) -> None:
    """Refuse an image whose ``/app`` is a link or a file before any container of it runs:
    the engine would mount the workspace where the link leads (resolved inside the
    container's root) or fail. No /app is fine (the engine makes an empty one). Raises
    ImageUnavailable or WorkspaceUnreadable."""
    client = engine_client()
    with engine_errors("looking at the task image"):
        try:
            image_id = client.api.inspect_image(image)["Id"]
        except docker.errors.ImageNotFound as exc:
            raise ImageUnavailable(f"the image {image} is not on the Docker engine") from exc
    if image_id in _APP_CHECKED:
        return
    with engine_errors("creating a container to look at the image's /app"):
        created = client.api.create_container(
            image_id,
            entrypoint=["true"],
            labels=coevo_labels(kind=KIND_PROBE),
            host_config=client.api.create_host_config(network_mode="none"),
            use_config_proxy=False,
        )
    try:
        try:
            with engine_errors("looking at the image's /app"):
                chunks, stat = client.api.get_archive(created["Id"], APP)
                chunks.close()  # the stat is all it needs, not the files
        except docker.errors.NotFound:
            stat = {"mode": _MODE_DIR}
        mode = int(stat.get("mode") or 0)
        if mode & _MODE_SYMLINK or stat.get("linkTarget") or not mode & _MODE_DIR:
            raise WorkspaceUnreadable(
                "the task image's /app is not a directory (a link or a file): coevo mounts "
                "the workspace there"
            )
    finally:
        with contextlib.suppress(Exception):
            container_remove(client, created["Id"])
    _APP_CHECKED.add(image_id)


@dataclass
class TaskContainer:
    """One rollout's running container of its task image (see the module doc)."""

    id: str
    image: str
    network: bool
    rollout: str | None = None
    stopped: bool = False
    # Where /app's volume is on this machine's disk: the worker watches and reads it there.
    app_path: Path | None = None

    @classmethod
    def start(
        cls,
        image: str,
        *,
        rollout: str | None,
        cpus: float,
        memory_bytes: int,
        pids: int,
        network: bool,
        binds: Mapping[Path, str] | None = None,
    ) -> TaskContainer:
        """A started container of ``image`` whose /app is a volume of its own that the engine
        filled from the image's /app (its files, owners, modes and links as the image has
        them), with ``binds`` (the harness's own files: workers/environments/workspace.py)
        read-only. Raises ImageUnavailable, or ContainerUnavailable when the engine fails, the
        image cannot keep a container alive (it has no ``sleep``), or the volume's files are
        not on this machine's disk where the worker can read them."""
        client = engine_client()
        # An anonymous volume: removed with the container (``container_remove``), by the
        # worker or by ``engine_reap``. The engine copies the image's /app into it.
        app = Mount(APP, None, type="volume", labels=coevo_labels(kind=KIND_RUN, rollout=rollout))
        host_config = contained_host_config(
            client,
            mounts=[*bind_mounts(binds, None), app],
            network=network,
            cpus=cpus,
            memory_bytes=memory_bytes,
            pids=pids,
        )
        with engine_errors("creating the task's container"):
            try:
                created = client.api.create_container(
                    image,
                    entrypoint=KEEPALIVE[:1],
                    command=KEEPALIVE[1:],
                    working_dir=APP,
                    labels=coevo_labels(kind=KIND_RUN, rollout=rollout),
                    host_config=host_config,
                    use_config_proxy=False,
                )
            except docker.errors.ImageNotFound as exc:
                raise ImageUnavailable(f"the image {image} is not on the Docker engine") from exc
        container = cls(created["Id"], image, network, rollout)
        try:
            with engine_errors("starting the task's container"):
                client.api.start(container.id)
            time.sleep(0.05)
            inspected = client.api.inspect_container(container.id)
            state = inspected["State"]
            if not state.get("Running"):
                raise ContainerUnavailable(
                    f"the task's container of {image} ended at once (exit {state.get('ExitCode')}"
                    f"{', ' + state['Error'] if state.get('Error') else ''}): coevo keeps it "
                    "alive with `sleep infinity`, which the image must have"
                )
            container.app_path = _app_source(inspected)
        except BaseException:
            container.remove()
            raise
        return container

    def exec(
        self,
        argv: list[str],
        *,
        timeout_s: float,
        env: Mapping[str, str] | None = None,
        workdir: str = APP,
        max_output_bytes: int = 1024 * 1024,
        output_limit_bytes: int = 64 * 1024 * 1024,
        cancel: threading.Event | None = None,
        watch: Callable[[], bool] | None = None,
    ) -> ContainerExec:
        """Run ``argv`` in the container as root (see the module doc). At most
        ``max_output_bytes`` of stdout and of stderr are kept (their ends); ``watch``, called
        every ``WATCH_EVERY_S``, stops the command when it returns True."""
        if self.stopped:
            raise ContainerUnavailable("the task's container is stopped: no command may run in it")
        client = engine_client()
        with engine_errors("starting a command in the task's container"):
            exec_id = client.api.exec_create(
                self.id,
                argv,
                stdout=True,
                stderr=True,
                environment=dict(env or {}),
                workdir=workdir,
                user="0",
            )["Id"]
            stream = client.api.exec_start(exec_id, socket=True)
        raw: socket.socket = getattr(stream, "_sock", stream)
        started = time.monotonic()
        done = threading.Event()
        why: dict[str, bool] = {}
        flooded = threading.Event()  # more than output_limit_bytes written

        def stop_command(reason: str) -> None:
            why[reason] = True
            self.kill_exec(exec_id)
            # Whatever still holds the command's output open (a process that left its tree)
            # does not keep the worker reading.
            if not done.wait(DRAIN_AFTER_KILL_S):
                with contextlib.suppress(OSError):
                    raw.shutdown(socket.SHUT_RDWR)

        def watcher() -> None:
            deadline = started + timeout_s
            next_watch = started + WATCH_EVERY_S
            while not done.wait(POLL_S):
                now = time.monotonic()
                if flooded.is_set():
                    return stop_command("output_exceeded")
                if cancel is not None and cancel.is_set():
                    return stop_command("cancelled")
                if now >= deadline:
                    return stop_command("timed_out")
                if watch is not None and now >= next_watch:
                    next_watch = now + WATCH_EVERY_S
                    if watch():
                        return stop_command("watch_stopped")

        thread = threading.Thread(target=watcher, name="coevo-container-exec", daemon=True)
        thread.start()
        try:
            stdout, stderr = stream_tails(
                stream,
                max_output_bytes=max_output_bytes,
                output_limit_bytes=output_limit_bytes,
                flooded=flooded.set,
            )
        finally:
            done.set()
            thread.join()
            with contextlib.suppress(OSError):
                stream.close()
            with contextlib.suppress(OSError):
                raw.close()
        returncode = None
        if not why:
            with engine_errors("reading a command's exit status"):
                returncode = client.api.exec_inspect(exec_id).get("ExitCode")
        return ContainerExec(
            returncode=returncode,
            stdout=stdout,
            stderr=stderr,
            timed_out=bool(why.get("timed_out")),
            output_exceeded=bool(why.get("output_exceeded")),
            watch_stopped=bool(why.get("watch_stopped")),
            cancelled=bool(why.get("cancelled")),
        )

    def kill_exec(self, exec_id: str) -> None:
        """SIGKILL a command and its descendants. The engine has no call for it: the command's
        pid (as the worker's machine sees it) comes from the engine, its descendants from
        /proc, once its cgroup shows it is the container's. Where the worker cannot see that
        process (an engine on another machine, a worker in a PID namespace of its own), the
        whole container is stopped instead: the rollout's later commands then fail."""
        pid = 0
        # Just after its start the engine may not have its pid yet (0 while it starts).
        for _ in range(int(PID_WAIT_S / POLL_S)):
            try:
                state = engine_client().api.exec_inspect(exec_id)
            except (docker.errors.DockerException, OSError):
                break
            pid = int(state.get("Pid") or 0)
            if pid > 0 or not state.get("Running"):
                break
            time.sleep(POLL_S)
        if pid <= 0 or not _in_container(pid, self.id) or not _process_tree_kill(pid):
            self.stop()

    def image_path(self) -> str:
        """The PATH the image sets (its ENV), or the usual directories where it sets none."""
        with engine_errors("reading the task container's configuration"):
            config = engine_client().api.inspect_container(self.id).get("Config") or {}
        for entry in config.get("Env") or []:
            if entry.startswith("PATH="):
                return entry[len("PATH=") :]
        return DEFAULT_PATH

    def put_tree(self, tree: Mapping[str, Mapping[str, Any]], target: str) -> None:
        """Write a stored tree (validated) into the container at ``target`` (made, empty),
        root-owned and read-only to others: a task's solution for its check."""
        tree = tree_validate(dict(tree), label=target)
        buffer = io.BytesIO()
        top = target.strip("/")
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            directories = {top}
            for path in sorted(tree):
                parts = f"{top}/{path}".split("/")
                directories.update("/".join(parts[:i]) for i in range(1, len(parts)))
            for directory in sorted(directories):
                info = tarfile.TarInfo(directory)
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                archive.addfile(info)
            for path, spec in sorted(tree.items()):
                data = spec_bytes(spec)
                info = tarfile.TarInfo(f"{top}/{path}")
                info.size, info.mode = len(data), 0o755 if spec.get("executable") else 0o644
                archive.addfile(info, io.BytesIO(data))
        client = engine_client()
        with engine_errors("copying files into the task's container"):
            client.api.put_archive(self.id, "/", buffer.getvalue())

    def stop(self) -> None:
        """Kill every process of the container and wait for its end (idempotent)."""
        if self.stopped:
            return
        client = engine_client()
        with contextlib.suppress(docker.errors.APIError), engine_errors("stopping a container"):
            client.api.kill(self.id)
        with engine_errors("waiting for a container's end"):
            client.api.wait(self.id, timeout=WAIT_AFTER_KILL_S)
        self.stopped = True

    def changes(self, *, limit: int = MAX_CHANGES) -> list[tuple[str, str]]:
        """What the container changed in its image's files (the engine's diff of its writable
        layer; binds such as /app are not in it): ``(path, "added"|"changed"|"deleted")``,
        at most ``limit``."""
        client = engine_client()
        with engine_errors("listing a container's changes"):
            rows = client.api.diff(self.id) or []
        kinds = {0: "changed", 1: "added", 2: "deleted"}
        return [(str(r.get("Path", ""))[:400], kinds.get(r.get("Kind"), "changed")) for r in rows][
            :limit
        ]

    def commit(self) -> str:
        """An image of the container's final state (stop it first): the verifier runs in it."""
        return container_commit(self.id, rollout=self.rollout)

    def remove(self) -> None:
        with contextlib.suppress(Exception):
            container_remove(engine_client(), self.id)
        self.stopped = True


def _app_source(inspected: Mapping[str, Any]) -> Path:
    """The directory of the container's /app volume on this machine, checked readable: the
    engine must be local and its volumes readable by the worker (root with the machine's or
    coevo's own engine; the engine's user with a rootless one)."""
    for mount in inspected.get("Mounts") or []:
        if mount.get("Destination") == APP and mount.get("Type") == "volume":
            source = Path(str(mount.get("Source") or ""))
            if source.is_absolute() and source.is_dir() and os.access(source, os.R_OK | os.X_OK):
                return source
            raise ContainerUnavailable(
                f"the task container's /app volume ({source}) is not readable on this machine: "
                "the worker must run beside the engine, as root for a rootful engine or as the "
                "engine's user for a rootless one (docs/deployment.md, 'The container backend')"
            )
    raise ContainerUnavailable("the engine mounted no volume at the task container's /app")


def _in_container(pid: int, container: str) -> bool:
    """Whether ``pid``, as this machine sees it, is a process of ``container`` (its cgroup
    names the container): a worker in a PID namespace of its own (a worker in a container)
    sees other processes under the same numbers, and must not kill those."""
    try:
        with open(f"/proc/{pid}/cgroup", "rb") as handle:
            return container.encode() in handle.read(64 * 1024)
    except OSError:
        return False


def _process_tree_kill(pid: int) -> bool:
    """SIGKILL ``pid`` and every descendant of it, in rounds until none is left (one forking
    between a round's listing and its kills is caught by the next). False when this machine
    does not see ``pid`` (another PID namespace)."""
    if not os.path.exists(f"/proc/{pid}"):
        return False
    for _ in range(10):
        doomed = _descendants(pid) | ({pid} if os.path.exists(f"/proc/{pid}") else set())
        if not doomed:
            return True
        for target in doomed:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(target, signal.SIGKILL)
        time.sleep(0.02)
    return True


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = proc_stat_fields(entry.name)
        if fields is not None and len(fields) > 1 and fields[0] != b"Z":
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def container_settings(environment: Mapping[str, Any]) -> dict[str, Any]:
    """A task's ``[environment]`` resources and network as applied: each capped by the
    operator's maximum (and that maximum where the task sets none); internet only where both
    the task and the operator allow it."""
    cpus = float(environment.get("cpus") or settings.COEVO_CONTAINER_MAX_CPUS)
    memory = int(environment.get("memory_bytes") or settings.COEVO_CONTAINER_MAX_MEMORY_BYTES)
    return {
        "cpus": min(cpus, float(settings.COEVO_CONTAINER_MAX_CPUS)),
        "memory_bytes": min(memory, int(settings.COEVO_CONTAINER_MAX_MEMORY_BYTES)),
        "pids": int(settings.COEVO_CONTAINER_MAX_PIDS),
        "network": bool(environment.get("allow_internet"))
        and bool(settings.COEVO_CONTAINER_ALLOW_INTERNET),
    }
