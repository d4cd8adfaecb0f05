"""A harness process inside a rollout's task container, as the channel (workers/channel.py) sees
a sandboxed one: pipes on stdin, stdout and stderr, ``poll``, ``wait`` and ``kill``.

It is a command of the engine (an exec with its stdin attached) in the running container
(workers/containers/session.py): stdin goes to the engine's stream as written, stdout and
stderr come back multiplexed on it and are split into two pipes by a thread of the worker.
Its exit status is the engine's once the stream has ended. ``kill`` kills it with every
process it started that is still its descendant, as a command past its timeout is killed;
what left its tree ends with the container when the workspace is sealed.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import threading
from collections.abc import Mapping
from typing import IO, TYPE_CHECKING, Any

from docker.utils.socket import STDERR, STDOUT, frames_iter

from workers.containers.engine import ContainerUnavailable, engine_client, engine_errors

if TYPE_CHECKING:
    from workers.containers.session import TaskContainer

# The exit status when the engine cannot say (the stream cut by a kill before it could).
KILLED = -9


class _StdinWriter:
    """The engine stream's writing half, as the channel writes a pipe: ``close`` ends the
    process's stdin (a half-close; the engine passes it on)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.closed = False

    def write(self, data: bytes) -> int:
        if self.closed:
            raise BrokenPipeError("the harness's stdin is closed")
        self._sock.sendall(data)
        return len(data)

    def flush(self) -> None:
        return None

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_WR)


class ContainerProcess:
    """``argv`` running in ``container`` as root (see the module doc)."""

    def __init__(
        self,
        container: TaskContainer,
        argv: list[str],
        *,
        env: Mapping[str, str],
        workdir: str,
    ) -> None:
        if container.stopped:
            raise ContainerUnavailable("the task's container is stopped: the harness cannot start")
        self._container = container
        self._client = engine_client()
        with engine_errors("starting the harness in the task's container"):
            self._exec_id = self._client.api.exec_create(
                container.id,
                argv,
                stdin=True,
                stdout=True,
                stderr=True,
                environment=dict(env),
                workdir=workdir,
                user="0",
            )["Id"]
            self._stream = self._client.api.exec_start(self._exec_id, socket=True)
        self._sock: socket.socket = getattr(self._stream, "_sock", self._stream)
        out_read, self._out_write = os.pipe()
        err_read, self._err_write = os.pipe()
        self.stdin: IO[bytes] | None = _StdinWriter(self._sock)  # type: ignore[assignment]
        self.stdout: IO[bytes] | None = os.fdopen(out_read, "rb")
        self.stderr: IO[bytes] | None = os.fdopen(err_read, "rb")
        self.returncode: int | None = None
        self._killed = False
        self._ended = threading.Event()
        self._pump = threading.Thread(target=self._split, name="coevo-harness-stream", daemon=True)
        self._pump.start()

    def _split(self) -> None:
        """Copy the stream's frames to the two pipes until it ends; then the exit status."""
        targets = {STDOUT: self._out_write, STDERR: self._err_write}
        try:
            with contextlib.suppress(OSError, ValueError):
                for kind, data in frames_iter(self._stream, tty=False):
                    target = targets.get(kind)
                    if target is None:
                        continue
                    try:
                        view = memoryview(data)
                        while view:
                            view = view[os.write(target, view) :]
                    except OSError:  # the channel closed its end: the rest is dropped
                        targets.pop(kind)
        finally:
            for fd in (self._out_write, self._err_write):
                with contextlib.suppress(OSError):
                    os.close(fd)
            self.returncode = self._exit_status()
            self._ended.set()

    def _exit_status(self) -> int:
        try:
            state: dict[str, Any] = self._client.api.exec_inspect(self._exec_id)
        except Exception:  # the engine gone: the process with it
            return KILLED
        if state.get("Running") or state.get("ExitCode") is None:
            return KILLED
        return int(state["ExitCode"])

    def poll(self) -> int | None:
        return self.returncode if self._ended.is_set() else None

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired("harness", timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        """Kill the harness and its process tree, then cut the stream (what still holds it
        open has left the tree, and dies with the container)."""
        if self._ended.is_set():
            return
        self._killed = True
        self._container.kill_exec(self._exec_id)
        if not self._ended.wait(2.0):
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
