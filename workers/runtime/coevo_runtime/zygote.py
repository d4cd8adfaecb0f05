"""A warm sandbox: one interpreter per candidate tree that forks each rollout's harness into a
fresh sandbox of its own (``python -m coevo_runtime.zygote``; workers/warm.py starts it).

The zygote runs inside a bubblewrap sandbox of the candidate's tree (read-only system, code
and tree, no network), as root of the worker's user namespace with only the capabilities
it needs to make sandboxes: CAP_SYS_ADMIN (namespaces and mounts), CAP_SETUID/CAP_SETGID (the
drop to the rollout's uid), CAP_NET_ADMIN (the new loopback) and CAP_KILL (B's parent-death
signal comes from the zygote, root, to B, the rollout's uid: the kernel checks it as it checks kill(2)). It never runs harness code
and imports nothing but the standard library and this runtime, so every rollout starts from
the same state: none of a rollout's code, files, processes or memory can reach the next.

The worker speaks to it over its stdin, a SOCK_SEQPACKET socket: ``spawn`` requests (a JSON
object plus the rollout's stdin, stdout and stderr pipes as SCM_RIGHTS) and ``kill``; it
answers ``ready`` once, then ``exited`` for each rollout. Each rollout:

- the zygote makes its next child's PID namespace a new one (unshare, then setns back to its
  own right after the fork) and forks B;
- B, PID 1 of the new PID namespace, dies with the zygote (PR_SET_PDEATHSIG), unshares new
  mount, network, IPC and UTS namespaces, makes its mounts private, mounts a new /proc, a
  fresh size-capped /tmp and /dev/shm and a new devpts, brings up its own loopback, applies
  the rollout's rlimits and nice level, switches to the rollout's uid (which clears every
  capability: bwrap set no_new_privs, so none comes back), forks C and reaps orphans until C
  exits; the zygote kills a rollout by killing B, which ends its PID namespace and everything
  in it;
- C takes the pipes as its stdin, stdout and stderr, closes every other descriptor and runs
  ``coevo_runtime``'s ``main`` in its own session.

A rollout is two forks of the zygote's interpreter, not three (an intermediate process that
unshared the namespaces and waited for B cost a fork, its copy-on-write faults and its exit:
about a fifth of a warm sandbox's CPU).

Failures before the harness runs are written to the rollout's stderr as ``bwrap: ...`` (the
channel reports them as the sandbox failing, an infra_error), as bwrap's own are.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import json
import os
import resource
import select
import selectors
import signal
import socket
import struct
import sys
import traceback
from typing import Any

# Imported here, before any fork: each rollout starts with them loaded.
from coevo_runtime.__main__ import main as runtime_main

MAX_REQUEST_BYTES = 64 * 1024

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUTS = 0x04000000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 2, 4, 8
_MS_REC, _MS_PRIVATE = 16384, 1 << 18
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE = 1, 4
_SYS_PIDFD_OPEN = 434  # the same number on every architecture (Linux 5.3)
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_CAPABILITY_VERSION_3 = 0x20080522

_libc = ctypes.CDLL(None, use_errno=True)


class SetupFailed(Exception):
    """A step of making the rollout's sandbox failed: the rollout must not run."""


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise SetupFailed(f"{what}: {os.strerror(errno)}")


def _mount(source: str, target: str, kind: str | None, flags: int, data: str | None) -> None:
    _check(
        _libc.mount(
            source.encode() if source else None,
            target.encode(),
            kind.encode() if kind else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {target}",
    )


def _prctl(option: int, value: int) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0), f"prctl {option}")


# --- the zygote's loop ----------------------------------------------------------------------


class Zygote:
    def __init__(self, control: socket.socket, probe_uid: int) -> None:
        self.control = control
        self.probe_uid = probe_uid
        self.children: dict[int, int] = {}  # B's pid -> the request's id
        # The zygote's own PID namespace, to go back to after each rollout's new one, and a
        # pidfd of the zygote, which each B polls to learn whether the zygote is still alive.
        self.pid_ns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        self.pidfd = _pidfd_open(os.getpid())
        self.wakeup_r, wakeup_w = os.pipe()
        os.set_blocking(wakeup_w, False)
        signal.set_wakeup_fd(wakeup_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)

    def serve(self) -> int:
        probe = self.probe()
        self.send({"op": "ready", "ok": probe is None, "error": probe or ""})
        if probe is not None:
            return 1
        selector = selectors.DefaultSelector()
        selector.register(self.control, selectors.EVENT_READ, "control")
        selector.register(self.wakeup_r, selectors.EVENT_READ, "child")
        while True:
            for key, _ in selector.select():
                if key.data == "child":
                    os.read(self.wakeup_r, 4096)
                    self.reap()
                elif not self.handle_request():
                    # The worker closed the control socket: everything ends with it.
                    for pid in list(self.children):
                        _kill(pid)
                    return 0

    def probe(self) -> str | None:
        """Make one rollout sandbox that runs nothing: None when it worked, else why not."""
        err_r, err_w = os.pipe()
        null = os.open(os.devnull, os.O_RDWR)
        try:
            pid = self.fork_rollout({"uid": self.probe_uid, "probe": True}, [null, null, err_w])
        except (SetupFailed, OSError) as exc:
            os.close(err_r)
            return f"bwrap: coevo's warm sandbox failed: {exc}"
        finally:
            os.close(err_w)
            os.close(null)
        _, status = os.waitpid(pid, 0)
        error = os.read(err_r, 4096).decode(errors="replace").strip()
        os.close(err_r)
        if os.waitstatus_to_exitcode(status) != 0:
            return error or f"the probe sandbox ended with status {status}"
        return None

    def handle_request(self) -> bool:
        try:
            data, fds, _flags, _addr = socket.recv_fds(self.control, MAX_REQUEST_BYTES, 3)
        except InterruptedError:
            return True
        except OSError:
            return False
        if not data:
            _close(fds)
            return False
        request = json.loads(data)
        if request.get("op") == "kill":
            for pid, rollout in self.children.items():
                if rollout == request["id"]:
                    _kill(pid)
        elif request.get("op") == "spawn" and len(fds) == 3:
            try:
                pid = self.fork_rollout(request, fds)
            # Out of processes or memory, or a namespace refused: the worker retries elsewhere.
            except (OSError, SetupFailed) as exc:
                self.send({"op": "exited", "id": request["id"], "status": -1, "error": str(exc)})
            else:
                self.children[pid] = request["id"]
        else:
            self.send({"op": "refused", "id": request.get("id"), "error": "malformed request"})
        _close(fds)
        return True

    def fork_rollout(self, request: dict[str, Any], fds: list[int]) -> int:
        # The next child (and only it) is PID 1 of a new PID namespace: unshare sets the
        # namespace for children, setns puts it back for the zygote.
        _check(_libc.unshare(_CLONE_NEWPID), "unshare")
        try:
            pid = os.fork()
        except BaseException:
            _check(_libc.setns(self.pid_ns, _CLONE_NEWPID), "setns")
            raise
        if pid == 0:
            code = 126
            try:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                self.control.close()
                os.close(self.wakeup_r)
                os.close(self.pid_ns)
                code = _rollout_init(request, fds, self.pidfd)
            except BaseException:
                _write_error(fds[2], f"bwrap: coevo's warm sandbox failed: {_last_error()}")
            os._exit(code)
        if _libc.setns(self.pid_ns, _CLONE_NEWPID) != 0:
            # Every later unshare would fail: end the zygote (and with it this rollout); the
            # worker starts another.
            _kill(pid)
            raise SystemExit(f"coevo zygote: setns: {os.strerror(ctypes.get_errno())}")
        return pid

    def reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            rollout = self.children.pop(pid, None)
            if rollout is not None:
                code = os.waitstatus_to_exitcode(status)
                self.send({"op": "exited", "id": rollout, "status": code})

    def send(self, message: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):  # the worker is gone: the loop sees it next
            self.control.send(json.dumps(message).encode())


def _close(fds: list[int]) -> None:
    for fd in set(fds):
        os.close(fd)


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _last_error() -> str:
    kind, value, _ = sys.exc_info()
    if isinstance(value, SetupFailed):
        return str(value)
    return "".join(traceback.format_exception_only(kind, value)).strip()


def _write_error(fd: int, text: str) -> None:
    with contextlib.suppress(OSError):
        os.write(fd, text.encode(errors="replace")[:4000] + b"\n")


# --- B: PID 1 of the rollout's sandbox --------------------------------------------------------


def _rollout_init(request: dict[str, Any], fds: list[int], zygote: int) -> int:
    """In B: PID 1 of the rollout's PID namespace; ``zygote`` is the zygote's pidfd."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    _exit_if_orphaned(zygote)
    _check(_libc.unshare(_CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWIPC | _CLONE_NEWUTS), "unshare")
    limits = request.get("limits", {})
    _mount("", "/", None, _MS_REC | _MS_PRIVATE, None)
    _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None)
    for path, size in (("/tmp", limits.get("tmp_bytes")), ("/dev/shm", limits.get("shm_bytes"))):
        options = "mode=1777" + (f",size={int(size)}" if size else "")
        _mount("tmpfs", path, "tmpfs", _MS_NOSUID | _MS_NODEV, options)
    if os.path.isdir("/dev/pts"):
        _mount(
            "devpts",
            "/dev/pts",
            "devpts",
            _MS_NOSUID | _MS_NOEXEC,
            "newinstance,ptmxmode=0666,mode=620",
        )
    _loopback_up()
    _apply_limits(limits)
    uid = int(request["uid"])
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    _clear_inheritable_capabilities()
    # A change of uid clears the parent-death signal: set it again, and check the zygote is
    # still there.
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    _exit_if_orphaned(zygote)
    os.close(zygote)
    if request.get("probe"):
        return 0 if _capabilities_gone() else 125
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    pid = os.fork()
    if pid == 0:
        code = 126
        try:
            code = _rollout_harness(request, fds)
        except BaseException:
            _write_error(fds[2], f"bwrap: coevo's warm sandbox failed: {_last_error()}")
        os._exit(code)
    _close(fds)
    # PID 1 adopts every orphan: reap them, and end (taking the namespace) when C ends.
    while True:
        try:
            reaped, status = os.wait()
        except ChildProcessError:
            return 0
        except InterruptedError:
            continue
        if reaped == pid:
            if os.WIFSIGNALED(status):
                return 128 + os.WTERMSIG(status)
            return os.WEXITSTATUS(status)


def _exit_if_orphaned(zygote: int) -> None:
    """The zygote's pidfd is readable once the zygote has exited: B was orphaned before its
    parent-death signal was set, so none will come."""
    ready, _, _ = select.select([zygote], [], [], 0)
    if ready:
        os._exit(137)


def _pidfd_open(pid: int) -> int:
    fd = _libc.syscall(_SYS_PIDFD_OPEN, pid, 0)
    if fd < 0:
        raise SetupFailed(f"pidfd_open: {os.strerror(ctypes.get_errno())}")
    return fd


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", _ioctl(sock, _SIOCGIFFLAGS, request)[:18])[1]
        _ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | _IFF_UP))


def _ioctl(sock: socket.socket, op: int, arg: bytes) -> bytes:
    import fcntl

    return fcntl.ioctl(sock.fileno(), op, arg.ljust(40, b"\0"))


def _apply_limits(limits: dict[str, Any]) -> None:
    pairs = (
        (resource.RLIMIT_CPU, limits.get("cpu_s"), 5),
        (resource.RLIMIT_AS, limits.get("memory_bytes"), 0),
        (resource.RLIMIT_FSIZE, limits.get("file_bytes"), 0),
        (resource.RLIMIT_NOFILE, limits.get("open_files"), 0),
        (resource.RLIMIT_NPROC, limits.get("processes"), 0),
    )
    for which, value, hard_extra in pairs:
        if value is not None:
            resource.setrlimit(which, (int(value), int(value) + hard_extra))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    nice = int(limits.get("nice", 0))
    if nice:
        os.nice(nice)


def _clear_inheritable_capabilities() -> None:
    """The uid change cleared the permitted, effective and ambient sets; the inheritable set
    (the zygote's capabilities) survives it. With no_new_privs nothing could use it, but a
    sandbox holds none at all."""
    header = (ctypes.c_uint32 * 2)(_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    _check(_libc.capset(header, data), "capset")


def _capabilities_gone() -> bool:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(("CapEff:", "CapPrm:", "CapInh:", "CapAmb:")) and int(
                line.split()[1], 16
            ):
                return False
    return True


# --- C: the harness -------------------------------------------------------------------------


def _rollout_harness(request: dict[str, Any], fds: list[int]) -> int:
    os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    os.closerange(3, _max_fd())
    # As after an exec: the process may read its own /proc entries (a uid change cleared it).
    _prctl(_PR_SET_DUMPABLE, 1)
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(number, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as Python sets it at start-up
    os.chdir(request.get("cwd", "/harness"))
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "rb")))
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(
        io.FileIO(1, "wb"), line_buffering=True, write_through=True
    )
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(
        io.FileIO(2, "wb"), errors="backslashreplace", line_buffering=True, write_through=True
    )
    sys.argv = [runtime_main.__code__.co_filename]
    try:
        code = runtime_main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    return code


def _max_fd() -> int:
    """Past every descriptor the zygote could hold (its limit is the worker's, taken before B
    lowered it): os.closerange uses close_range(2), one call whatever the bound."""
    return 1 << 20


def main() -> int:
    control = socket.socket(fileno=os.dup(0))
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.close(null)
    return Zygote(control, probe_uid=int(sys.argv[1])).serve()


if __name__ == "__main__":
    sys.exit(main())
