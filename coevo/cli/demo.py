"""``coevo demo``: the whole system on one machine, on the embedded default."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(commands: Any) -> None:
    demo = commands.add_parser(
        "demo",
        help="run the whole system on the embedded default and evaluate the seed harness",
    )
    demo.add_argument("--tasks", type=int, default=20, help="search-split tasks to evaluate")
    demo.add_argument("--once", action="store_true", help="exit after the summary")
    demo.add_argument("--host", default="127.0.0.1")
    demo.add_argument("--port", type=int, default=8000, help="web server port")
    demo.add_argument("--policy-port", type=int, default=8089, help="llama.cpp server port")
    demo.set_defaults(handler=run)


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from coevo.demo import DemoOptions, run_demo
    from coevo.errors import CoevoError

    if args.tasks < 1:
        parser.error("--tasks must be at least 1")
    try:
        return run_demo(
            DemoOptions(
                tasks=args.tasks,
                once=args.once,
                host=args.host,
                port=args.port,
                policy_port=args.policy_port,
            )
        )
    except CoevoError as exc:
        print(f"coevo: {exc}", file=sys.stderr)
        return 1
