"""``manage.py prune_traces [--dry-run] [--older-than-days N]``: trace retention by hand."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from coevo.evaluations.retention import traces_prune


class Command(BaseCommand):
    help = (
        "Delete the trace steps of final evaluations older than the retention "
        "(COEVO_TRACE_RETENTION_DAYS), keeping scores, outcomes and summaries. Evaluations of "
        "candidates on a channel, or referenced by a promotion or an export, are never pruned."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--dry-run", action="store_true", help="report what would be freed; delete nothing"
        )
        parser.add_argument(
            "--older-than-days",
            type=int,
            default=None,
            help="override COEVO_TRACE_RETENTION_DAYS for this run (at least 1)",
        )
        parser.add_argument("--batch-size", type=int, default=2000, help="steps per delete")

    def handle(self, *args: Any, **options: Any) -> None:
        days = options["older_than_days"]
        if days is not None and days < 1:
            raise CommandError("--older-than-days must be at least 1.")
        if options["batch_size"] < 1:
            raise CommandError("--batch-size must be at least 1.")
        report = traces_prune(
            older_than_days=days, dry_run=options["dry_run"], batch_size=options["batch_size"]
        )
        self.stdout.write(report.describe())
