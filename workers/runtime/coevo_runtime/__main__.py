"""Entry point inside the sandbox: ``python -m coevo_runtime``.

Waits for the worker's ``start`` message, imports the harness entrypoint from the current
directory, calls ``run(task, ctx)`` and sends back the answer (or the error).
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback

from coevo_runtime import PROTOCOL_VERSION, Channel, Context


def main() -> int:
    channel = Channel(sys.stdin.buffer, sys.stdout.buffer)
    start = channel.receive()
    if start.get("type") != "start":
        channel.send({"type": "error", "error": f"expected a start message, got {start!r}"})
        return 2
    channel.send({"type": "ready", "protocol": PROTOCOL_VERSION})
    module_name, _, function_name = start["entrypoint"].partition(":")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
        run = getattr(module, function_name or "run")
    except Exception as exc:  # the harness's own import-time error
        channel.send(
            {
                "type": "error",
                "error": f"could not load entrypoint {start['entrypoint']!r}: "
                f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(),
            }
        )
        return 1
    try:
        answer = run(start["task"], Context(channel, start.get("knobs", {})))
    except Exception as exc:
        channel.send(
            {
                "type": "error",
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(),
            }
        )
        return 1
    try:
        channel.send({"type": "answer", "answer": answer})
    except (TypeError, ValueError) as exc:
        channel.send({"type": "error", "error": f"run() returned a value that is not JSON: {exc}"})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
