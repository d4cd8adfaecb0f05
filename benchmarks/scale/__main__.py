"""``python -m benchmarks.scale …`` from the repository root: benchmarks/scale/command.py."""

from __future__ import annotations

import os
import sys

import django


def main(argv: list[str]) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "coevo.settings")
    django.setup()
    # The fill imports coevo's models: only once Django is set up.
    from benchmarks.scale.command import PROG, Command

    Command().run_from_argv([PROG, "scale", *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
