"""Running a trainer command: its own process group, a clean environment, the log streamed to
a file (and its tail to the database), a time limit, and cancellation.

The command runs outside the harness sandbox (it is an operator's program, on a training
machine), but it does not inherit the worker's environment: database URLs, the secret key and
API tokens stay out of it. Only the variables in PASS_THROUGH, the trainer's own ``env`` and
the ``COEVO_*`` inputs of the run are set.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# What a trainer may need from the worker's environment: where programs and caches are, which
# GPUs to use, offline switches. Nothing that carries a credential.
PASS_THROUGH = (
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "TMPDIR",
    "VIRTUAL_ENV",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "HF_HOME",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
)
# SIGTERM first (a trainer may save a checkpoint), SIGKILL this long after.
KILL_GRACE_S = 10.0
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: the kernel sends it SIGKILL if the worker dies (a SIGKILLed
    worker cannot stop its trainer, which would otherwise hold the GPU on its own)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the watchdog still fails the run
        pass


@dataclass(frozen=True)
class Finished:
    exit_code: int | None  # None: killed by coevo (time limit or cancel)
    reason: str  # "" when the command exited on its own
    log_bytes: int


def trainer_environment(*, extra: dict[str, str], inputs: dict[str, str]) -> dict[str, str]:
    env = {k: os.environ[k] for k in PASS_THROUGH if k in os.environ}
    env.update({str(k): str(v) for k, v in extra.items()})
    env.update(inputs)
    env.setdefault("PYTHONUNBUFFERED", "1")  # so a Python trainer's log streams
    return env


def log_tail(path: Path, limit: int) -> tuple[str, int]:
    """The last ``limit`` bytes of the log (decoded leniently) and the log's size."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return "", 0
    with path.open("rb") as f:
        f.seek(max(0, size - limit))
        data = f.read(limit)
    text = data.decode("utf-8", errors="replace")
    if size > limit:
        # Start at a line boundary, so the first line shown is whole.
        newline = text.find("\n")
        text = text[newline + 1 :] if 0 <= newline < 200 else text
    return text, size


def command_run(
    *,
    argv: list[str],
    cwd: Path,
    env: dict[str, str],
    log_path: Path,
    time_limit_s: float,
    on_tick: Callable[[], bool],
    tick_s: float = 2.0,
) -> Finished:
    """Run ``argv`` to completion, its stdout and stderr appended to ``log_path``.

    ``on_tick`` is called every ``tick_s`` while it runs (to stream the log and beat the heart);
    it returns True when the run should be cancelled. The command is stopped at
    ``time_limit_s``. Its whole process group is signalled, so a trainer's children (data
    loaders, torchrun ranks) stop with it.
    """
    started = time.monotonic()
    with log_path.open("ab") as log:
        try:
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        except OSError as exc:
            return Finished(None, f"the command could not start: {exc}", log_path.stat().st_size)
        reason = ""
        next_tick = started + tick_s
        try:
            while True:
                try:
                    code = proc.wait(timeout=0.2)
                    break
                except subprocess.TimeoutExpired:
                    pass
                now = time.monotonic()
                if now - started > time_limit_s:
                    reason = f"time limit of {time_limit_s:g} s exceeded: the command was stopped"
                    _stop(proc)
                    break
                if now >= next_tick:
                    next_tick = now + tick_s
                    if on_tick():
                        reason = "cancelled: the command was stopped"
                        _stop(proc)
                        break
        except BaseException:
            # The task's own time limit, a warm shutdown, a database error in on_tick: the
            # command must not outlive the code that watches it.
            _stop(proc)
            raise
        # Whatever the leader left behind in its group (a data loader it did not reap).
        _signal_group(proc, signal.SIGKILL)
    size = log_path.stat().st_size
    if reason:
        return Finished(None, reason, size)
    return Finished(code, "", size)


def _stop(proc: subprocess.Popen) -> None:
    _signal_group(proc, signal.SIGTERM)
    try:
        proc.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        _signal_group(proc, signal.SIGKILL)
        proc.wait()
    # Children that ignored SIGTERM and outlived the leader.
    _signal_group(proc, signal.SIGKILL)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
