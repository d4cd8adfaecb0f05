"""Warm sandboxes: a pre-started interpreter per candidate tree forks each rollout's harness
into a fresh sandbox of its own.

A cold rollout starts bwrap, a Python interpreter that drops to the rollout's uid, then the
harness's interpreter and the runtime's imports: about 60 ms of CPU on this project's CI
machine before the harness's first line. Here one *zygote* per candidate tree (the tree, its
built dependencies, the same environment) is started once, in a bubblewrap sandbox of that
tree, with the runtime imported; each rollout is a fork of it that makes new namespaces, a
fresh /tmp, /dev/shm and /proc, its own loopback, the rollout's rlimits and a fresh uid before
the harness's code is imported (coevo_runtime/zygote.py has the steps and the reasons). The
zygote never runs harness code, so nothing of one rollout reaches the next; what differs
from a cold sandbox is written up in docs/threat-model.md.

Opt-in (COEVO_WARM_SANDBOXES=1), for ``run(task, ctx)`` harnesses without a workspace on
workers running as root (each rollout needs an identity of its own) whose Python is not
installed under /tmp (a rollout's fresh /tmp would cover it); everything else, and every worker
where a zygote cannot start (no bwrap, an older kernel or bubblewrap, a user namespace without
spare ids), keeps the cold path, after one warning.

Zygotes unused for COEVO_WARM_SANDBOX_IDLE_S are closed, and at most COEVO_WARM_SANDBOXES_MAX
live at once (the least recently used idle one is closed first).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from django.conf import settings

from workers import metrics, sandbox

logger = logging.getLogger(__name__)

# A zygote that has not said ready within this long is given up on (and the cold path used).
START_TIMEOUT_S = 20.0
MAX_MESSAGE_BYTES = 64 * 1024


class WarmProcess:
    """One rollout's harness in a warm sandbox, with what the channel uses of ``Popen``."""

    def __init__(self, zygote: Zygote, rollout: int, stdin: int, stdout: int, stderr: int) -> None:
        self._zygote = zygote
        self._rollout = rollout
        self.stdin: io.BufferedWriter | None = open(stdin, "wb")  # noqa: SIM115 (the channel closes them)
        self.stdout: io.BufferedReader | None = open(stdout, "rb")  # noqa: SIM115
        self.stderr: io.BufferedReader | None = open(stderr, "rb")  # noqa: SIM115
        self.returncode: int | None = None
        self._ended = threading.Event()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired("warm sandbox", timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        """Kill the rollout's sandbox and everything in it (its PID namespace ends)."""
        if self.returncode is None:
            self._zygote.kill(self._rollout)

    def finish(self, returncode: int) -> None:
        if self.returncode is None:
            self.returncode = returncode
        self._ended.set()


class Zygote:
    """One candidate tree's zygote: its bwrap process, the control socket and its reader."""

    def __init__(self, key: tuple[Any, ...], process: subprocess.Popen[bytes], control: socket.socket, errors: socket.socket) -> None:  # fmt: skip
        self.key = key
        self.process = process
        self._control = control
        self._errors = errors
        self._lock = threading.Lock()
        self._rollouts: dict[int, WarmProcess] = {}
        self._next = 0
        self._ready = threading.Event()
        self.failure = ""
        self.slow = False
        self.closed = False
        self._shut = False
        self.last_used = time.monotonic()
        self._reader = threading.Thread(target=self._read, name="coevo-zygote", daemon=True)
        self._reader.start()

    @property
    def in_flight(self) -> int:
        return len(self._rollouts)

    def wait_ready(self) -> bool:
        """True once the zygote made its probe sandbox; False (``failure`` says why) if not,
        ``slow`` when it only did not answer in time (a loaded machine, not a broken one)."""
        if not self._ready.wait(START_TIMEOUT_S):
            self.slow = True
            self.failure = self.failure or f"no answer within {START_TIMEOUT_S:.0f}s"
        return not self.failure and not self.closed

    def spawn(self, *, uid: int, limits: sandbox.SandboxLimits, cwd: str) -> WarmProcess:
        """Fork a rollout: its pipes go to the zygote, the worker keeps the other ends."""
        pipes = [os.pipe() for _ in range(3)]
        theirs = [pipes[0][0], pipes[1][1], pipes[2][1]]
        with self._lock:
            if self.closed:
                for fd in (*theirs, pipes[0][1], pipes[1][0], pipes[2][0]):
                    os.close(fd)
                raise OSError("the zygote is closed")
            self._next += 1
            rollout = self._next
            process = WarmProcess(self, rollout, pipes[0][1], pipes[1][0], pipes[2][0])
            self._rollouts[rollout] = process
            self.last_used = time.monotonic()
            request = {
                "op": "spawn",
                "id": rollout,
                "uid": uid,
                "cwd": cwd,
                "limits": _limits_payload(limits),
            }
            try:
                socket.send_fds(self._control, [json.dumps(request).encode()], theirs)
            except OSError:
                self._rollouts.pop(rollout, None)
                process.finish(-signal.SIGKILL)
            finally:
                for fd in theirs:
                    os.close(fd)
        return process

    def kill(self, rollout: int) -> None:
        with self._lock, contextlib.suppress(OSError):
            self._control.send(json.dumps({"op": "kill", "id": rollout}).encode())

    def close(self) -> None:
        """End the zygote and every rollout it still runs (once: later calls do nothing)."""
        with self._lock:
            self.closed = True
            if self._shut:
                return
            self._shut = True
        with contextlib.suppress(OSError):
            self._control.shutdown(socket.SHUT_RDWR)
        if self.process.poll() is None:  # not reaped yet: its pid is still its own
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self._reader.join(timeout=5)
        self._control.close()
        self._errors.close()

    def _read(self) -> None:
        while True:
            try:
                data = self._control.recv(MAX_MESSAGE_BYTES)
            except OSError:
                data = b""
            if not data:
                break
            try:
                message = json.loads(data)
            except ValueError:
                continue
            op = message.get("op")
            if op == "ready":
                if not message.get("ok"):
                    self.failure = message.get("error") or "its probe sandbox failed"
                self._ready.set()
            elif op in ("exited", "refused"):
                with self._lock:
                    process = self._rollouts.pop(message.get("id"), None)
                    self.last_used = time.monotonic()
                if process is not None:
                    process.finish(int(message.get("status", -signal.SIGKILL)))
        # The zygote is gone: so is every sandbox it made (each dies with its parent).
        with self._lock:
            self.closed = True
            ended, self._rollouts = list(self._rollouts.values()), {}
        if not self._ready.is_set():
            self.failure = self.failure or self._stderr() or "the zygote exited before it was ready"
            self._ready.set()
        for process in ended:
            process.finish(-signal.SIGKILL)

    def _stderr(self) -> str:
        self._errors.settimeout(1)
        with contextlib.suppress(OSError):
            return self._errors.recv(4000).decode(errors="replace").strip()
        return ""


class WarmPool:
    """The zygotes of this worker process, by candidate tree."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._zygotes: dict[tuple[Any, ...], Zygote] = {}
        # Out of the pool, their bwrap processes not yet reaped (closed outside the lock).
        self._closing: set[Zygote] = set()
        self._starting: dict[tuple[Any, ...], threading.Event] = {}
        self.unavailable = ""
        # Zygotes start from one long-lived thread: bwrap's --die-with-parent follows the
        # thread that started it, and a rollout's thread may end while the zygote should live.
        self._starter = ThreadPoolExecutor(1, thread_name_prefix="coevo-zygote-start")
        self._reaper: threading.Thread | None = None

    def spawn(
        self,
        *,
        harness_dir: Path,
        ro_binds: Mapping[Path, str],
        env: Mapping[str, str],
        cwd: str,
        limits: sandbox.SandboxLimits,
    ) -> WarmProcess | None:
        """The rollout's harness in a warm sandbox, or None: use the cold path."""
        if self.unavailable:
            return None
        # The tree's inode too: a tree removed and exported again is another zygote's.
        tree = harness_dir.resolve()
        key = (str(tree), tree.stat().st_ino, tuple(sorted((str(k), v) for k, v in ro_binds.items())), tuple(sorted(env.items())), cwd)  # fmt: skip
        zygote = self._zygote(key, ro_binds=ro_binds, env=env, cwd=cwd)
        if zygote is None:
            return None
        try:
            process = zygote.spawn(uid=sandbox.sandbox_uid() or 0, limits=limits, cwd=cwd)
        except OSError:
            return None
        metrics.sandbox_started(kind="warm")
        return process

    def zygote_pids(self) -> list[int]:
        """The zygotes' bwrap processes (children of this process that outlive rollouts): the
        live ones, and any still being closed."""
        self._evict()
        with self._lock:
            return [z.process.pid for z in [*self._zygotes.values(), *self._closing]]

    def in_flight(self) -> int:
        with self._lock:
            return sum(z.in_flight for z in self._zygotes.values())

    def close(self) -> None:
        """Close every zygote (tests; a worker's zygotes otherwise die with it)."""
        with self._lock:
            zygotes, self._zygotes = list(self._zygotes.values()), {}
            self._closing.update(zygotes)
        self._close_out_of_pool(zygotes)

    def _close_out_of_pool(self, zygotes: list[Zygote]) -> None:
        """Close zygotes already taken out of the pool (and put in ``_closing``, so that they
        are still counted as zygotes until their bwrap processes are reaped): outside the
        lock, since closing waits for the process."""
        for zygote in zygotes:
            try:
                zygote.close()
            finally:
                with self._lock:
                    self._closing.discard(zygote)

    def _zygote(self, key: tuple[Any, ...], **options: Any) -> Zygote | None:
        while True:
            dead = None
            with self._lock:
                zygote = self._zygotes.get(key)
                if zygote is not None and not zygote.closed:
                    zygote.last_used = time.monotonic()
                    return zygote
                if zygote is not None:  # it died under its rollouts: reaped before replaced
                    dead = self._zygotes.pop(key)
                    self._closing.add(dead)
                else:
                    starting = self._starting.get(key)
                    if starting is None:
                        self._starting[key] = threading.Event()
                        break
            if dead is not None:
                self._close_out_of_pool([dead])
                continue
            starting.wait(START_TIMEOUT_S + 5)
            if self.unavailable:
                return None
        try:
            zygote = self._starter.submit(self._start, key, **options).result()
        except (OSError, sandbox.SandboxUnavailable) as exc:
            self._disable(str(exc))
            zygote = None
        if zygote is not None and not zygote.wait_ready():
            if zygote.slow:  # this rollout starts cold; the next one tries again
                logger.warning("A warm sandbox's zygote did not start: %s", zygote.failure)
            else:
                self._disable(zygote.failure)
            zygote.close()
            zygote = None
        with self._lock:
            if zygote is not None:
                self._zygotes[key] = zygote
            self._starting.pop(key).set()
            self._ensure_reaper()
        if zygote is not None:
            self._evict()
        return zygote

    def _start(self, key: tuple[Any, ...], *, ro_binds: Mapping[Path, str], env: Mapping[str, str], cwd: str) -> Zygote:  # fmt: skip
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        errors_ours, errors_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        probe_uid = sandbox.sandbox_uid() or 0
        argv = sandbox.sandbox_argv(
            [sandbox.python_executable(), "-s", "-m", "coevo_runtime.zygote", str(probe_uid)],
            ro_binds=ro_binds,
            env=sandbox.sandbox_env(env),
            cwd=cwd,
            mode="bwrap",
            zygote=True,
        )
        try:
            process = subprocess.Popen(
                argv,
                stdin=theirs,
                stdout=subprocess.DEVNULL,
                stderr=errors_theirs,
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                start_new_session=True,
                preexec_fn=_zygote_limits,
            )
        finally:
            theirs.close()
            errors_theirs.close()
        return Zygote(key, process, ours, errors_ours)

    def _disable(self, reason: str) -> None:
        if not self.unavailable:
            self.unavailable = reason.strip()[:500] or "unknown"
            metrics.sandbox_failure(reason="warm_unavailable")
            logger.warning(
                "Warm sandboxes are unavailable on this worker (%s); every rollout starts a "
                "sandbox of its own (slower, as safe).",
                self.unavailable,
            )

    def _evict(self) -> None:
        """Close idle zygotes: unused past the idle time, or the oldest past the maximum; and
        reap the dead (their rollouts have ended with them)."""
        now = time.monotonic()
        with self._lock:
            dead = [z for z in self._zygotes.values() if z.closed]
            for zygote in dead:
                self._zygotes.pop(zygote.key, None)
            idle = sorted(
                (z for z in self._zygotes.values() if z.in_flight == 0),
                key=lambda z: z.last_used,
            )
            over = max(0, len(self._zygotes) - settings.COEVO_WARM_SANDBOXES_MAX)
            doomed = idle[:over] + [
                z for z in idle[over:] if now - z.last_used > settings.COEVO_WARM_SANDBOX_IDLE_S
            ]
            for zygote in doomed:
                self._zygotes.pop(zygote.key, None)
            self._closing.update(dead + doomed)
        self._close_out_of_pool(dead + doomed)

    def _ensure_reaper(self) -> None:
        if self._reaper is None or not self._reaper.is_alive():
            self._reaper = threading.Thread(target=self._reap, name="coevo-zygote-idle", daemon=True)  # fmt: skip
            self._reaper.start()

    def _reap(self) -> None:
        while True:
            time.sleep(max(1.0, settings.COEVO_WARM_SANDBOX_IDLE_S / 4))
            self._evict()
            with self._lock:
                if not self._zygotes:
                    self._reaper = None
                    return


def _limits_payload(limits: sandbox.SandboxLimits) -> dict[str, int]:
    return {
        "cpu_s": limits.cpu_s,
        "memory_bytes": limits.memory_bytes,
        "file_bytes": limits.file_bytes,
        "open_files": limits.open_files,
        "processes": limits.processes,
        "tmp_bytes": limits.tmp_bytes,
        "shm_bytes": limits.shm_bytes,
        "nice": sandbox.SANDBOX_NICE,
    }


def _zygote_limits() -> None:
    """The zygote's own limits: no core files. Each rollout's are set in its sandbox (lower
    than anything here, which a rollout could not raise)."""
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def warm_possible(ro_binds: Mapping[Path, str]) -> bool:
    """False where a rollout's fresh /tmp would cover something the sandbox needs: the Python
    installation or a bound tree under /tmp (a checkout in /tmp, say). A cold sandbox makes
    its /tmp around those binds; the zygote's fork mounts a new /tmp over them."""
    places = [sys.prefix, sys.base_prefix, *ro_binds.values()]
    return not any(place == "/tmp" or place.startswith("/tmp/") for place in places)


_pool: WarmPool | None = None
_pool_lock = threading.Lock()


def pool() -> WarmPool:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = WarmPool()
        return _pool


def warm_spawn(
    *,
    harness_dir: Path,
    ro_binds: Mapping[Path, str],
    env: Mapping[str, str],
    cwd: str,
    limits: sandbox.SandboxLimits,
) -> WarmProcess | None:
    """A rollout's ``run(task, ctx)`` harness in a warm sandbox where this worker can, else
    None (the caller starts a cold one)."""
    if not settings.COEVO_WARM_SANDBOXES or os.geteuid() != 0:
        return None
    if sandbox.sandbox_mode() != "bwrap":
        return None
    if not warm_possible(ro_binds):
        return None
    return pool().spawn(harness_dir=harness_dir, ro_binds=ro_binds, env=env, cwd=cwd, limits=limits)
