"""Entry point inside the sandbox: ``python -m coevo_runtime``.

Waits for the worker's ``start`` message, imports the harness entrypoint from the current
directory, calls ``run(task, ctx)`` and sends back the answer (or the error, with structured
traceback frames so that a trace viewer can link to the harness file and line).
"""

from __future__ import annotations

import importlib
import os
import shlex
import sys
import threading
import traceback
from typing import Any

from coevo_runtime import Channel, Context

MAX_FRAMES = 50


def main() -> int:
    channel = Channel(sys.stdin.buffer, sys.stdout.buffer)
    start = channel.start()
    if start is None:
        return 2
    module_name, _, function_name = start["entrypoint"].partition(":")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
        run = getattr(module, function_name or "run")
    except Exception as exc:  # the harness's own import-time error
        _send_error(
            channel,
            exc,
            f"could not load entrypoint {start['entrypoint']!r}: {type(exc).__name__}: {exc}",
        )
        return 1
    ctx = Context(
        channel,
        start.get("knobs", {}),
        limits=start.get("limits"),
        multi_step=bool(start.get("multi_step")),
        helpers=start.get("helpers", ()),
    )
    if ctx.workspace:
        _log_commands(channel)
    try:
        answer = run(start["task"], ctx)
    except Exception as exc:
        _send_error(channel, exc, f"{type(exc).__name__}: {exc}")
        return 1
    try:
        channel.send({"type": "answer", "answer": answer})
    except (TypeError, ValueError) as exc:
        channel.send({"type": "error", "error": f"run() returned a value that is not JSON: {exc}"})
        return 1
    return 0


def _log_commands(channel: Channel) -> None:
    """On a workspace task, each command the harness starts itself (subprocess, os.system,
    os.exec*, os.posix_spawn) is logged to the trace as ``$ command``: what this process can
    see of them (a command's own children, and its output, stay unseen; ``ctx.shell`` records
    both). Python's audit hooks see every such call and cannot be removed."""
    events = {
        "subprocess.Popen": 1,
        "os.system": 0,
        "os.exec": 1,
        "os.posix_spawn": 1,
        "os.spawn": 2,
    }
    busy = threading.local()

    def hook(event: str, args: tuple) -> None:
        index = events.get(event)
        if index is None or getattr(busy, "on", False) or len(args) <= index:
            return
        busy.on = True
        try:
            command = args[index]
            if isinstance(command, str | bytes):
                text = os.fsdecode(command)
            else:
                text = shlex.join(os.fsdecode(part) for part in command)
            channel.send({"type": "log", "message": f"$ {text}"[:2000], "fields": {"via": event}})
        except Exception:  # an odd argument must never break the harness's own call
            pass
        finally:
            busy.on = False

    sys.addaudithook(hook)


def _send_error(channel: Channel, exc: BaseException, error: str) -> None:
    channel.send(
        {
            "type": "error",
            "error": error,
            "traceback": traceback.format_exc(),
            "frames": traceback_frames(exc, root=os.getcwd()),
        }
    )


def traceback_frames(exc: BaseException, *, root: str) -> list[dict[str, Any]]:
    """The frames of ``exc``, innermost last; ``file`` is relative to ``root`` when inside it."""
    root = os.path.abspath(root)
    frames = [
        _frame(summary.filename, summary.lineno, summary.name, summary.line, root)
        for summary in traceback.extract_tb(exc.__traceback__)
    ]
    # A syntax error's location is not a frame of the traceback: it is on the exception.
    if isinstance(exc, SyntaxError) and exc.filename:
        frames.append(_frame(exc.filename, exc.lineno, "<module>", exc.text, root))
    return frames[-MAX_FRAMES:]


def _frame(
    filename: str, line: int | None, function: str, code: str | None, root: str
) -> dict[str, Any]:
    path = os.path.abspath(filename) if not filename.startswith("<") else filename
    in_harness = path.startswith(root + os.sep)
    return {
        "file": os.path.relpath(path, root) if in_harness else filename,
        "line": line,
        "function": function,
        "code": (code or "").strip()[:500],
        "in_harness": in_harness,
    }


if __name__ == "__main__":
    sys.exit(main())
