"""Entry point inside the sandbox for a program harness: ``python -m coevo_runtime.program``.

Standard library only. It waits for the worker's ``start`` message, then:

- writes the task and the knobs as JSON files in a private directory of the sandbox's /tmp
  (``COEVO_TASK_FILE``, ``COEVO_KNOBS_FILE``; each knob also as ``COEVO_KNOB_<NAME>``);
- forwards 127.0.0.1 of the sandbox's own network namespace to the worker's model boundary (a
  Unix socket bound into the sandbox), and points ``OPENAI_BASE_URL`` / ``OPENAI_API_BASE`` and
  ``OPENAI_API_KEY`` at it (``ANTHROPIC_BASE_URL`` and ``ANTHROPIC_API_KEY`` for Anthropic's
  SDKs, which add ``/v1`` themselves);
- runs the harness's command in the harness directory, and when it exits sends the worker its
  exit code, the answer it wrote to ``COEVO_ANSWER_FILE`` and the tail of its stdout.

The worker decides what all of it means (answer, harness error, limit); this side only relays.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from coevo_runtime import Channel

MAX_ANSWER_BYTES = 1024 * 1024
STDOUT_TAIL_BYTES = 16 * 1024
# Read from stdout once the program has exited, at most (a daemon left behind may flood it).
MAX_STDOUT_AFTER_EXIT = 1024 * 1024


def main() -> int:
    channel = Channel(sys.stdin.buffer, sys.stdout.buffer)
    start = channel.start()
    if start is None:
        return 2
    workdir = tempfile.mkdtemp(prefix="coevo-")
    task_file = os.path.join(workdir, "task.json")
    knobs_file = os.path.join(workdir, "knobs.json")
    answer_file = os.path.join(workdir, "answer.json")
    with open(task_file, "w") as handle:
        json.dump(start.get("task"), handle)
    knobs = start.get("knobs") or {}
    with open(knobs_file, "w") as handle:
        json.dump(knobs, handle)
    port = _forward(start["socket"])
    base = f"http://127.0.0.1:{port}"
    env = dict(os.environ)
    # The runtime's own directory is not the program's; the harness's declared dependencies
    # (when it has some) stay on its PYTHONPATH.
    runtime_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = [p for p in env.pop("PYTHONPATH", "").split(os.pathsep) if p and p != runtime_dir]
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    # ``python`` is the worker's own interpreter (this one), as for run(task, ctx) harnesses:
    # the same version, and the packages of the worker's environment importable.
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.update(start.get("env") or {})
    env.update(
        {
            "OPENAI_BASE_URL": f"{base}/v1",
            "OPENAI_API_BASE": f"{base}/v1",
            "OPENAI_API_KEY": start["token"],
            "ANTHROPIC_BASE_URL": base,
            "ANTHROPIC_API_KEY": start["token"],
            "COEVO_API_URL": f"{base}/v1",
            # The suite's environment (multi-step suites) and helpers, at the same boundary.
            "COEVO_ENV_URL": f"{base}/coevo/v1/env",
            "COEVO_HELPERS_URL": f"{base}/coevo/v1/helpers",
            "COEVO_MULTI_STEP": "1" if start.get("multi_step") else "0",
            "COEVO_HELPERS": ",".join(start.get("helpers") or []),
            "COEVO_TASK_FILE": task_file,
            "COEVO_KNOBS_FILE": knobs_file,
            "COEVO_ANSWER_FILE": answer_file,
            "COEVO_SEED": str(start.get("seed", 0)),
        }
    )
    for name, value in knobs.items():
        env[_knob_variable(name)] = value if isinstance(value, str) else json.dumps(value)
    try:
        proc = subprocess.Popen(
            start["command"],
            cwd=os.getcwd(),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
        )
    except OSError as exc:
        channel.send({"type": "program_ended", "started": False, "error": str(exc)})
        return 0
    tail = bytearray()
    assert proc.stdout is not None
    fd, after_exit = proc.stdout.fileno(), 0
    while after_exit <= MAX_STDOUT_AFTER_EXIT:
        exited = proc.poll() is not None
        # The program's end is its own exit, not the end of its stdout: what it left running
        # (a daemon) may hold stdout open for ever. Once it has exited, everything it wrote
        # is in the pipe: that is read, and the worker is told at once (it then kills the
        # sandbox and all that is left in it).
        if not select.select([fd], [], [], 0 if exited else 0.02)[0]:
            if exited:
                break
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        tail.extend(chunk)
        del tail[:-STDOUT_TAIL_BYTES]
        after_exit += len(chunk) if exited else 0
    code = proc.wait()
    channel.send(
        {
            "type": "program_ended",
            "started": True,
            "exit_code": code,
            "answer": _read_answer(answer_file),
            "stdout_tail": tail.decode(errors="replace"),
        }
    )
    return 0


def _read_answer(path: str) -> dict[str, Any]:
    """What the program left in the answer file, for the worker to judge."""
    try:
        size = os.path.getsize(path)
    except OSError:
        return {"written": False}
    if size > MAX_ANSWER_BYTES:
        return {"written": True, "too_large": True, "size": size}
    with open(path, "rb") as handle:
        return {"written": True, "text": handle.read().decode(errors="replace")}


def _knob_variable(name: str) -> str:
    return "COEVO_KNOB_" + re.sub(r"[^A-Za-z0-9]", "_", name).upper()


def _forward(socket_path: str) -> int:
    """Listen on 127.0.0.1 (a free port) and pipe each connection to the Unix socket."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(64)

    def accept() -> None:
        # The program may use up the sandbox's descriptors or threads (holding connections
        # open, say): connections are then refused or wait, and the forwarder lives on.
        while True:
            try:
                client, _ = server.accept()
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    time.sleep(0.05)  # it waits in the backlog until descriptors are free
                    continue
                return
            try:
                threading.Thread(target=_connect, args=(client, socket_path), daemon=True).start()
            except RuntimeError:  # no thread to be had
                client.close()

    threading.Thread(target=accept, daemon=True).start()
    return server.getsockname()[1]


# What the forwarder holds for a client that does not read its replies. Left to the kernel, a
# loopback socket's send buffer grows to net.ipv4.tcp_wmem's maximum (4 MiB or more): a program
# that pipelines requests and never reads would keep the worker writing replies for seconds
# before its write stalls and its IO timeout ends the connection (workers/boundary.py).
FORWARD_SNDBUF = 256 * 1024


def _connect(client: socket.socket, socket_path: str) -> None:
    with contextlib.suppress(OSError):
        client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, FORWARD_SNDBUF)
    try:
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError:  # no descriptor to be had
        client.close()
        return
    try:
        upstream.connect(socket_path)
        threading.Thread(target=_pipe, args=(upstream, client), daemon=True).start()
    except (OSError, RuntimeError):  # (RuntimeError: no thread to be had)
        client.close()
        upstream.close()
        return
    _pipe(client, upstream)


def _pipe(source: socket.socket, target: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            target.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            target.shutdown(socket.SHUT_WR)
        with contextlib.suppress(OSError):
            source.shutdown(socket.SHUT_RD)


if __name__ == "__main__":
    sys.exit(main())
