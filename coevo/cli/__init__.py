"""The ``coevo`` command.

Each subcommand lives in its own module with a ``register(subparsers)`` function that adds its
parser and sets ``handler`` (a function of the parsed arguments returning the exit code):
``demo`` runs the embedded default on this machine; ``doctor`` checks an installation; the
remote commands (``submit``, ``evaluate``, ``gate``) talk to a coevo server's REST API.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Imported lazily by name, so that `coevo submit` on a CI runner never imports Django.
_COMMAND_MODULES = ("coevo.cli.demo", "coevo.cli.doctor", "coevo.cli.remote")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="coevo", description="Harness-policy co-evolution.")
    commands = parser.add_subparsers(dest="command", required=True)
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.handler(parser, args))


if __name__ == "__main__":
    sys.exit(main())
