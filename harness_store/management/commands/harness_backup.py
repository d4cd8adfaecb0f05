"""``manage.py harness_backup [--to DIR]``: a git bundle of every project's repository."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from coevo.errors import CoevoError
from harness_store.maintenance import store_backup


class Command(BaseCommand):
    help = (
        "Back up the harness store: one verified git bundle per project (all refs: candidates, "
        "tags, branches) and a manifest.json with their SHA-256. Restore with harness_restore."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--to",
            default="",
            help="directory to write (default: a new timestamped folder in COEVO_BACKUP_DIR)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["to"]:
            destination = Path(options["to"])
        else:
            stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
            destination = Path(settings.COEVO_BACKUP_DIR) / f"harness-store-{stamp}"
        try:
            manifest = store_backup(destination=destination)
        except CoevoError as exc:
            raise CommandError(str(exc)) from exc
        for entry in manifest.projects:
            what = f"{entry.refs} refs, {entry.size_bytes} bytes" if entry.bundle else "empty"
            self.stdout.write(f"{entry.project_slug}: {what}")
        self.stdout.write(f"Backed up {len(manifest.projects)} projects into {destination}")
