"""``python -m benchmarks.scale --project SLUG --scale {small,pages,medium,full} [--seed N]
[--replace]``: a busy team's year of data in PostgreSQL, for measuring pages and the API at
scale.

A Django command class, run by ``__main__`` rather than found by ``manage.py`` (it is not in
an installed app): Django parses its options and turns a refusal (``CommandError``) into a
message and exit status 1, as for any management command.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from benchmarks.scale.fill import scale_fill
from benchmarks.scale.plan import SCALES
from coevo.errors import CoevoError

PROG = "python -m benchmarks.scale"


class Command(BaseCommand):
    help = (
        "Fill PostgreSQL with one project at scale (full: 10,000 candidates, campaigns of 2,000 "
        "proposals, ~1,000,000 rollouts, ~10,000,000 trace steps, 1,000,000 audit events; "
        "medium ~1/20; small ~1/1000), deterministic from --seed, through COPY in chunks of "
        "one transaction each. See docs/operations.md, 'Scale data'."
    )

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        parser.prog = PROG
        return parser

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--project", required=True, help="slug of the project to create")
        parser.add_argument("--scale", required=True, choices=sorted(SCALES))
        parser.add_argument("--seed", type=int, default=0, help="same seed, same data")
        parser.add_argument(
            "--replace",
            action="store_true",
            help="delete the project first if it exists (its audit events stay, as always)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            report = scale_fill(
                slug=options["project"],
                scale=options["scale"],
                seed=options["seed"],
                replace=options["replace"],
                out=self.stdout,
            )
        except CoevoError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"Filled project {options['project']!r} ({options['scale']}):")
        self.stdout.write(report.describe())
