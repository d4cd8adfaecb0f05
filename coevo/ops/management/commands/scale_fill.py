"""``manage.py scale_fill --project SLUG --scale {small,pages,medium,full} [--seed N] [--replace]``:
a busy team's year of data in PostgreSQL, for measuring pages and the API at scale."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from coevo.errors import CoevoError
from coevo.ops.scale.fill import scale_fill
from coevo.ops.scale.plan import SCALES


class Command(BaseCommand):
    help = (
        "Fill PostgreSQL with one project at scale (full: 10,000 candidates, campaigns of 2,000 "
        "proposals, ~1,000,000 rollouts, ~10,000,000 trace steps, 1,000,000 audit events; "
        "medium ~1/20; small ~1/1000), deterministic from --seed, through COPY in chunks of "
        "one transaction each. See docs/operations.md, 'Scale data'."
    )

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
