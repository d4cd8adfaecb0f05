"""The channel between the worker and a sandboxed harness: JSON lines over stdin/stdout.

The harness process runs ``python -m coevo_runtime`` (workers/runtime/, standard library only)
in the sandbox. Everything it writes is bounded here: a message's size, the whole of stdout,
stderr (of which the tail is kept for the trace) and the wall time, enforced from a timer as
well so that nothing the worker blocks on can hold the rollout past it. Each way the
conversation can break raises its own fault (workers/outcomes.py).
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
import time
from pathlib import Path
from typing import Any

from django.conf import settings

from coevo.errors import SandboxUnavailable
from workers import sandbox
from workers.containers.host_runtime import HostRuntime
from workers.containers.process import ContainerProcess
from workers.containers.session import TaskContainer
from workers.harness_env import harness_env_binds, harness_env_vars
from workers.limits import wall_time_exceeded
from workers.outcomes import HarnessExited, HarnessFault, LimitExceeded, ProtocolViolation
from workers.warm import warm_spawn

RUNTIME_DIR = Path(__file__).resolve().parent / "runtime"
MAX_MESSAGE_BYTES = 1024 * 1024
# How often a receive looks at the clock again (it may have been paused, or resumed).
_PAUSED_POLL_S = 1.0
MAX_STDOUT_BYTES = 32 * 1024 * 1024
STDERR_TAIL_BYTES = 16 * 1024
# A flood on stderr would otherwise keep the worker reading until the wall time.
MAX_STDERR_BYTES = 8 * 1024 * 1024


def harness_binds(*, harness_dir: Path, harness_env: Path | None) -> dict[Path, str]:
    """The harness's own files, read-only wherever it runs: the coevo runtime, its tree, its
    built dependencies."""
    return {
        RUNTIME_DIR: "/opt/coevo",
        harness_dir.resolve(): "/harness",
        **harness_env_binds(harness_env),
    }


class HarnessChannel:
    """One harness process and the threads that read it; ``close`` ends both."""

    def __init__(
        self,
        *,
        harness_dir: Path,
        wall_s: int,
        deadline: float,
        program: bool = False,
        ro_binds: dict[Path, str] | None = None,
        harness_env: Path | None = None,
        rw_binds: dict[Path, str] | None = None,
        env: dict[str, str] | None = None,
        uid: int | None = None,
        container: TaskContainer | None = None,
        runtime: HostRuntime | None = None,
    ) -> None:
        """``program``: the launcher of a program harness (``coevo_runtime.program``) instead
        of the ``run(task, ctx)`` runtime; ``ro_binds`` adds read-only binds (the model
        boundary's socket directory); ``harness_env`` is the harness's built dependencies
        (workers/harness_env.py), mounted read-only on its PYTHONPATH and PATH; ``rw_binds``,
        ``env`` and ``uid`` give a workspace task's directory, its variables and the identity
        its other sandboxes share (workers/environments/workspace.py). ``container`` (with
        ``runtime``, the worker's interpreters there) runs the harness in a task's container
        instead, where its files were bound when the container started."""
        self.wall_s = wall_s
        self.deadline = deadline
        self.stderr_tail = bytearray()
        self._wall_expired = False
        self._stderr_exceeded = False
        module = "coevo_runtime.program" if program else "coevo_runtime"
        binds = {
            **harness_binds(harness_dir=harness_dir, harness_env=harness_env),
            **(ro_binds or {}),
        }
        sandbox_env = {**harness_env_vars(harness_env, pythonpath="/opt/coevo"), **(env or {})}
        limits = sandbox.SandboxLimits(
            cpu_s=wall_s + 5,
            **({"memory_bytes": settings.COEVO_PROGRAM_ADDRESS_SPACE_BYTES} if program else {}),
        )
        self._proc: sandbox.SandboxProcess
        if container is not None:
            # In a task's container (workers/environments/workspace.py): the image's world,
            # the container's limits, the worker's interpreter.
            assert runtime is not None
            self._proc = ContainerProcess(
                container,
                [runtime.python, "-s", "-m", module],
                env=sandbox_env,
                workdir="/harness",
            )
        else:
            # A run(task, ctx) harness without a workspace forks from its tree's warm sandbox
            # where the worker has one (workers/warm.py); the rest start a sandbox of their own.
            warm_process = None
            if not program and not ro_binds and not rw_binds and not env and uid is None:
                warm_process = warm_spawn(
                    harness_dir=harness_dir,
                    ro_binds=binds,
                    env=sandbox_env,
                    cwd="/harness",
                    limits=limits,
                )
            self._proc = warm_process or sandbox.spawn(
                [sandbox.python_executable(), "-s", "-m", module],
                ro_binds=binds,
                env=sandbox_env,
                cwd="/harness",
                rw_binds=rw_binds,
                uid=uid,
                limits=limits,
            )
        self._killer_lock = threading.Lock()
        self._closed = False
        self._paused_at: float | None = None
        with self._killer_lock:
            self._start_killer(wall_s)
        self._lines: queue.Queue[bytes | None] = queue.Queue()
        self._stdout_thread = threading.Thread(target=self._pump_stdout, daemon=True)
        self._stdout_thread.start()
        self._stderr_thread = threading.Thread(target=self._pump_stderr, daemon=True)
        self._stderr_thread.start()

    def pause(self) -> None:
        """Stop the wall clock (the timer that kills the harness included): the harness waits
        for the platform (a policy slot), which is not its time."""
        with self._killer_lock:
            if self._wall_expired or self._closed or self._paused_at is not None:
                return
            self._paused_at = time.monotonic()
            self._killer.cancel()

    def resume(self) -> None:
        """Start the wall clock again, its deadline later by the time it stood still."""
        with self._killer_lock:
            if self._paused_at is None:
                return
            self.deadline += time.monotonic() - self._paused_at
            self._paused_at = None
            if not (self._wall_expired or self._closed):
                self._start_killer(max(0.0, self.deadline - time.monotonic()))

    def _remaining(self) -> float:
        with self._killer_lock:
            if self._paused_at is not None:
                return float("inf")
            return self.deadline - time.monotonic()

    def send(self, message: dict[str, Any]) -> None:
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(json.dumps(message).encode() + b"\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError):
            # The harness is gone; receive() reports how it ended.
            pass

    def receive(self, *, poll_s: float | None = None) -> dict[str, Any] | None:
        """The harness's next message; raises the fault when there is none or it is malformed.
        With ``poll_s``, None when no message came within that many seconds."""
        while True:
            remaining = self._remaining()
            if remaining <= 0:
                raise wall_time_exceeded(self.wall_s)
            # A paused clock has no deadline to wait for: look again every second.
            wait = min(remaining, poll_s or remaining, _PAUSED_POLL_S)
            try:
                line = self._lines.get(timeout=wait)
                break
            except queue.Empty:
                if poll_s is not None and wait >= poll_s and self._remaining() > 0:
                    return None
                if self._remaining() <= 0:
                    raise wall_time_exceeded(self.wall_s) from None
        if line is None:
            raise self._ended()
        if len(line) > MAX_MESSAGE_BYTES:
            raise ProtocolViolation(
                f"protocol violation: a message on stdout exceeds {MAX_MESSAGE_BYTES} bytes"
            )
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):  # RecursionError: nested too deep to parse
            raise ProtocolViolation(
                "protocol violation: the harness wrote non-JSON to stdout "
                f"({line[:120].decode(errors='replace')!r}); stdout is the channel to the worker, "
                "use ctx.log() for messages"
            ) from None
        if not isinstance(message, dict):
            raise ProtocolViolation("protocol violation: a message on stdout is not a JSON object")
        return message

    def wait_for_stderr(self, timeout: float) -> None:
        """Give the stderr reader time to catch up (a traceback the harness just wrote)."""
        self._stderr_thread.join(timeout=timeout)

    def kill(self) -> None:
        """Stop the harness now (receive then reports it ended); close still cleans up."""
        sandbox.terminate(self._proc)

    def close(self) -> None:
        """Kill the harness and close its pipes (a worker runs thousands of rollouts: none may
        leak a file descriptor)."""
        with self._killer_lock:
            self._closed = True
            self._killer.cancel()
        sandbox.terminate(self._proc)
        self._stderr_thread.join(timeout=2)
        self._stdout_thread.join(timeout=2)
        pipes = [
            (self._proc.stdin, None),
            (self._proc.stdout, self._stdout_thread),
            (self._proc.stderr, self._stderr_thread),
        ]
        for pipe, reader in pipes:
            # A reader still running keeps its pipe (closing a file under a blocked read is
            # not safe); it ends at EOF, since the sandbox and all it started are dead.
            if pipe is not None and (reader is None or not reader.is_alive()):
                with contextlib.suppress(OSError):
                    pipe.close()

    def _ended(self) -> HarnessFault | SandboxUnavailable:
        """stdout closed: how the harness ended."""
        code = self._proc.wait()
        if self._wall_expired:
            return wall_time_exceeded(self.wall_s)
        self._stderr_thread.join(timeout=2)
        if self._stderr_exceeded:
            return LimitExceeded(f"limit exceeded: more than {MAX_STDERR_BYTES} bytes on stderr")
        if self.stderr_tail.startswith(b"bwrap:"):
            return SandboxUnavailable(
                f"the sandbox failed to start: {self.stderr_tail.decode(errors='replace')[:500]}"
            )
        how = f"was killed by signal {-code}" if code and code < 0 else f"exited with code {code}"
        return HarnessExited(f"the harness process {how} before answering")

    def _expire(self) -> None:
        with self._killer_lock:
            if self._closed or self._paused_at is not None:
                return
            remaining = self.deadline - time.monotonic()
            if remaining > 0:  # extended since this timer started (or it woke early)
                self._start_killer(remaining)
                return
            self._wall_expired = True
        sandbox.terminate(self._proc)

    def _start_killer(self, seconds: float) -> None:
        """Called with ``_killer_lock`` held."""
        self._killer = threading.Timer(seconds, self._expire)
        self._killer.daemon = True
        self._killer.start()

    def _pump_stdout(self) -> None:
        assert self._proc.stdout is not None
        total = 0
        while True:
            line = self._proc.stdout.readline(MAX_MESSAGE_BYTES + 1)
            if not line:
                break
            total += len(line)
            if total > MAX_STDOUT_BYTES:
                self._lines.put(b"x" * (MAX_MESSAGE_BYTES + 1))
                break
            self._lines.put(line)
        self._lines.put(None)

    def _pump_stderr(self) -> None:
        assert self._proc.stderr is not None
        total = 0
        while chunk := self._proc.stderr.read(4096):
            self.stderr_tail.extend(chunk)
            del self.stderr_tail[:-STDERR_TAIL_BYTES]
            total += len(chunk)
            if total > MAX_STDERR_BYTES and not self._stderr_exceeded:
                self._stderr_exceeded = True
                sandbox.terminate(self._proc)
