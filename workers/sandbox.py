"""Running untrusted code: a bubblewrap sandbox with resource limits.

Inside: read-only system and Python, the given read-only binds, a private /tmp, no network,
a cleared environment (no database or broker credentials), its own session and PID namespace,
and rlimits on CPU time, address space and file size. The caller adds the wall-clock timeout
and bounds what it reads back.

With no ``bwrap`` on the machine nothing untrusted runs, unless the operator sets
COEVO_ALLOW_UNSANDBOXED=1 (then the same limits apply to a plain child process).
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from coevo.errors import SandboxUnavailable


@dataclass(frozen=True)
class SandboxLimits:
    cpu_s: int = 600
    memory_bytes: int = 4 * 1024**3
    file_bytes: int = 64 * 1024**2
    open_files: int = 256


@dataclass(frozen=True)
class SandboxRun:
    returncode: int | None
    stdout: bytes
    stderr: bytes
    timed_out: bool


def sandbox_mode() -> str:
    """``"bwrap"`` or ``"unsandboxed"``; raises SandboxUnavailable when neither is allowed."""
    if shutil.which("bwrap"):
        return "bwrap"
    if settings.COEVO_ALLOW_UNSANDBOXED:
        return "unsandboxed"
    raise SandboxUnavailable(
        "bubblewrap (bwrap) is not installed, so coevo refuses to run untrusted harness code. "
        "Install it (Debian/Ubuntu: apt-get install bubblewrap), or set COEVO_ALLOW_UNSANDBOXED=1 "
        "to run harnesses without a sandbox on a machine you do not mind them harming."
    )


def python_executable() -> str:
    return sys.executable


def sandbox_argv(
    argv: list[str],
    *,
    ro_binds: Mapping[Path, str],
    env: Mapping[str, str],
    cwd: str,
    mode: str,
) -> list[str]:
    if mode == "unsandboxed":
        return list(argv)
    args = [
        "bwrap",
        "--unshare-all",  # network, IPC, PID, UTS, cgroup and user namespaces
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
        "--tmpfs",
        "/tmp",
    ]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for path in ("/etc/localtime", "/etc/alternatives", "/etc/ld.so.cache"):
        args += ["--ro-bind-try", path, path]
    # The interpreter and the worker's packages (harnesses may import them), at the same paths.
    for prefix in sorted({sys.base_prefix, sys.prefix}):
        if not prefix.startswith("/usr/"):
            args += ["--ro-bind", prefix, prefix]
    for source, target in ro_binds.items():
        args += ["--ro-bind", str(source), target]
    for key, value in env.items():
        args += ["--setenv", key, value]
    args += ["--chdir", cwd, "--"]
    return args + list(argv)


def spawn(
    argv: list[str],
    *,
    ro_binds: Mapping[Path, str] | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str = "/tmp",
    limits: SandboxLimits | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in the sandbox with pipes on stdin, stdout and stderr."""
    mode = sandbox_mode()
    limits = limits or SandboxLimits()
    base_env = {
        "HOME": "/tmp",
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "PATH": "/usr/local/bin:/usr/bin:/bin",
    }
    full_env = {**base_env, **(env or {})}
    binds = dict(ro_binds or {})
    if mode == "unsandboxed":
        # Without bwrap the bind targets do not exist: point the environment at the sources.
        remap = {target: str(source) for source, target in binds.items()}
        full_env = {k: _remap(v, remap) for k, v in full_env.items()}
        cwd = _remap(cwd, remap)
        argv = [_remap(a, remap) for a in argv]
    command = sandbox_argv(argv, ro_binds=binds, env=full_env, cwd=cwd, mode=mode)
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
        preexec_fn=lambda: _apply_limits(limits),
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
) -> SandboxRun:
    """Run to completion (or the timeout) and return bounded output."""
    proc = spawn(argv, ro_binds=ro_binds, env=env, cwd=cwd, limits=limits)
    try:
        stdout, stderr = proc.communicate(stdin, timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        terminate(proc)
        stdout, stderr = proc.communicate()
        timed_out = True
    return SandboxRun(
        returncode=None if timed_out else proc.returncode,
        stdout=stdout[-max_output_bytes:],
        stderr=stderr[-max_output_bytes:],
        timed_out=timed_out,
    )


def terminate(proc: subprocess.Popen[bytes]) -> None:
    """Kill the whole process group (the harness may have started children)."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _apply_limits(limits: SandboxLimits) -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 5))
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _remap(value: str, remap: Mapping[str, str]) -> str:
    for target, source in remap.items():
        if value == target or value.startswith(target + "/"):
            return source + value[len(target) :]
    return value
